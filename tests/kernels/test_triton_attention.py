"""``dllm.kernels.triton.attention.flash_attention`` against ``reference.attention_reference`` over a grid of shapes,
dtypes and mask patterns; the mask adapter of the ``triton`` backend; the backend's registration."""

from __future__ import annotations

import subprocess
import sys
from dataclasses import dataclass

import pytest
import torch

from dllm.kernels.attention import reference_attention, resolve_backend
from dllm.kernels.reference import attention_reference
from dllm.kernels.triton.attention import flash_attention, triton_attention
from dllm.kernels.triton.padding import UnsupportedMaskError, mask_to_thresholds
from dllm.models.inputs import padding_attn_mask, square_padding_mask

from .conftest import DEVICE, INTERPRETED
from .helpers import assert_close

TOL = {"fp32": 1e-5, "fp16": 2e-3, "bf16": 1.6e-2}  # relative RMS error of the output
DTYPES = {"fp32": torch.float32, "fp16": torch.float16, "bf16": torch.bfloat16}


@dataclass(frozen=True)
class Case:
    b: int
    h: int
    hkv: int
    tq: int
    tk: int
    d: int
    dtype: str
    pattern: str  # "none" | "pad" | "padq" | "end" | "pad+end" | "padq+end" | "strided" | "empty"
    splits: int = 1  # key ranges run by separate programs, merged by lse (flash-decoding)

    @property
    def id(self) -> str:
        split = f"-S{self.splits}" if self.splits > 1 else ""
        return f"B{self.b}-H{self.h}-Hkv{self.hkv}-Tq{self.tq}-Tk{self.tk}-D{self.d}-{self.dtype}-{self.pattern}{split}"


GRID = [
    Case(1, 2, 2, 16, 64, 32, "fp32", "none"),
    Case(2, 4, 2, 16, 80, 32, "fp32", "pad"),
    Case(2, 4, 1, 32, 96, 64, "fp32", "padq"),
    Case(2, 4, 2, 16, 80, 32, "fp32", "end"),
    Case(1, 4, 4, 7, 50, 40, "fp32", "pad+end"),  # ragged Tq, Tk; head dim not a power of two
    Case(2, 2, 1, 48, 256, 32, "fp32", "pad"),  # several query and key tiles
    Case(2, 4, 2, 16, 80, 32, "fp32", "strided"),  # q transposed view, k/v slices of a longer buffer
    Case(2, 2, 2, 16, 48, 16, "fp32", "empty"),  # row 1 may attend to nothing
    Case(2, 4, 2, 16, 80, 32, "fp16", "pad"),
    Case(1, 8, 2, 32, 128, 64, "fp16", "padq+end"),
    Case(2, 2, 1, 16, 256, 32, "fp32", "pad+end", splits=3),  # row 1's key_end leaves a split empty
    Case(2, 2, 2, 16, 160, 16, "fp32", "empty", splits=2),
    Case(1, 4, 2, 16, 192, 32, "fp16", "padq", splits=3),
    Case(2, 8, 2, 1, 70, 96, "fp32", "pad"),  # one query row; GQA 4:1; head dim 96; keys not a tile multiple
    Case(1, 4, 1, 1, 33, 128, "fp16", "pad+end"),
    Case(1, 4, 2, 16, 80, 64, "bf16", "pad"),  # GPU only (the interpreter cannot do bf16)
    Case(1, 4, 2, 16, 256, 64, "bf16", "pad+end", splits=4),
]


