"""``dllm::rms_norm`` / ``dllm::rms_norm_qk`` / ``dllm::rope_rows`` (``dllm.kernels.fused_ops``) and their Triton kernels
(``dllm.kernels.triton.fused``): the ops equal their references bit for bit off CUDA, are one
dispatcher call each, trace under ``torch.compile``; the kernels (interpreted on CPU, compiled on a
GPU) match the references to the last ulp or so."""

from __future__ import annotations

import logging
import os
import subprocess
import sys

import pytest
import torch

from dllm.eval.bench.counters import DispatchCounter
from dllm.kernels.fused_ops import rms_norm, rms_norm_qk, rope_rows, triton_unavailable
from dllm.kernels.layer_ops import rms_norm_qk as rms_norm_qk_reference
from dllm.kernels.triton.fused import rms_norm_triton, rope_rows_triton
from dllm.models.core.layer.norm import rms_norm_one_op
from dllm.models.core.layer.rope import RopeTable
from dllm.models.core.layer.rope import rope_rows as rope_rows_reference

from .conftest import DEVICE, INTERPRETED

log = logging.getLogger("dllm.tests.kernels")

DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}
EPS = 1e-6
HD = 64


def _ordered(t: torch.Tensor) -> torch.Tensor:
    """Float bits as integers ordered like the values (adjacent floats differ by 1), in int64."""
    width = {torch.float32: torch.int32, torch.float16: torch.int16, torch.bfloat16: torch.int16}[t.dtype]
    bits = t.contiguous().view(width).to(torch.int64)
    sign_mask = 1 << (8 * t.element_size() - 1)
    return torch.where(bits < 0, -(bits & (sign_mask - 1)), bits)


def ulp_distance(ref: torch.Tensor, out: torch.Tensor) -> torch.Tensor:
    """How many representable values of ref's dtype lie between ``ref`` and ``out`` (elementwise)."""
    assert ref.dtype == out.dtype and ref.shape == out.shape
    return (_ordered(ref) - _ordered(out)).abs()


def assert_kernel_close(name: str, ref: torch.Tensor, out: torch.Tensor) -> float:
    """float32: within 1e-6 relative of each reference value; float16 / bfloat16: within 1 ulp.
    Returns (and logs) the fraction of bit-identical outputs."""
    assert out.dtype == ref.dtype and out.shape == ref.shape and out.is_contiguous()
    ref, out = ref.cpu(), out.cpu()
    assert torch.isfinite(out).all(), f"{name}: non-finite output"
    if ref.dtype == torch.float32:
        err = (out.double() - ref.double()).abs()
        bound = 1e-6 * ref.double().abs()
        assert (err <= bound).all(), f"{name}: max relative error {float((err / ref.double().abs()).max()):.2e}"
    else:
        ulps = ulp_distance(ref, out)
        assert int(ulps.max()) <= 1, f"{name}: {int(ulps.max())} ulps apart"
    same = float((out == ref).float().mean())
    log.info("%s: %.4f of outputs bit-identical", name, same)
    return same


# ----------------------------------------------------------------------------------------------
# Inputs


def _norm_input(layout: str, dtype: torch.dtype, g: torch.Generator) -> torch.Tensor:
    """x for RMSNorm: [B, T, D], a per-head slice of a fused q/k/v row [B, T, H, hd] (strided), 2-D,
    5-D, or non-unit channel stride."""
    if layout == "rows":
        return torch.randn(2, 5, 96, generator=g).to(dtype)
    if layout == "heads":  # q of qkv [B, T, H + 2Hkv, hd]: rows of hd with gaps
        return torch.randn(2, 3, 7, HD, generator=g).to(dtype)[:, :, :4]
    if layout == "matrix":
        return torch.randn(6, 40, generator=g).to(dtype)
    if layout == "deep":
        return torch.randn(2, 2, 3, 2, 48, generator=g).to(dtype)
    assert layout == "channel_stride"
    return torch.randn(3, 4, 80, generator=g).to(dtype)[..., ::2]


def _weight(d: int, dtype: torch.dtype, g: torch.Generator) -> torch.Tensor:
    return (1 + 0.2 * torch.randn(d, generator=g)).to(dtype)


