"""The math of the DFlash drafter as free functions: RoPE tables, attention masks, round positions.

Used by ``model.py`` (DFlash: arXiv 2602.06036; reference z-lab/dflash ``dflash/model.py``).
Masks and positions are computed from explicit integer positions, so rows of a batch may hold
different numbers of real tokens (padding slots are masked out).
"""

from __future__ import annotations

from typing import Optional

import torch

from dllm.drafters.dflash.config import DFlashConfig
from dllm.models.core.transformer import rope_inv_freq, rotate_half

Rope = tuple[torch.Tensor, torch.Tensor]  # cos, sin [B, 1, T, hd] in the activation dtype


def rope_frequencies(config: DFlashConfig, device: Optional[torch.device] = None) -> tuple[torch.Tensor, float]:
    """(inv_freq [hd/2] float32, cos/sin scale) of the config's RoPE.

    Plain RoPE uses ``1 / theta^(2j/hd)``; scaled variants (linear, yarn, llama3, ...) take their
    frequencies from transformers' ``ROPE_INIT_FUNCTIONS``, as the reference's Qwen3 rotary
    embedding does.
    """
    params = config.rope_dict()
    rope_type = params["rope_type"]
    if rope_type == "default":
        return rope_inv_freq(config.head_dim, config.rope_theta, device), 1.0
    from transformers import Qwen3Config
    from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

    if rope_type not in ROPE_INIT_FUNCTIONS:
        raise ValueError(f"unknown RoPE type {rope_type!r}; transformers knows {sorted(ROPE_INIT_FUNCTIONS)}")
    hf = Qwen3Config(hidden_size=config.hidden_size, num_attention_heads=config.num_heads,
                     head_dim=config.head_dim, max_position_embeddings=config.max_position_embeddings,
                     rope_parameters=params)
    inv_freq, scale = ROPE_INIT_FUNCTIONS[rope_type](hf, device)
    return inv_freq.float(), float(scale)


def rope_tables(positions: torch.Tensor, inv_freq: torch.Tensor, scale: float, dtype: torch.dtype) -> Rope:
    """Integer positions [B, T] -> cos, sin [B, 1, T, hd]: angles in float32, cast to ``dtype``."""
    angles = positions[..., None].float() * inv_freq.to(positions.device)  # [B, T, hd/2]
    emb = torch.cat((angles, angles), dim=-1)[:, None]  # [B, 1, T, hd]
    return (emb.cos() * scale).to(dtype), (emb.sin() * scale).to(dtype)


def apply_rotary(x: torch.Tensor, rope: Rope) -> torch.Tensor:
    """Rotate-half RoPE on x [B, H, T, hd] with cos/sin [B, 1, T, hd] (x's dtype)."""
    cos, sin = rope
    return x * cos + rotate_half(x) * sin


def attention_mask(
    query_pos: torch.Tensor,  # [B, Tq] long
    key_pos: torch.Tensor,  # [B, Tk] long
    key_valid: Optional[torch.Tensor],  # [B, Tk] bool or None (all real)
    *,
    causal: bool,
    window: Optional[int],
) -> Optional[torch.Tensor]:
    """bool [B, 1, Tq, Tk] (True = attend), or None when every query sees every key.

    causal: keys at positions <= the query's; window: |query - key| < window (one-sided when causal).
    """
    if not causal and window is None and key_valid is None:
        return None
    diff = query_pos[:, :, None] - key_pos[:, None, :]  # [B, Tq, Tk]
    visible = torch.ones_like(diff, dtype=torch.bool)
    if causal:
        visible &= diff >= 0
    if window is not None:
        visible &= diff < window
        if not causal:
            visible &= -diff < window
    if key_valid is not None:
        visible &= key_valid[:, None, :]
    return visible[:, None]


def next_positions(
    before: torch.Tensor, n: int, t: int, feature_mask: Optional[torch.Tensor]
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Default positions of a round: N new features continue each row's ``before`` [B] real tokens
    (padding skipped), then the T-token block. -> (real new tokens [B], feature positions [B, N],
    block positions [B, T]); the anchor's position is the row's context length."""
    b = before.shape[0]
    if feature_mask is None:
        added = torch.full((b,), n, dtype=torch.long, device=before.device)
        rank = torch.arange(n, device=before.device).expand(b, n)
    else:
        added = feature_mask.sum(dim=1)
        rank = feature_mask.long().cumsum(dim=1) - 1  # [B, N] index among the row's real features
    block = (before + added)[:, None] + torch.arange(t, device=before.device)
    return added, before[:, None] + rank, block


__all__ = ["Rope", "apply_rotary", "attention_mask", "next_positions", "rope_frequencies", "rope_tables"]
