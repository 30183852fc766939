"""The transformer layer's elementwise pieces in plain PyTorch: RMSNorm in each family's rounding (also
per head over q and k side by side, ``rms_norm_qk``) and the table RoPE of q and k together. They are
the models' fused-path math on any device, and the references of the one-launch kernels in
``dllm.kernels.fused_ops``.

Families round RMSNorm differently in low precision: LLaDA's and Qwen2's ``RMSNorm`` normalise in
float32, cast back and then multiply by the weight (two roundings); SDAR's ``SDARRMSNorm`` runs
flash-attn's ``rms_norm_fn``, which multiplies by the weight in float32 and rounds once
(``round_once``). Identical in float32. ``rms_norm_one_op`` computes either through ATen's single
fused kernel. ``rope_rows`` rotates with ``x * cos + roll(x) * sin_signed``; with ``sin_signed =
cat(-sin, sin)`` (``dllm.models.core.layer.rope.RopeTable``) it equals ``x * cos + rotate_half(x) * sin`` bit for
bit (negation is exact).
"""

from __future__ import annotations

import torch

# one ATen kernel (torch >= 2.8), through its C binding: no Python ``torch.ops`` packet call in between
_FUSED_NORM = getattr(torch, "_fused_rms_norm", None) or getattr(torch.ops.aten, "_fused_rms_norm", None)


KERNEL_DTYPES = (torch.float32, torch.float16, torch.bfloat16)  # what the Triton kernels compute

# Shapes and dtypes of the one-launch operators (``dllm.kernels.fused_ops``: the references, the
# kernels and the fake implementations share them)


def rms_norm_dtype(x: torch.Tensor, weight: torch.Tensor, round_once: bool) -> torch.dtype:
    """The result dtype of ``rms_norm_reference``: x's with ``round_once``, else x's promoted with
    the weight's (``weight * x``)."""
    return x.dtype if round_once else torch.promote_types(x.dtype, weight.dtype)


def rope_rows_dtype(x: torch.Tensor, cos_sin: torch.Tensor, fp32: bool) -> torch.dtype:
    """The result dtype of ``rope_rows``: x's when a low-precision x is rotated in float32, else
    x's promoted with the table's."""
    if fp32 and x.dtype != torch.float32:
        return x.dtype
    return torch.promote_types(x.dtype, cos_sin.dtype)


def check_norm_shapes(x: torch.Tensor, weight: torch.Tensor) -> None:
    """x [..., D] (at least 1-D) and weight [D]; raises ValueError otherwise."""
    if x.dim() == 0 or weight.dim() != 1 or weight.shape[0] != x.shape[-1]:
        raise ValueError(f"x must be [..., D] and weight [D], got {tuple(x.shape)} and {tuple(weight.shape)}")


def check_rope_shapes(x: torch.Tensor, cos_sin: torch.Tensor) -> None:
    """x [B, T, H', hd] and cos_sin [B|1, T|1, 2, 1, hd]; raises ValueError otherwise."""
    ok = x.dim() == 4 and cos_sin.dim() == 5
    if ok:
        (b, t, _, hd), (cb, ct, two, one, chd) = x.shape, cos_sin.shape
        ok = cb in (b, 1) and ct in (t, 1) and two == 2 and one == 1 and chd == hd
    if not ok:
        raise ValueError(f"x must be [B, T, H', hd] and cos_sin [B|1, T|1, 2, 1, hd], got "
                         f"{tuple(x.shape)} and {tuple(cos_sin.shape)}")


def rms_norm_supported(x: torch.Tensor, weight: torch.Tensor, round_once: bool) -> bool:
    """Whether the Triton kernel computes this call (float32 / float16 / bfloat16 throughout)."""
    return (x.dtype in KERNEL_DTYPES and weight.dtype in KERNEL_DTYPES
            and rms_norm_dtype(x, weight, round_once) in KERNEL_DTYPES)


def rope_rows_supported(x: torch.Tensor, cos_sin: torch.Tensor, fp32: bool) -> bool:
    """Whether the Triton kernel computes this call (float32 / float16 / bfloat16 throughout)."""
    return (x.dtype in KERNEL_DTYPES and cos_sin.dtype in KERNEL_DTYPES
            and rope_rows_dtype(x, cos_sin, fp32) in KERNEL_DTYPES)