def _rope_inputs(dtype: torch.dtype, fp32: bool, g: torch.Generator, *, strided: bool = True, hd: int = HD,
                 batch_table: bool = True) -> tuple[torch.Tensor, torch.Tensor]:
    """q and k of a fused qkv row ([B, T, H + Hkv, hd] slice of [B, T, H + 2Hkv, hd]) and the table
    rows in the dtype the model looks them up in (float32 for a float32 rotation)."""
    bsz, t, heads, kv = 2, 3, 4, 2
    qkv = 3 * torch.randn(bsz, t, heads + 2 * kv, hd, generator=g).to(dtype)
    x = qkv[:, :, :heads + kv] if strided else qkv[:, :, :heads + kv].contiguous()
    positions = torch.randint(0, 4000, (bsz if batch_table else 1, t), generator=g)
    cos_sin = RopeTable(hd, 10000.0).lookup(positions, torch.float32 if fp32 else dtype, 4096)
    return x, cos_sin


# ----------------------------------------------------------------------------------------------
# The ops off CUDA are the references


@pytest.mark.parametrize("layout", ["rows", "heads", "matrix", "deep", "channel_stride"])
@pytest.mark.parametrize("round_once", [False, True], ids=["round_twice", "round_once"])
@pytest.mark.parametrize("dtype", list(DTYPES), ids=list(DTYPES))
def test_rms_norm_op_is_the_reference(dtype: str, round_once: bool, layout: str) -> None:
    g = torch.Generator().manual_seed(1)
    x = _norm_input(layout, DTYPES[dtype], g)
    w = _weight(x.shape[-1], DTYPES[dtype], g)
    out = rms_norm(x, w, EPS, round_once=round_once)
    ref = rms_norm_one_op(x, w, EPS, round_once=round_once)
    assert out.dtype == ref.dtype and out.is_contiguous() and torch.equal(out, ref)


@pytest.mark.parametrize("round_once", [False, True], ids=["round_twice", "round_once"])
def test_rms_norm_op_mixed_dtypes(round_once: bool) -> None:
    g = torch.Generator().manual_seed(2)
    x, w = torch.randn(3, 32, generator=g).to(torch.bfloat16), _weight(32, torch.float32, g)
    out, ref = rms_norm(x, w, EPS, round_once=round_once), rms_norm_one_op(x, w, EPS, round_once=round_once)
    assert out.dtype == ref.dtype == (torch.bfloat16 if round_once else torch.float32)
    assert torch.equal(out, ref)


