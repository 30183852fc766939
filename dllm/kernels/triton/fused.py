"""Triton kernels behind ``dllm::rms_norm``, ``dllm::rms_norm_qk`` and ``dllm::rope_rows``
(``dllm.kernels.fused_ops``): each a single launch that reproduces the rounding of its PyTorch reference.

- ``rms_norm_triton(x, weight, eps, round_once=)``: RMSNorm over the last dim, one program per row,
  float32 math. ``round_once=False`` (LLaDA, Qwen2): ``y = x * rstd`` in float32, rounded to x's
  dtype, then ``y * w`` in float32 rounded to the result dtype — the product of two bf16 (or two
  fp16) values is exact in float32, so this is the eager low-precision multiply bit for bit.
  ``round_once=True`` (SDAR): ``x * rstd * w`` in float32, rounded once. Reference:
  ``dllm.kernels.layer_ops.rms_norm_one_op``. With ``second=(k_weight, n_q)`` the rows from index
  ``n_q`` of dim -2 on take the second weight: the per-head q and k norms of Qwen3 / SDAR in one
  launch (reference: ``dllm.kernels.layer_ops.rms_norm_qk``).
- ``rope_rows_triton(x, cos_sin, fp32=)``: ``x * cos + roll(x, hd/2) * sin`` for x [B, T, H', hd]
  (any strides) and the table rows cos_sin [B|1, T|1, 2, 1, hd] of ``RopeTable.lookup``; one
  program per (b, t) and block of heads. With float32 math (``fp32=True``, or a float32 result)
  the sum is rounded once at the store; otherwise each product is rounded to the result dtype
  first, as the eager low-precision ``mul`` / ``mul`` / ``add`` do. Reference:
  ``dllm.kernels.layer_ops.rope_rows``.

Both write a new contiguous tensor. Multiply-add contraction is switched off at compile time
(``enable_fp_fusion=False``), so a product is rounded before it is added, as in the eager ops.
The sum of squares of RMSNorm is reduced in a different order than ATen's, so its rstd, and after
rounding a small fraction of outputs, can differ from the reference by an ulp.

On CPU the kernels run only in the Triton interpreter (``TRITON_INTERPRET=1`` set before triton is
imported), which treats bfloat16 as raw bits: float32 and float16 only there.
"""

from __future__ import annotations

from typing import Optional

import torch
import triton
import triton.language as tl

from dllm.kernels.layer_ops import (check_norm_shapes, check_qk_norm_shapes, check_rope_shapes, rms_norm_dtype,
                                    rms_norm_supported, rope_rows_dtype, rope_rows_supported)
from dllm.kernels.triton.launch import next_pow2, observed_launch
from dllm.kernels.triton.attention import _check_device, _interpreted

_MAX_BLOCK_D = 8192  # RMSNorm: channels per tile (a longer row is walked in tiles)
_ROPE_TILE = 4096  # RoPE: heads * channels per program, at most


# ----------------------------------------------------------------------------------------------
# Kernels