def _inputs(case: Case, seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    dt = DTYPES[case.dtype]
    q = torch.randn(case.b, case.h, case.tq, case.d, generator=g)
    k = torch.randn(case.b, case.hkv, case.tk, case.d, generator=g)
    v = torch.randn(case.b, case.hkv, case.tk, case.d, generator=g)
    if case.pattern == "strided":
        q = q.transpose(1, 2).contiguous().transpose(1, 2)  # [B, H, Tq, D] view of a [B, Tq, H, D] tensor
        k = torch.cat([k, torch.randn(case.b, case.hkv, 24, case.d, generator=g)], dim=2)[:, :, :case.tk]
        v = torch.cat([v, torch.randn(case.b, case.hkv, 24, case.d, generator=g)], dim=2)[:, :, :case.tk]
    key_padding = query_all = key_end = None
    if "pad" in case.pattern:
        key_padding = torch.ones(case.b, case.tk, dtype=torch.bool)
        key_padding[0, : case.tk // 8] = False  # left padding
        key_padding[-1, torch.randperm(case.tk, generator=g)[: case.tk // 3]] = False  # scattered holes
    if "padq" in case.pattern:
        query_all = torch.zeros(case.b, case.tq, dtype=torch.bool)
        query_all[0, :3] = True
    if "end" in case.pattern:
        key_end = torch.tensor([case.tk - 5, case.tk // 2 + 3][: case.b])
    if case.pattern == "empty":
        key_padding = torch.ones(case.b, case.tk, dtype=torch.bool)
        key_padding[1] = False
    move = lambda t: None if t is None else t.to(DEVICE)
    q, k, v = (t.to(dt).to(DEVICE) for t in (q, k, v))
    return q, k, v, move(key_padding), move(query_all), move(key_end)


@pytest.mark.parametrize("case", GRID, ids=[c.id for c in GRID])
def test_flash_attention_matches_reference(case: Case):
    if case.dtype == "bf16" and INTERPRETED:
        pytest.skip("bf16 needs a GPU (the Triton interpreter treats bf16 as raw bits)")
    q, k, v, key_padding, query_all, key_end = _inputs(case)
    kw = dict(num_splits=case.splits, block_n=32 if case.splits > 1 else None)
    out, lse = flash_attention(q, k, v, key_padding, query_all, key_end, return_lse=True, **kw)
    ref, ref_lse = attention_reference(q, k, v, key_padding, query_all, key_end)
    assert out.dtype == q.dtype and out.shape == q.shape
    assert_close(f"{case.id}/out", ref, out, TOL[case.dtype])
    assert_close(f"{case.id}/lse", ref_lse, lse, 1e-5)
    assert torch.equal(flash_attention(q, k, v, key_padding, query_all, key_end, **kw), out)  # lse off: same out
    if case.pattern == "empty":
        assert torch.all(out[1] == 0) and torch.all(lse[1] == float("-inf"))


def test_block_sizes_do_not_change_the_result():
    case = Case(1, 2, 1, 40, 100, 32, "fp32", "pad")
    q, k, v, key_padding, _, _ = _inputs(case, seed=1)
    a = flash_attention(q, k, v, key_padding, block_m=16, block_n=16)
    b = flash_attention(q, k, v, key_padding, block_m=64, block_n=32)
    assert_close("blocks", a, b, 1e-6)


def test_input_checks():
    q = torch.zeros(1, 3, 4, 16, device=DEVICE)
    k = torch.zeros(1, 2, 8, 16, device=DEVICE)
    with pytest.raises(ValueError, match=r"query heads \(3\) must be a multiple of key/value heads \(2\)"):
        flash_attention(q, k, k)
    with pytest.raises(TypeError, match="share one dtype"):
        flash_attention(q[:, :2], k, k.half())
    with pytest.raises(ValueError, match=r"key_padding must be bool \[B=1, Tk=8\]"):
        flash_attention(q[:, :2], k, k, torch.ones(1, 7, dtype=torch.bool, device=DEVICE))


# ---- the backend adapter: model masks -> key padding ------------------------------------------------


def _padding_mask(b: int, t: int) -> torch.Tensor:
    real = torch.ones(b, t, dtype=torch.bool)
    real[0, :5] = False
    return real


def _allowed(count: torch.Tensor, threshold: torch.Tensor) -> torch.Tensor:
    """The kernel's rule: (key_count [B, Tk], query_threshold [B, Tq]) -> bool [B, Tq, Tk]."""
    assert count.dtype == threshold.dtype == torch.int32
    return count[:, None, :] >= threshold[:, :, None]


def test_mask_adapter_recovers_padding_mask():
    real = _padding_mask(2, 24)
    full = square_padding_mask(real)  # [B, 1, T, T]: keys | pad queries
    assert torch.equal(_allowed(*mask_to_thresholds(full, 2, 24, 24)), full[:, 0])
    assert mask_to_thresholds(full, 2, 24, 24) is mask_to_thresholds(full, 2, 24, 24)  # memoised
    count, threshold = mask_to_thresholds(padding_attn_mask(real), 2, 24, 24)  # the models' mask: [B, 1, 1, T]
    assert torch.equal(count, real.int()) and torch.equal(_allowed(count, threshold), real[:, None].expand(2, 24, 24))
    cached = real[:, None, None, :].expand(2, 1, 8, 24) | torch.zeros(2, 1, 8, 1, dtype=torch.bool)
    count, threshold = mask_to_thresholds(cached, 2, 8, 24)  # CacheView.attn_mask: queries right of the prompt
    assert torch.equal(_allowed(count, threshold), cached[:, 0])


@pytest.mark.parametrize("bad, match", [
    (torch.ones(2, 4, 24, 24, dtype=torch.bool), r"masks \[B, 1, 1, Tk\]"),  # per head
    (torch.ones(2, 1, 24, 24).tril().bool().triu(-3), "rows' allowed keys are nested"),  # sliding window
    (torch.zeros(2, 1, 1, 24), "boolean masks only"),  # additive float mask
])
def test_mask_adapter_refuses_other_masks(bad, match):
    with pytest.raises(UnsupportedMaskError, match=match):
        mask_to_thresholds(bad, 2, 24, 24)


@pytest.mark.parametrize("hkv", [4, 2])
def test_backend_function_matches_reference_backend(hkv):
    g = torch.Generator().manual_seed(3)
    q = torch.randn(2, 4, 24, 16, generator=g).to(DEVICE)
    k = torch.randn(2, hkv, 24, 16, generator=g).to(DEVICE)
    v = torch.randn(2, hkv, 24, 16, generator=g).to(DEVICE)
    mask = padding_attn_mask(_padding_mask(2, 24)).to(DEVICE)
    out, probs = triton_attention(q, k, v, mask)
    assert probs is None
    assert_close(f"backend-Hkv{hkv}", reference_attention(q, k, v, mask)[0], out, 1e-5)
    with pytest.raises(ValueError, match="cannot return attention probabilities"):
        triton_attention(q, k, v, mask, return_probs=True)


def test_backend_registration():
    assert resolve_backend("triton").backend.name == "triton"
    res = resolve_backend("auto", need_probs=True)
    assert res.backend.name == "reference"
    assert "triton: cannot return attention probabilities" in res.refused
    # auto measures sdpa against triton where both can run (a GPU); on CPU it stays sdpa
    assert resolve_backend("auto").backend.name == ("auto" if torch.cuda.is_available() and not INTERPRETED else "sdpa")
    with pytest.raises(ValueError, match="triton.*cannot return attention probabilities"):
        resolve_backend("triton", need_probs=True)


@pytest.mark.slow  # seconds: the default run leaves it to -m slow (CI runs both)
@pytest.mark.skipif(not INTERPRETED, reason="checks the CPU refusal")
def test_refusal_without_interpreter_on_cpu():
    code = ("import os; os.environ.pop('TRITON_INTERPRET', None)\n"
            "from dllm.kernels.attention import resolve_backend\n"
            "print(resolve_backend('auto', need_probs=True).refused)\n"
            "try:\n    resolve_backend('triton')\nexcept ValueError as e:\n    print('RAISED', e)\n")
    env = {k: v for k, v in __import__("os").environ.items() if k != "TRITON_INTERPRET"}
    env["CUDA_VISIBLE_DEVICES"] = ""
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=120)
    assert out.returncode == 0, out.stderr
    assert "triton: no CUDA device, and TRITON_INTERPRET=1 is not set" in out.stdout
    assert "RAISED attention backend 'triton' cannot serve this request: triton: no CUDA device" in out.stdout


def test_an_empty_batch_gives_an_empty_output():
    q = torch.zeros(0, 2, 4, 16, device=DEVICE)
    k = torch.zeros(0, 1, 8, 16, device=DEVICE)
    out, lse = flash_attention(q, k, k, return_lse=True)
    assert out.shape == (0, 2, 4, 16) and lse.shape == (0, 2, 4)
    assert triton_attention(q, k, k, torch.ones(0, 1, 1, 8, dtype=torch.bool, device=DEVICE))[0].shape == (0, 2, 4, 16)


def test_masks_that_are_not_bool_are_refused():
    """A float mask cast to uint8 would truncate 0.5 to 0 and hide a key the caller meant to keep."""
    q = torch.randn(2, 2, 4, 16, device=DEVICE)
    k = torch.randn(2, 1, 8, 16, device=DEVICE)
    with pytest.raises(ValueError, match=r"key_padding must be bool \[B=2, Tk=8\] on .*got torch.float32"):
        flash_attention(q, k, k, torch.full((2, 8), 0.5, device=DEVICE))
    with pytest.raises(ValueError, match=r"query_attends_all must be bool \[B=2, Tq=4\] on .*got torch.int64"):
        flash_attention(q, k, k, torch.ones(2, 8, dtype=torch.bool, device=DEVICE),
                        torch.ones(2, 4, dtype=torch.long, device=DEVICE))


def test_a_row_that_may_attend_to_nothing_is_zero_in_every_backend():
    """reference_attention gave NaN there (softmax over -inf), sdpa and triton 0: the backends disagreed."""
    g = torch.Generator().manual_seed(4)
    q, k, v = (torch.randn(2, 2, 3, 16, generator=g).to(DEVICE) for _ in range(3))
    mask = torch.ones(2, 1, 1, 3, dtype=torch.bool, device=DEVICE)
    mask[1] = False
    ref, probs = reference_attention(q, k, v, mask, return_probs=True)
    assert not ref.isnan().any() and not probs.isnan().any()
    assert torch.equal(ref[1], torch.zeros_like(ref[1])) and torch.equal(probs[1], torch.zeros_like(probs[1]))
    assert_close("masked-row", ref, triton_attention(q, k, v, mask)[0], 1e-5)
    sdpa = torch.nn.functional.scaled_dot_product_attention(q.cpu(), k.cpu(), v.cpu(), attn_mask=mask.cpu())
    if not sdpa.isnan().any():  # torch >= 2.5 on CPU: 0 for such rows
        assert_close("masked-row-sdpa", sdpa, ref.cpu(), 1e-5)


def test_a_broadcast_mask_reused_at_another_batch_size():
    """The adapter remembers its last conversion per mask object; a [1, 1, 1, Tk] mask serves any batch."""
    mask = torch.ones(1, 1, 1, 12, dtype=torch.bool, device=DEVICE)
    mask[..., :3] = False
    g = torch.Generator().manual_seed(6)
    for b in (2, 3):
        q = torch.randn(b, 2, 4, 16, generator=g).to(DEVICE)
        k = torch.randn(b, 2, 12, 16, generator=g).to(DEVICE)
        assert_close(f"broadcast-B{b}", reference_attention(q, k, k, mask)[0], triton_attention(q, k, k, mask)[0], 1e-5)
