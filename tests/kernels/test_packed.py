"""``sdpa``'s padded-batch path (``dllm.kernels.packed``) against the plain masked call (``sdpa_plain``)."""

from __future__ import annotations

import pytest
import torch

import dllm
from dllm import tasks as T
from dllm.kernels import packed
from dllm.kernels.attention import backends, sdpa_attention, sdpa_plain_attention
from dllm.models.inputs import padding_attn_mask


def _batch(pads, tk=300, h=4, hkv=2, hd=16, tq=None, seed=0):
    g = torch.Generator().manual_seed(seed)
    tq = tk if tq is None else tq
    q = torch.randn(len(pads), h, tq, hd, generator=g)
    k = torch.randn(len(pads), hkv, tk, hd, generator=g)
    v = torch.randn(len(pads), hkv, tk, hd, generator=g)
    real = torch.arange(tk)[None, :] >= torch.tensor(pads)[:, None]  # [B, Tk] left padding
    return q, k, v, padding_attn_mask(real)


@pytest.mark.parametrize("tq", [300, 220], ids=["full", "cached-queries"])
def test_packed_equals_the_masked_call(tq):
    q, k, v, mask = _batch([0, 120, 120, 37, 250], tq=tq)
    groups = packed.padding_groups(mask)
    assert [(s0, e0, rows.tolist()) for s0, e0, rows in groups] == [
        (0, 300, [0]), (37, 300, [3]), (120, 300, [1, 2]), (250, 300, [4])]
    fast, _ = sdpa_attention(q, k, v, mask)
    ref, _ = sdpa_plain_attention(q, k, v, mask)
    torch.testing.assert_close(fast, ref, rtol=1e-5, atol=1e-5)


def test_rows_padded_alike_take_one_call():
    q, k, v, mask = _batch([64, 64, 64])
    groups = packed.padding_groups(mask)
    assert [(s0, e0, rows.tolist()) for s0, e0, rows in groups] == [(64, 300, [0, 1, 2])]
    torch.testing.assert_close(sdpa_attention(q, k, v, mask)[0], sdpa_plain_attention(q, k, v, mask)[0],
                               rtol=1e-5, atol=1e-5)


def test_runs_of_real_keys_anywhere_and_masks_with_holes():
    q, k, v, mask = _batch([0, 100])
    holes = mask.clone()
    holes[1, 0, 0, 150] = False  # a pad after a real column
    assert packed.padding_groups(holes) is None
    right = mask.flip(-1)  # right padding: a run [0, n) per row
    assert [(s0, e0, rows.tolist()) for s0, e0, rows in packed.padding_groups(right)] == [(0, 200, [1]), (0, 300, [0])]
    torch.testing.assert_close(sdpa_attention(q, k, v, right)[0], sdpa_plain_attention(q, k, v, right)[0],
                               rtol=1e-5, atol=1e-5)
    middle = torch.zeros_like(mask)
    middle[0, ..., 20:280] = True
    middle[1, ..., 50:150] = True  # pads on both sides
    assert [(s0, e0) for s0, e0, _ in packed.padding_groups(middle)] == [(20, 280), (50, 150)]
    torch.testing.assert_close(sdpa_attention(q, k, v, middle)[0], sdpa_plain_attention(q, k, v, middle)[0],
                               rtol=1e-5, atol=1e-5)
    little = _batch([0, 10])[3]  # 10 of 600 keys padded: below MIN_PADDED
    assert packed.padding_groups(little) is None
    # shape-only refusals: float masks, one row, a mask shared by the rows, too little work
    assert not packed.wants_packing(q, k, torch.zeros(2, 1, 1, 300))
    assert not packed.wants_packing(q[:1], k[:1], mask[:1])
    assert not packed.wants_packing(q, k, mask[:1])
    qs, ks, _, ms = _batch([0, 30], tk=64)
    assert not packed.wants_packing(qs, ks, ms)
    assert packed.wants_packing(q, k, mask)
    assert not packed.wants_packing(q, k, _batch([0, 100], tk=320)[3])  # mask of another key length
    assert not packed.wants_packing(q, k[:1], mask)  # keys broadcast over the batch
    # off the CPU only full forwards (Tq = Tk): a cached step stays free of host syncs
    qm = torch.empty(2, 4, 300, 16, device="meta")
    km = torch.empty(2, 2, 300, 16, device="meta")
    mm = torch.empty(2, 1, 1, 300, dtype=torch.bool, device="meta")
    assert packed.wants_packing(qm, km, mm)
    assert not packed.wants_packing(qm[:, :, :250], km, mm)
    assert packed.wants_packing(q[:, :, :250], k, mask)  # on the CPU the cached steps too
    many = [(i, torch.tensor([i])) for i in range(packed.MAX_GROUPS_OFF_CPU + 1)]
    assert packed.few_enough(many, torch.device("cpu")) and not packed.few_enough(many, torch.device("meta"))
    assert packed.few_enough(many[:-1], torch.device("meta"))


