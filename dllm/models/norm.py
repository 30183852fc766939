"""RMSNorm: the reference (free functions in the official order) and the one-op form of the fused layer.

Families round differently in low precision: LLaDA's and Qwen2's ``RMSNorm`` normalise in float32,
cast back and then multiply by the weight (two roundings); SDAR's ``SDARRMSNorm`` runs flash-attn's
``rms_norm_fn``, which multiplies by the weight in float32 and rounds once (``round_once``).
Identical in float32. ``rms_norm_one_op`` computes either through ATen's single fused kernel.
"""

from __future__ import annotations

import torch
import torch.nn as nn

_FUSED_NORM = getattr(torch.ops.aten, "_fused_rms_norm", None)  # one ATen kernel (torch >= 2.8)


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
    after the rounding is a second op). Falls back to the reference where torch lacks the kernel."""
    if _FUSED_NORM is None or weight.dtype != x.dtype:
        return rms_norm_reference(x, weight, eps, round_once=round_once)
    if round_once:
        return _FUSED_NORM(x, [x.shape[-1]], weight, eps)[0]
    return weight * _FUSED_NORM(x, [x.shape[-1]], None, eps)[0]


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float, round_once: bool = False) -> torch.Tensor:
    """RMSNorm in the official order: normalise in float32, cast back, THEN multiply by the weight
    (LLaDA, Qwen2); ``round_once``: multiply in float32 and cast once (SDAR's flash-attn kernel).

    x: [..., D] any float dtype; weight: [D]. Returns x's dtype (times weight's promotion).
    """
    return rms_norm_reference(x, weight, eps, round_once=round_once)


class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float, round_once: bool = False) -> None:
        super().__init__()
        self.eps = eps
        self.round_once = round_once
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return rms_norm(x, self.weight, self.eps, self.round_once)

    def fused(self, x: torch.Tensor) -> torch.Tensor:
        """The same norm in one ATen kernel (``rms_norm_one_op``)."""
        return rms_norm_one_op(x, self.weight, self.eps, round_once=self.round_once)


__all__ = ["RMSNorm", "rms_norm", "rms_norm_one_op", "rms_norm_reference"]