def _qk_input(dtype: torch.dtype, g: torch.Generator, hd: int = HD) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The q|k slice of a fused qkv row [B, T, H + 2Hkv, hd] (H = 4, Hkv = 2; strided) and the two
    per-head weights [hd]."""
    qkv = torch.randn(2, 3, 8, hd, generator=g).to(dtype)
    return qkv[:, :, :6], _weight(hd, dtype, g), _weight(hd, dtype, g)


@pytest.mark.parametrize("round_once", [False, True], ids=["round_twice", "round_once"])
@pytest.mark.parametrize("dtype", list(DTYPES), ids=list(DTYPES))
def test_rms_norm_qk_op_is_the_reference(dtype: str, round_once: bool) -> None:
    g = torch.Generator().manual_seed(13)
    x, qw, kw = _qk_input(DTYPES[dtype], g)
    out = rms_norm_qk(x, qw, kw, 4, EPS, round_once=round_once)
    ref = torch.cat((rms_norm_one_op(x[:, :, :4], qw, EPS, round_once=round_once),
                     rms_norm_one_op(x[:, :, 4:], kw, EPS, round_once=round_once)), dim=2)
    assert out.dtype == ref.dtype and out.is_contiguous() and torch.equal(out, ref)
    assert torch.equal(rms_norm_qk_reference(x, qw, kw, 4, EPS, round_once=round_once), ref)


def test_rms_norm_qk_shapes_are_checked() -> None:
    x = torch.randn(2, 3, 6, HD)
    with pytest.raises(ValueError):
        rms_norm_qk(x, torch.ones(HD), torch.ones(HD), 7, EPS, round_once=True)
    with pytest.raises(ValueError):
        rms_norm_qk(x, torch.ones(HD), torch.ones(HD, dtype=torch.float16), 4, EPS, round_once=True)
    with pytest.raises(ValueError):
        rms_norm_qk(x, torch.ones(HD), torch.ones(HD - 1), 4, EPS, round_once=True)


@pytest.mark.parametrize("strided", [True, False], ids=["strided", "contiguous"])
@pytest.mark.parametrize("fp32", [True, False], ids=["fp32_rotation", "dtype_rotation"])
@pytest.mark.parametrize("dtype", list(DTYPES), ids=list(DTYPES))
def test_rope_rows_op_is_the_reference(dtype: str, fp32: bool, strided: bool) -> None:
    g = torch.Generator().manual_seed(3)
    x, cos_sin = _rope_inputs(DTYPES[dtype], fp32, g, strided=strided)
    out, ref = rope_rows(x, cos_sin, fp32=fp32), rope_rows_reference(x, cos_sin, fp32=fp32)
    assert out.dtype == ref.dtype == DTYPES[dtype] and out.is_contiguous() and torch.equal(out, ref)


def test_rope_rows_op_broadcast_table() -> None:
    g = torch.Generator().manual_seed(4)
    x, cos_sin = _rope_inputs(torch.bfloat16, False, g, batch_table=False)  # cos_sin [1, T, 2, 1, hd]
    assert torch.equal(rope_rows(x, cos_sin, fp32=False), rope_rows_reference(x, cos_sin, fp32=False))


def test_shapes_are_checked() -> None:
    x = torch.randn(2, 3, 4, HD)
    with pytest.raises(ValueError):
        rms_norm(x, torch.ones(HD + 1), EPS, round_once=False)
    with pytest.raises(ValueError):
        rope_rows(x, torch.randn(2, 3, 2, 1, HD // 2), fp32=True)
    with pytest.raises(ValueError):
        rope_rows(x[0], torch.randn(2, 3, 2, 1, HD), fp32=True)


# ----------------------------------------------------------------------------------------------
# One dispatcher call each


def _count(fn) -> tuple[int, int]:
    """(ATen-level calls, kernel-like calls) that ``fn()`` issues."""
    with torch.inference_mode(), DispatchCounter() as counter:
        fn()
    return counter.current.outside_aten, counter.current.outside_kernels


def test_one_op_per_call() -> None:
    g = torch.Generator().manual_seed(5)
    x = torch.randn(2, 3, 128, generator=g).to(torch.bfloat16)
    w = _weight(128, torch.bfloat16, g)
    qk, cos_sin = _rope_inputs(torch.bfloat16, True, g)
    w64 = _weight(HD, torch.bfloat16, g)
    calls = {
        "rms_norm": (lambda: rms_norm(x, w, EPS, round_once=False),
                     lambda: rms_norm_one_op(x, w, EPS, round_once=False)),
        "rope_rows": (lambda: rope_rows(qk, cos_sin, fp32=True),
                      lambda: rope_rows_reference(qk, cos_sin, fp32=True)),
        "rms_norm_qk": (lambda: rms_norm_qk(qk, w64, w64, 4, EPS, round_once=True),
                        lambda: rms_norm_qk_reference(qk, w64, w64, 4, EPS, round_once=True)),
    }
    for name, (op, reference) in calls.items():
        ours, theirs = _count(op), _count(reference)
        log.info("%s: %s (ATen calls, kernels); reference: %s", name, ours, theirs)
        assert ours == (1, 1), f"{name}: {ours}"
        assert theirs[1] > 1, f"{name}: the reference is already one kernel: {theirs}"


# ----------------------------------------------------------------------------------------------
# torch.compile traces both ops (fake implementations)


def test_compile_fullgraph() -> None:
    g = torch.Generator().manual_seed(6)
    h = torch.randn(2, 3, 96, generator=g).to(torch.bfloat16)
    w = _weight(96, torch.bfloat16, g)
    qk, cos_sin = _rope_inputs(torch.bfloat16, True, g)

    def layer_part(h: torch.Tensor, w: torch.Tensor, qk: torch.Tensor, cos_sin: torch.Tensor):
        return rms_norm(h, w, EPS, round_once=False) * 2, rope_rows(qk, cos_sin, fp32=True)

    compiled = torch.compile(layer_part, fullgraph=True, backend="aot_eager")
    with torch.no_grad():
        got, want = compiled(h, w, qk, cos_sin), layer_part(h, w, qk, cos_sin)
    for a, b in zip(got, want):
        assert a.dtype == b.dtype and torch.equal(a, b)


def test_opcheck() -> None:
    """Schema, fake implementation (shape, dtype, strides) and AOT dispatch agree with the real one."""
    g = torch.Generator().manual_seed(12)
    qk, cos_sin = _rope_inputs(torch.bfloat16, True, g)
    w = _weight(HD, torch.bfloat16, g)
    torch.library.opcheck(torch.ops.dllm.rms_norm.default, (qk, w, EPS, False))
    torch.library.opcheck(torch.ops.dllm.rms_norm.default, (qk.float(), w.float(), EPS, True))
    torch.library.opcheck(torch.ops.dllm.rope_rows.default, (qk, cos_sin, True))
    torch.library.opcheck(torch.ops.dllm.rms_norm_qk.default, (qk, w, w.flip(0), 4, EPS, True))


def test_cpu_path_needs_no_triton() -> None:
    """With triton unimportable the ops run (the references) and the CUDA path knows why not."""
    code = (
        "import sys; sys.modules['triton'] = None\n"
        "import torch\n"
        "from dllm.kernels import fused_ops as f\n"
        "x = torch.randn(2, 3, 8, 16); w = torch.ones(16)\n"
        "f.rms_norm(x, w, 1e-6, round_once=False)\n"
        "f.rope_rows(x, torch.randn(2, 3, 2, 1, 16), fp32=True)\n"
        "assert 'dllm.kernels.triton.fused' not in sys.modules\n"
        "assert torch.equal(f._rms_norm_cuda(x, w, 1e-6, True), f.rms_norm_one_op(x, w, 1e-6, round_once=True))\n"
        "assert torch.equal(f._rms_norm_qk_cuda(x, w, w, 5, 1e-6, True), f.rms_norm_qk(x, w, w, 5, 1e-6, round_once=True))\n"
        "assert f.triton_unavailable() is not None\n"
    )
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    done = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]


# ----------------------------------------------------------------------------------------------
# The Triton kernels (interpreted on CPU: float32 and float16; compiled on a GPU)

KERNEL_DTYPES = {"fp32": torch.float32, "fp16": torch.float16}


@pytest.mark.parametrize("layout, block_d", [("rows", None), ("rows", 32), ("heads", None), ("matrix", None),
                                             ("deep", None), ("channel_stride", 16)])
@pytest.mark.parametrize("round_once", [False, True], ids=["round_twice", "round_once"])
@pytest.mark.parametrize("dtype", list(KERNEL_DTYPES), ids=list(KERNEL_DTYPES))
def test_rms_norm_kernel(dtype: str, round_once: bool, layout: str, block_d) -> None:
    g = torch.Generator().manual_seed(7)
    x = _norm_input(layout, KERNEL_DTYPES[dtype], g)
    w = _weight(x.shape[-1], KERNEL_DTYPES[dtype], g)
    out = rms_norm_triton(x.to(DEVICE), w.to(DEVICE), EPS, round_once=round_once, block_d=block_d)
    assert_kernel_close(f"rms_norm {dtype} {layout}", rms_norm_one_op(x, w, EPS, round_once=round_once), out)


@pytest.mark.parametrize("round_once", [False, True], ids=["round_twice", "round_once"])
def test_rms_norm_kernel_mixed_dtypes(round_once: bool) -> None:
    g = torch.Generator().manual_seed(8)
    x, w = torch.randn(4, 48, generator=g).to(torch.float16), _weight(48, torch.float32, g)
    out = rms_norm_triton(x.to(DEVICE), w.to(DEVICE), EPS, round_once=round_once)
    assert_kernel_close("rms_norm fp16 x, fp32 weight", rms_norm_one_op(x, w, EPS, round_once=round_once), out)


@pytest.mark.parametrize("n_q", [0, 4, 6])
@pytest.mark.parametrize("round_once", [False, True], ids=["round_twice", "round_once"])
@pytest.mark.parametrize("dtype", list(KERNEL_DTYPES), ids=list(KERNEL_DTYPES))
def test_rms_norm_qk_kernel(dtype: str, round_once: bool, n_q: int) -> None:
    g = torch.Generator().manual_seed(14)
    x, qw, kw = _qk_input(KERNEL_DTYPES[dtype], g)
    out = rms_norm_triton(x.to(DEVICE), qw.to(DEVICE), EPS, round_once=round_once, second=(kw.to(DEVICE), n_q))
    ref = rms_norm_qk_reference(x, qw, kw, n_q, EPS, round_once=round_once)
    assert_kernel_close(f"rms_norm_qk {dtype} n_q={n_q}", ref, out)
    if n_q not in (0, 6):  # the weights differ: each head took its own
        swapped = rms_norm_qk_reference(x, kw, qw, n_q, EPS, round_once=round_once)
        assert not torch.allclose(out.cpu(), swapped)


@pytest.mark.parametrize("case", ["strided", "contiguous", "broadcast_table", "head_blocks", "hd96"])
@pytest.mark.parametrize("fp32", [True, False], ids=["fp32_rotation", "dtype_rotation"])
@pytest.mark.parametrize("dtype", list(KERNEL_DTYPES), ids=list(KERNEL_DTYPES))
def test_rope_rows_kernel(dtype: str, fp32: bool, case: str) -> None:
    g = torch.Generator().manual_seed(9)
    x, cos_sin = _rope_inputs(KERNEL_DTYPES[dtype], fp32, g, strided=case != "contiguous",
                              hd=96 if case == "hd96" else HD, batch_table=case != "broadcast_table")
    out = rope_rows_triton(x.to(DEVICE), cos_sin.to(DEVICE), fp32=fp32, block_h=2 if case == "head_blocks" else None)
    ref = rope_rows_reference(x, cos_sin, fp32=fp32)
    assert assert_kernel_close(f"rope_rows {dtype} fp32={fp32} {case}", ref, out) == 1.0  # no reduction: exact


# ----------------------------------------------------------------------------------------------
# On a GPU: bfloat16 at model sizes, through the ops

cuda_only = pytest.mark.skipif(INTERPRETED or not torch.cuda.is_available(),
                               reason="needs a CUDA device and the compiled (not interpreted) kernels")


@cuda_only
@pytest.mark.parametrize("round_once", [False, True], ids=["round_twice", "round_once"])
def test_rms_norm_cuda_bf16(round_once: bool) -> None:
    assert triton_unavailable() is None
    g = torch.Generator().manual_seed(10)
    for shape in [(4, 64, 4096), (4, 64, 40, 128)]:
        x = torch.randn(*shape, generator=g).to(torch.bfloat16)
        w = _weight(shape[-1], torch.bfloat16, g)
        x, w = x.cuda(), w.cuda()
        out, ref = rms_norm(x, w, EPS, round_once=round_once), rms_norm_one_op(x, w, EPS, round_once=round_once)
        same = assert_kernel_close(f"cuda rms_norm bf16 {shape}", ref, out)
        assert same >= 0.99, f"only {same:.4f} of outputs bit-identical"


@cuda_only
def test_rms_norm_qk_cuda_bf16() -> None:
    assert triton_unavailable() is None
    g = torch.Generator().manual_seed(15)
    qkv = torch.randn(4, 64, 48, 128, generator=g).to(torch.bfloat16)
    x = qkv[:, :, :40].cuda()  # q (32 heads) and k (8 heads) of a fused qkv
    qw, kw = _weight(128, torch.bfloat16, g).cuda(), _weight(128, torch.bfloat16, g).cuda()
    out = rms_norm_qk(x, qw, kw, 32, EPS, round_once=True)
    ref = rms_norm_qk_reference(x, qw, kw, 32, EPS, round_once=True)
    same = assert_kernel_close("cuda rms_norm_qk bf16", ref, out)
    assert same >= 0.99, f"only {same:.4f} of outputs bit-identical"


@cuda_only
@pytest.mark.parametrize("fp32", [True, False], ids=["fp32_rotation", "dtype_rotation"])
def test_rope_rows_cuda_bf16(fp32: bool) -> None:
    assert triton_unavailable() is None
    g = torch.Generator().manual_seed(11)
    qkv = torch.randn(4, 64, 48, 128, generator=g).to(torch.bfloat16)
    x = qkv[:, :, :40]  # q (32 heads) and k (8 heads) of a fused qkv
    cos_sin = RopeTable(128, 500000.0).lookup(torch.randint(0, 8192, (4, 64), generator=g),
                                              torch.float32 if fp32 else torch.bfloat16, 8192)
    x, cos_sin = x.cuda(), cos_sin.cuda()
    out, ref = rope_rows(x, cos_sin, fp32=fp32), rope_rows_reference(x, cos_sin, fp32=fp32)
    same = assert_kernel_close(f"cuda rope_rows bf16 fp32={fp32}", ref, out)
    assert same >= 0.99, f"only {same:.4f} of outputs bit-identical"


def test_the_ops_refuse_a_backward_with_a_clear_error() -> None:
    """The operators are for inference: a backward through one raises, naming the reference to use."""
    x = torch.randn(2, 3, 4, HD, requires_grad=True)
    cos_sin = RopeTable(HD, 10000.0).lookup(torch.arange(3).expand(2, 3), torch.float32, 8)
    for out in (rms_norm(x, torch.ones(HD), EPS, round_once=False), rope_rows(x, cos_sin, fp32=True),
                rms_norm_qk(x, torch.ones(HD), torch.ones(HD), 2, EPS, round_once=True)):
        with pytest.raises(RuntimeError, match="has no backward.*dllm.kernels.layer_ops"):
            out.sum().backward()
