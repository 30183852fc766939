"""Rotate-half RoPE: the reference (tables per forward, as both official codes compute them) and the
table form of the fused layer (``RopeTable``: cos and signed sin per position, computed once with the
reference formula and gathered by position; the rotation of q and k together, ``rope_rows``, lives in
``dllm.kernels.layer_ops``).
"""

from __future__ import annotations

import torch

from dllm.kernels.layer_ops import rope_rows  # noqa: F401 (the table rotation; re-exported)


def rope_inv_freq(head_dim: int, theta: float, device: torch.device | None = None) -> torch.Tensor:
    """inv_freq[j] = 1 / theta^(2j/hd), j = 0 .. hd/2-1, in float32. Returns [hd/2]."""
    exponents = torch.arange(0, head_dim, 2, dtype=torch.int64, device=device).float() / head_dim
    return 1.0 / (theta ** exponents)


def rope_cos_sin(positions: torch.Tensor, head_dim: int, theta: float) -> tuple[torch.Tensor, torch.Tensor]:
    """cos/sin tables for integer positions [B, T] -> two float32 tensors [B, 1, T, hd].

    Angles are ``p * inv_freq[j]`` in float32 (an exact product, as in both official codes), and
    the last dim is ``cat(angles, angles)`` for the rotate-half layout.
    """
    inv_freq = rope_inv_freq(head_dim, theta, positions.device)  # [hd/2]
    angles = positions.float()[..., None] * inv_freq  # [B, T, hd/2]
    emb = torch.cat((angles, angles), dim=-1)[:, None]  # [B, 1, T, hd]
    return emb.cos(), emb.sin()


def rotate_half(x: torch.Tensor) -> torch.Tensor:
    """[..., hd] -> cat(-x[hd/2:], x[:hd/2])."""
    half = x.shape[-1] // 2
    return torch.cat((-x[..., half:], x[..., :half]), dim=-1)


def apply_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, *, fp32: bool) -> torch.Tensor:
    """Rotate x [B, H, T, hd] by float32 cos/sin [B, 1, T, hd].

    fp32=True (LLaDA ``rope_full_precision``): rotate in float32 and cast back.
    fp32=False (Dream / HF Qwen2): cast cos/sin to x's dtype and rotate in that dtype.
    Partial rotary (LLaDA 2.x): cos/sin narrower than hd rotate x's first channels only.
    """
    rd = cos.shape[-1]
    if rd < x.shape[-1]:  # rotate [..., :rd], pass [..., rd:] through, as the official apply_rotary_pos_emb
        return torch.cat((apply_rope(x[..., :rd], cos, sin, fp32=fp32), x[..., rd:]), dim=-1)
    if fp32:
        x32 = x.float()
        return (x32 * cos + rotate_half(x32) * sin).to(x.dtype)
    cos, sin = cos.to(x.dtype), sin.to(x.dtype)
    return x * cos + rotate_half(x) * sin


class RopeTable:
    """cos / signed-sin tables [P, hd] for positions 0..P-1 in one dtype on one device, grown (by
    doubling) when a forward reaches past them. Values are the reference's: ``cos(p * inv_freq)``
    of the float32 angle, then cast to ``dtype`` (LLaDA's float32 rotation keeps float32). Positions
    must be >= 0: a negative one wraps to the table's end without an error (``lookup``)."""

    def __init__(self, head_dim: int, theta: float) -> None:
        self.head_dim, self.theta = head_dim, theta
        self._tables: dict[tuple[torch.device, torch.dtype], torch.Tensor] = {}  # -> [P, 2, 1, hd]

    def _build(self, length: int, device: torch.device, dtype: torch.dtype) -> torch.Tensor:
        positions = torch.arange(length, device=device)[None]  # [1, P]
        cos, sin = rope_cos_sin(positions, self.head_dim, self.theta)  # [1, 1, P, hd] float32
        half = self.head_dim // 2
        signed = torch.cat((-sin[..., :half], sin[..., half:]), dim=-1)
        return torch.stack((cos[0, 0], signed[0, 0]), dim=1)[:, :, None].to(dtype)  # [P, 2, 1, hd]

    def lookup(self, positions: torch.Tensor, dtype: torch.dtype, max_position: int) -> torch.Tensor:
        """positions [B, T] long (>= 0) -> [B, T, 2, 1, hd] (cos, signed sin; a head axis to broadcast
        over). ``max_position`` is a bound the caller knows without reading ``positions`` (no host
        sync); a CPU tensor's positions past it grow the table too (CPU indexing checks its bounds).

        Negative positions are not RoPE's here: the rows are gathered by plain indexing, which wraps,
        so a position ``-p`` with ``p <= P`` (the table's length, a power of two > ``max_position``)
        silently reads the row of position ``P - p``, on every device; the reference rotation
        (``rope_cos_sin``) turns by the negative angle instead. Refusing them would read the positions
        back every forward (a host sync), so nothing checks: positions reach this table from
        ``Transformer.forward`` (explicit ``positions`` of ``DiffusionLM.forward`` on the fused path),
        and no dllm caller makes a negative one (``default_positions`` clamps a pad's at 0). Only a CPU
        position below ``-P``, which indexing refuses anyway, is named (``ValueError``)."""
        key = (positions.device, dtype)
        table = self._tables.get(key)
        if table is None or table.shape[0] <= max_position:
            table = self._grow(key, max_position)
        try:
            return table[positions]  # [B, T, 2, 1, hd]
        except IndexError:  # a CPU position past the bound (explicit positions): read the largest once
            if positions.device.type != "cpu" or positions.numel() == 0:
                raise
            low = int(positions.min())
            if low < 0:
                raise ValueError(f"RoPE positions must be >= 0, got {low} (the fused path's table has no "
                                 "rows for negative positions)") from None
            return self._grow(key, int(positions.max()))[positions]

    def _grow(self, key: tuple[torch.device, torch.dtype], max_position: int) -> torch.Tensor:
        """The table of ``key`` rebuilt to cover positions 0 .. ``max_position`` (a power of two)."""
        length = max(64, 1 << max_position.bit_length())
        table = self._tables[key] = self._build(length, key[0], key[1])
        return table


__all__ = ["RopeTable", "apply_rope", "rope_cos_sin", "rope_inv_freq", "rope_rows", "rotate_half"]