def rms_norm_reference(x: torch.Tensor, weight: torch.Tensor, eps: float, *, round_once: bool) -> torch.Tensor:
    """RMSNorm over the last dim, x [..., D], weight [D] -> x's dtype.

    round_once=False (LLaDA, Dream/Qwen2): normalise in float32, cast back, multiply by the weight.
    round_once=True (SDAR: flash-attn's ``rms_norm_fn``): normalise and multiply in float32, cast once.
    Identical in float32."""
    dtype = x.dtype
    x32 = x.float()
    x32 = x32 * torch.rsqrt(x32.pow(2).mean(dim=-1, keepdim=True) + eps)
    if round_once:
        return (x32 * weight.float()).to(dtype)
    return weight * x32.to(dtype)


def rms_norm_one_op(x: torch.Tensor, weight: torch.Tensor, eps: float, *, round_once: bool) -> torch.Tensor:
    """``rms_norm_reference`` in one ATen kernel (two with ``round_once=False``: the weight multiply
    after the rounding is a second op, except in float32 on a CPU, where there is no rounding between
    and the kernel's ``x * rstd * w`` is the same product as the reference's, bit for bit:
    tests/models/core/test_fused.py; other devices keep two ops until that is checked there). Falls
    back to the reference where torch lacks the kernel."""
    if _FUSED_NORM is None or weight.dtype != x.dtype:
        return rms_norm_reference(x, weight, eps, round_once=round_once)
    # ``is_cpu`` and the weight's own shape: no device object or list built per call (a layer makes three)
    if round_once or (x.is_cpu and x.dtype == torch.float32):
        return _FUSED_NORM(x, weight.shape, weight, eps)[0]
    return weight * _FUSED_NORM(x, weight.shape, None, eps)[0]


def check_qk_norm_shapes(x: torch.Tensor, q_weight: torch.Tensor, k_weight: torch.Tensor, n_q: int) -> None:
    """x [..., H', hd] (at least 2-D), q_weight and k_weight [hd] of one dtype, 0 <= n_q <= H';
    raises ValueError otherwise."""
    check_norm_shapes(x, q_weight)
    check_norm_shapes(x, k_weight)
    if x.dim() < 2 or not 0 <= n_q <= x.shape[-2] or q_weight.dtype != k_weight.dtype:
        raise ValueError(f"x must be [..., H', hd] with 0 <= n_q <= H' and the weights one dtype, got "
                         f"{tuple(x.shape)}, n_q={n_q}, {q_weight.dtype} and {k_weight.dtype}")


def rms_norm_qk(x: torch.Tensor, q_weight: torch.Tensor, k_weight: torch.Tensor, n_q: int, eps: float, *,
                round_once: bool) -> torch.Tensor:
    """Per-head RMSNorm of q and k side by side (Qwen3 / SDAR ``q_norm`` / ``k_norm``): x [..., H', hd]
    -> [..., H', hd], heads ``[0, n_q)`` by ``q_weight`` [hd], the rest by ``k_weight`` [hd], each as
    ``rms_norm_one_op`` (the reference of the one-launch ``dllm::rms_norm_qk``)."""
    q = rms_norm_one_op(x[..., :n_q, :], q_weight, eps, round_once=round_once)
    k = rms_norm_one_op(x[..., n_q:, :], k_weight, eps, round_once=round_once)
    return torch.cat((q, k), dim=-2)


def rope_rows(x: torch.Tensor, cos_sin: torch.Tensor, *, fp32: bool) -> torch.Tensor:
    """Rotate x [B, T, H', hd] (q and k heads side by side) by ``cos_sin`` [B, T, 2, 1, hd]
    (``RopeTable.lookup``). fp32: rotate in float32 and cast back (LLaDA); else in x's dtype."""
    cos, sin = cos_sin.unbind(2)  # [B, T, 1, hd] each (one view call)
    return rope_rows_pair(x, cos, sin, fp32=fp32)


def rope_rows_pair(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, *, fp32: bool) -> torch.Tensor:
    """``rope_rows`` with the table's cos and signed sin apart, [B, T, 1, hd] each (``cos_sin.unbind(2)``,
    which a forward makes once for all its layers)."""
    half = x.shape[-1] // 2
    if fp32 and x.dtype != torch.float32:
        x32 = x.float()
        return (x32 * cos + x32.roll(half, dims=-1) * sin).to(x.dtype)
    return x * cos + x.roll(half, dims=-1) * sin


__all__ = ["KERNEL_DTYPES", "check_norm_shapes", "check_qk_norm_shapes", "check_rope_shapes", "rms_norm_dtype",
           "rms_norm_one_op", "rms_norm_qk", "rms_norm_reference", "rms_norm_supported", "rope_rows", "rope_rows_pair",
           "rope_rows_dtype", "rope_rows_supported"]
