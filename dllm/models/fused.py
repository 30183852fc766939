"""The fused inference layer: the same transformer layer in fewer, larger ops.

A GPU runs a cached decode step's small matmuls in microseconds, so the step is bound by the ops
Python issues per layer. This module holds the pieces ``TransformerBlock``'s fused path is made of;
the module-by-module path in ``transformer.py`` stays beside it as the reference, and the tests
compare the two (tests/models/test_fused.py).

- ``FusedWeight``: the q/k/v (or gate/up) weights concatenated into one matrix, with the original
  ``nn.Linear`` parameters re-pointed into it (no second copy of the weights; ``state_dict``, the
  checkpoint key maps, saving, training and quantization still see the separate projections).
  ``valid()`` notices when something replaced a parameter (``load_state_dict``, ``.to()``), and
  the layer then fuses again.
- ``rms_norm_one_op``: RMSNorm through ATen's single fused kernel, rounding as the family's
  official norm does (``round_once``: multiply by the weight in float32 and round once, as
  flash-attn's ``rms_norm_fn`` in SDAR; else normalise, round, then multiply by the weight in the
  activation dtype, as LLaDA's and Qwen2's ``RMSNorm``).
- ``RopeTable``: cos and signed-sin tables per position, computed once per device and dtype with
  the reference formula and gathered by position in one op per forward.
- ``rope_rows``: rotate-half RoPE of q and k together as ``x * cos + roll(x) * sin_signed``; with
  ``sin_signed = cat(-sin, sin)`` it equals ``x * cos + rotate_half(x) * sin`` bit for bit
  (negation is exact).
"""

from __future__ import annotations

from typing import Optional, Sequence

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


class RopeTable:
    """cos / signed-sin tables [P, hd] for positions 0..P-1 in one dtype on one device, grown (by
    doubling) when a forward reaches past them. Values are the reference's: ``cos(p * inv_freq)``
    of the float32 angle, then cast to ``dtype`` (LLaDA's float32 rotation keeps float32)."""

    def __init__(self, head_dim: int, theta: float) -> None:
        self.head_dim, self.theta = head_dim, theta
        self._tables: dict[tuple[torch.device, torch.dtype], torch.Tensor] = {}  # -> [P, 2, hd]

    def _build(self, length: int, device: torch.device, dtype: torch.dtype) -> torch.Tensor:
        from dllm.models.transformer import rope_cos_sin

        positions = torch.arange(length, device=device)[None]  # [1, P]
        cos, sin = rope_cos_sin(positions, self.head_dim, self.theta)  # [1, 1, P, hd] float32
        half = self.head_dim // 2
        signed = torch.cat((-sin[..., :half], sin[..., half:]), dim=-1)
        return torch.stack((cos[0, 0], signed[0, 0]), dim=1).to(dtype)  # [P, 2, hd]

    def lookup(self, positions: torch.Tensor, dtype: torch.dtype, max_position: int) -> torch.Tensor:
        """positions [B, T] long -> [B, T, 2, 1, hd] (cos, signed sin; a head axis to broadcast over).
        ``max_position`` is a bound the caller knows without reading ``positions`` (no host sync)."""
        key = (positions.device, dtype)
        table = self._tables.get(key)
        if table is None or table.shape[0] <= max_position:
            length = max(64, 1 << max_position.bit_length())
            table = self._build(length, positions.device, dtype)
            self._tables[key] = table
        return table[positions].unsqueeze(3)  # [B, T, 2, 1, hd]


def rope_rows(x: torch.Tensor, cos_sin: torch.Tensor, *, fp32: bool) -> torch.Tensor:
    """Rotate x [B, T, H', hd] (q and k heads side by side) by ``cos_sin`` [B, T, 2, 1, hd]
    (``RopeTable.lookup``). fp32: rotate in float32 and cast back (LLaDA); else in x's dtype."""
    cos, sin = cos_sin[:, :, 0], cos_sin[:, :, 1]  # [B, T, 1, hd]
    half = x.shape[-1] // 2
    if fp32 and x.dtype != torch.float32:
        x32 = x.float()
        return (x32 * cos + x32.roll(half, dims=-1) * sin).to(x.dtype)
    return x * cos + x.roll(half, dims=-1) * sin


class FusedWeight:
    """One weight matrix [sum(out), in] (and bias) made of several ``nn.Linear`` layers' weights,
    whose parameters are re-pointed to slices of it (they share its memory)."""

    def __init__(self, linears: Sequence[nn.Linear]) -> None:
        self.linears = tuple(linears)
        with torch.no_grad():
            self.weight = torch.cat([lin.weight.detach() for lin in linears])  # [N, D]
            has_bias = [lin.bias is not None for lin in linears]
            self.bias: Optional[torch.Tensor] = None
            if any(has_bias):
                self.bias = torch.cat([lin.bias.detach() if lin.bias is not None else  # type: ignore[union-attr]
                                       lin.weight.new_zeros(lin.out_features) for lin in linears])
            start = 0
            for lin in linears:
                end = start + lin.out_features
                lin.weight.data = self.weight[start:end]
                if lin.bias is not None and self.bias is not None:
                    lin.bias.data = self.bias[start:end]
                start = end
        self._ptrs = self._pointers()

    def _pointers(self) -> tuple[int, ...]:
        out = []
        for lin in self.linears:
            out.append(lin.weight.data_ptr())
            out.append(-1 if lin.bias is None else lin.bias.data_ptr())
        return tuple(out)

    def valid(self) -> bool:
        """The projections still read this memory (no parameter was replaced since fusing)."""
        return self._pointers() == self._ptrs


def fusable(linears: Sequence[nn.Module]) -> bool:
    """Plain ``nn.Linear`` layers with floating weights on one device and dtype, no hooks."""
    first = linears[0]
    if not all(type(lin) is nn.Linear for lin in linears):
        return False
    w = first.weight
    return all(type(lin.weight.data) is torch.Tensor  # not a quantized tensor subclass
               and (lin.bias is None or type(lin.bias.data) is torch.Tensor)
               and lin.weight.dtype == w.dtype and lin.weight.device == w.device and w.is_floating_point()
               and not lin._forward_hooks and not lin._forward_pre_hooks for lin in linears)


__all__ = ["FusedWeight", "RopeTable", "fusable", "rms_norm_one_op", "rms_norm_reference", "rope_rows"]