def test_one_conversion_per_mask_object():
    mask = _batch([0, 100])[3]
    first = packed.padding_groups(mask)
    assert packed.padding_groups(mask) is first  # remembered: no second host sync
    mask[1, 0, 0, :100] = True  # edited in place: converted again
    assert packed.padding_groups(mask) is None  # no pads left


def test_autocast_keeps_sdpa_s_dtype():
    q, k, v, mask = _batch([0, 120, 37])
    with torch.autocast("cpu", dtype=torch.bfloat16):
        fast, _ = sdpa_attention(q, k, v, mask)
        ref, _ = sdpa_plain_attention(q, k, v, mask)
    assert fast.dtype == ref.dtype
    torch.testing.assert_close(fast.float(), ref.float(), rtol=2e-2, atol=2e-2)


def test_backends_are_registered_with_the_plain_path_beside():
    assert backends.get("sdpa").fn is sdpa_attention
    assert backends.get("sdpa_plain").fn is sdpa_plain_attention
    with pytest.raises(ValueError, match="sdpa_plain attention backend cannot return"):
        sdpa_plain_attention(*_batch([0, 1], tk=8)[:3], return_probs=True)


@pytest.mark.parametrize("cache", ["none", "dual"])
def test_a_ragged_long_prompt_batch_decodes_the_same_tokens(cache, monkeypatch):
    """tiny-llada-long on three long-prompt suite prompts of 256 / 516 / 258 tokens (left-padded to
    516): the packed path runs (its calls counted) and gives the plain path's tokens."""
    import dllm.kernels.attention as attention

    model = dllm.load("tiny-llada-long")
    model.packs_padded_rows = False  # full forwards through the padded batch (dllm.models.core.packed_rows off)
    names = T.suite_task_names("long-prompt")
    prompts = [T.prompt_ids(T.test_split(names[i], T.get_task(names[i]).default_sizes[i % 2])[0]) for i in range(3)]
    assert len({len(p) for p in prompts}) > 1
    calls = []

    def counting(*args):
        calls.append(1)
        return packed.packed_sdpa(*args)

    monkeypatch.setattr(attention, "packed_sdpa", counting)
    outs = {}
    for backend in ("sdpa_plain", "sdpa"):
        model.set_attn_backend(backend)
        before = len(calls)
        outs[backend] = dllm.generate(model, prompts, "threshold", gen_length=4, block_length=4, cache=cache)
        assert (len(calls) > before) == (backend == "sdpa")
    assert torch.equal(outs["sdpa"].generated, outs["sdpa_plain"].generated)
    assert outs["sdpa"].nfe == outs["sdpa_plain"].nfe


def test_gradients_match_the_masked_call():
    """Autograd through the packed path gives the masked call's gradients."""
    grads = {}
    for name, fn in (("packed", sdpa_attention), ("plain", sdpa_plain_attention)):
        q, k, v, mask = _batch([0, 120, 37], tk=260, seed=3)
        for t in (q, k, v):
            t.requires_grad_(True)
        out, _ = fn(q, k, v, mask)
        (out * torch.linspace(-1, 1, out.shape[-1])).sum().backward()
        grads[name] = (q.grad, k.grad, v.grad)
    assert packed.padding_groups(_batch([0, 120, 37], tk=260, seed=3)[3]) is not None
    for a, b in zip(grads["packed"], grads["plain"]):
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-5)