@triton.jit
def _rms_norm_kernel(
    X, W, W2, Out,  # x [A, R1, R2, D] (any strides); weights [D] contiguous; out [A * R1 * R2, D]
    R1, R2, D, SPLIT,  # rows with i2 >= SPLIT take W2 (the k heads of rms_norm_qk), the others W
    stride_xa, stride_x1, stride_x2, stride_xd,
    eps,
    BLOCK_D: tl.constexpr, ROUND_ONCE: tl.constexpr,
):
    row = tl.program_id(0)
    i2 = row % R2
    i1 = (row // R2) % R1
    i0 = row // (R2 * R1)
    first = i2 < SPLIT
    x_row = X + i0.to(tl.int64) * stride_xa + i1.to(tl.int64) * stride_x1 + i2.to(tl.int64) * stride_x2
    out_row = Out + row.to(tl.int64) * D
    cols0 = tl.arange(0, BLOCK_D)

    acc = tl.zeros([BLOCK_D], tl.float32)  # sum of squares, per lane
    for start in range(0, D, BLOCK_D):
        cols = start + cols0
        x = tl.load(x_row + cols * stride_xd, mask=cols < D, other=0.0).to(tl.float32)
        acc += x * x
    rstd = tl.math.rsqrt(tl.sum(acc, 0) / D + eps)

    for start in range(0, D, BLOCK_D):
        cols = start + cols0
        keep = cols < D
        x = tl.load(x_row + cols * stride_xd, mask=keep, other=0.0).to(tl.float32)
        w = tl.where(first, tl.load(W + cols, mask=keep, other=0.0),  # both loaded: a [D] row each,
                     tl.load(W2 + cols, mask=keep, other=0.0)).to(tl.float32)  # cached across programs
        y = x * rstd
        if not ROUND_ONCE:  # the normalised row is rounded to x's dtype before the weight multiply
            y = y.to(X.dtype.element_ty).to(tl.float32)
        tl.store(out_row + cols, (y * w).to(Out.dtype.element_ty), mask=keep)


@triton.jit
def _rope_rows_kernel(
    X, CS, Out,  # x [B, T, H, hd] (any strides); cos_sin [B, T, 2, hd] (any strides); out [B, T, H, hd]
    T, H, HD, HALF,
    stride_xb, stride_xt, stride_xh, stride_xd,
    stride_cb, stride_ct, stride_cp, stride_cd,
    BLOCK_H: tl.constexpr, BLOCK_D: tl.constexpr, ROUND_PRODUCTS: tl.constexpr,
):
    row = tl.program_id(0)  # b * T + t
    b = row // T
    t = row % T
    heads = tl.program_id(1) * BLOCK_H + tl.arange(0, BLOCK_H)  # [BH]
    d = tl.arange(0, BLOCK_D)  # [BD]
    src = (d + HD - HALF) % HD  # roll(x, HALF)[d] = x[(d - HALF) mod hd]
    in_d = d < HD

    cs_row = CS + b.to(tl.int64) * stride_cb + t.to(tl.int64) * stride_ct
    c = tl.load(cs_row + d * stride_cd, mask=in_d, other=0.0).to(tl.float32)  # [BD]
    s = tl.load(cs_row + stride_cp + d * stride_cd, mask=in_d, other=0.0).to(tl.float32)  # signed sin

    keep = (heads[:, None] < H) & in_d[None, :]  # [BH, BD]
    x_row = X + b.to(tl.int64) * stride_xb + t.to(tl.int64) * stride_xt
    x_heads = x_row + heads[:, None].to(tl.int64) * stride_xh
    x = tl.load(x_heads + d[None, :] * stride_xd, mask=keep, other=0.0).to(tl.float32)
    xr = tl.load(x_heads + src[None, :] * stride_xd, mask=keep, other=0.0).to(tl.float32)

    p = x * c[None, :]
    q = xr * s[None, :]
    if ROUND_PRODUCTS:  # the eager low-precision ops round each product, then the sum
        p = p.to(Out.dtype.element_ty).to(tl.float32)
        q = q.to(Out.dtype.element_ty).to(tl.float32)
    out_row = Out + row.to(tl.int64) * H * HD
    tl.store(out_row + heads[:, None] * HD + d[None, :], (p + q).to(Out.dtype.element_ty), mask=keep)


# ----------------------------------------------------------------------------------------------
# Launchers


def _rows4(x: torch.Tensor) -> torch.Tensor:
    """[..., D] -> [A, R1, R2, D]: a view for up to 3 leading dims, else a reshape (a copy when
    the strides do not allow a view)."""
    if x.dim() < 4:
        return x.reshape((1,) * (4 - x.dim()) + tuple(x.shape))
    if x.dim() > 4:
        return x.reshape(-1, *x.shape[-3:])
    return x


def _launch_options(kernel, num_warps: int) -> dict:
    return {} if _interpreted(kernel) else {"num_warps": num_warps, "enable_fp_fusion": False}


def rms_norm_triton(x: torch.Tensor, weight: torch.Tensor, eps: float, *, round_once: bool,
                    block_d: Optional[int] = None,
                    second: Optional[tuple[torch.Tensor, int]] = None) -> torch.Tensor:
    """RMSNorm of x [..., D] (any strides) by weight [D] in one launch -> contiguous [..., D] in
    ``rms_norm_dtype`` (see the module docstring for the rounding). ``block_d``: channels per tile
    (a power of two; default: the whole row up to 8192). ``second=(weight2, n)``: the rows at
    index ``>= n`` of dim -2 take ``weight2`` [D] (of weight's dtype) instead: q and k heads side
    by side (``dllm::rms_norm_qk``)."""
    check_norm_shapes(x, weight)
    weight2, split = (weight, x.shape[-2] if x.dim() > 1 else 1) if second is None else second
    if second is not None:
        check_qk_norm_shapes(x, weight, weight2, split)
    if not rms_norm_supported(x, weight, round_once):
        raise TypeError(f"rms_norm_triton takes float32/float16/bfloat16, got {x.dtype} and {weight.dtype}")
    _check_device(x, _rms_norm_kernel)
    out = torch.empty(x.shape, dtype=rms_norm_dtype(x, weight, round_once), device=x.device)
    x4 = _rows4(x)
    if out.numel() == 0:
        return out
    d = x.shape[-1]
    rows = x.numel() // d
    block = block_d or min(next_pow2(d), _MAX_BLOCK_D)
    warps = 8 if block >= 2048 else 4 if block >= 512 else 1
    observed_launch(
        "rms_norm", _rms_norm_kernel, (rows,),
        x4, weight.contiguous(), weight2.contiguous(), out,
        x4.shape[1], x4.shape[2], d, int(split),
        *x4.stride(), float(eps),
        BLOCK_D=block, ROUND_ONCE=bool(round_once), **_launch_options(_rms_norm_kernel, warps),
    )
    return out


def rope_rows_triton(x: torch.Tensor, cos_sin: torch.Tensor, *, fp32: bool,
                     block_h: Optional[int] = None) -> torch.Tensor:
    """Rotate x [B, T, H', hd] (any strides) by cos_sin [B|1, T|1, 2, 1, hd] in one launch ->
    contiguous [B, T, H', hd] in ``rope_rows_dtype`` (see the module docstring for the rounding).
    ``block_h``: heads per program (a power of two; default: up to 4096 channels per program)."""
    check_rope_shapes(x, cos_sin)
    if not rope_rows_supported(x, cos_sin, fp32):
        raise TypeError(f"rope_rows_triton takes float32/float16/bfloat16, got {x.dtype} and {cos_sin.dtype}")
    _check_device(x, _rope_rows_kernel)
    dtype = rope_rows_dtype(x, cos_sin, fp32)
    bsz, t, h, hd = x.shape
    out = torch.empty((bsz, t, h, hd), dtype=dtype, device=x.device)
    if out.numel() == 0:
        return out
    cs = cos_sin[:, :, :, 0].expand(bsz, t, 2, hd)  # [B, T, 2, hd]; a broadcast dim gets stride 0
    block_d = next_pow2(hd)
    block_h = block_h or max(1, min(next_pow2(h), _ROPE_TILE // block_d))
    round_products = not fp32 and dtype != torch.float32
    warps = 4 if block_h * block_d >= 1024 else 1
    observed_launch(
        "rope_rows", _rope_rows_kernel, (bsz * t, triton.cdiv(h, block_h)),
        x, cs, out,
        t, h, hd, hd // 2,
        *x.stride(), *cs.stride(),
        BLOCK_H=block_h, BLOCK_D=block_d, ROUND_PRODUCTS=round_products,
        **_launch_options(_rope_rows_kernel, warps),
    )
    return out


__all__ = ["rms_norm_triton", "rope_rows_triton"]
