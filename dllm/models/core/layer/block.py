"""One pre-norm transformer layer of ``dllm.models.core.transformer`` (``TransformerBlock``: its
``Attention`` weights, the SwiGLU ``MLP``) and the attention masks the model builds for it
(``block_causal_mask``, ``combine_masks``).

The projection (``Attention.qkv``) is split from the attention itself: a cached forward's layer hands
its fresh (rotated) k/v to the cache view between the two (``KVAttend``), and the layer's two halves
(``TransformerBlock.qkv_rows``, ``residual_out``) are pure functions of their inputs, which
``dllm.models.core.compile`` compiles; with fused weights they run ``dllm.models.core.layer.fused``.
"""

from __future__ import annotations

from typing import Callable, Optional

import torch
import torch.nn as nn
import torch.nn.functional as F

from dllm.kernels.attention import AttentionFn
from dllm.models.core.config import TransformerConfig
from dllm.models.core.layer.fused import FusedLayer, FusedWeight, fused_qkv_rows, fused_residual_out, refused
from dllm.models.core.layer.moe import SparseMoE
from dllm.models.core.layer.norm import RMSNorm
from dllm.models.core.layer.rope import apply_rope

# a cached forward's attention (``CacheView.attend`` of one layer): (q [B, H, T, hd], fresh k and v
# [B, Hkv, T, hd], mask [B, 1, T|1, K] or None, the backend, return_probs) -> (out [B, H, T, hd], probs)
KVAttend = Callable[..., tuple[torch.Tensor, Optional[torch.Tensor]]]


# ----------------------------------------------------------------------------------------------
# Masks (RMSNorm: dllm.models.core.layer.norm; RoPE: dllm.models.core.layer.rope)


def block_causal_mask(q_positions: torch.Tensor, k_positions: torch.Tensor, block_size: int) -> torch.Tensor:
    """Block-causal attention (SDAR, arXiv 2510.06303; official ``block_diffusion_generate`` builds the
    same ``tril(ones(nb, nb))`` repeated per block): query at position p may attend to the key at
    position p' iff ``p' // block_size <= p // block_size``.

    q_positions [B, T], k_positions [B, K] int -> bool [B, 1, T, K] (True = attend).
    """
    qb = torch.div(q_positions, block_size, rounding_mode="floor")  # [B, T]
    kb = torch.div(k_positions, block_size, rounding_mode="floor")  # [B, K]
    return (kb[:, None, :] <= qb[:, :, None])[:, None]


def combine_masks(a: Optional[torch.Tensor], b: torch.Tensor) -> torch.Tensor:
    """Two bool masks broadcastable to [B, 1, T, K] -> their AND (a None = all True)."""
    return b if a is None else a & b


# ----------------------------------------------------------------------------------------------
# Layers


class Attention(nn.Module):
    """Grouped-query self-attention's weights: q/k/v projections (bias iff qkv_bias) with RoPE, and
    o_proj; ``TransformerBlock`` runs the backend between them."""

    def __init__(self, cfg: TransformerConfig) -> None:
        super().__init__()
        self.n_heads, self.n_kv_heads, self.head_dim = cfg.n_heads, cfg.n_kv_heads, cfg.head_dim
        self.rope_fp32 = cfg.rope_fp32
        kv_dim = cfg.n_kv_heads * cfg.head_dim
        q_dim = cfg.n_heads * cfg.head_dim  # d_model unless attn_head_dim says otherwise (Qwen3)
        self.q_proj = nn.Linear(cfg.d_model, q_dim, bias=cfg.qkv_bias)
        self.k_proj = nn.Linear(cfg.d_model, kv_dim, bias=cfg.qkv_bias)
        self.v_proj = nn.Linear(cfg.d_model, kv_dim, bias=cfg.qkv_bias)
        self.o_proj = nn.Linear(q_dim, cfg.d_model, bias=False)
        self.qk_norm = cfg.qk_norm
        if cfg.qk_norm:  # Qwen3 / SDAR: RMSNorm over each head's hd channels, before RoPE
            self.q_norm = RMSNorm(cfg.head_dim, cfg.rms_eps, cfg.norm_round_once)
            self.k_norm = RMSNorm(cfg.head_dim, cfg.rms_eps, cfg.norm_round_once)
        self._fused: Optional[FusedWeight] = None

    def fused_qkv(self) -> Optional[FusedWeight]:
        """q/k/v weights as one [H*hd + 2*Hkv*hd, D] matrix (fused on first use, again after a
        parameter was replaced); None when the projections cannot be fused (quantized, hooked)."""
        self._fused = refused(self._fused, (self.q_proj, self.k_proj, self.v_proj))
        return self._fused

    def qkv(
        self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """x [B, T, D] -> rotated q [B, H, T, hd], rotated k [B, Hkv, T, hd], v [B, Hkv, T, hd]."""
        b, t, _ = x.shape
        q = self.q_proj(x).view(b, t, self.n_heads, self.head_dim)
        k = self.k_proj(x).view(b, t, self.n_kv_heads, self.head_dim)
        if self.qk_norm:
            q, k = self.q_norm(q), self.k_norm(k)  # [B, T, H|Hkv, hd], per head
        q, k = q.transpose(1, 2), k.transpose(1, 2)
        v = self.v_proj(x).view(b, t, self.n_kv_heads, self.head_dim).transpose(1, 2)
        q = apply_rope(q, cos, sin, fp32=self.rope_fp32)
        k = apply_rope(k, cos, sin, fp32=self.rope_fp32)
        return q, k, v


class MLP(nn.Module):
    """SwiGLU: down(silu(gate(x)) * up(x)); no biases."""

    def __init__(self, cfg: TransformerConfig) -> None:
        super().__init__()
        self.gate_proj = nn.Linear(cfg.d_model, cfg.mlp_hidden, bias=False)
        self.up_proj = nn.Linear(cfg.d_model, cfg.mlp_hidden, bias=False)
        self.down_proj = nn.Linear(cfg.mlp_hidden, cfg.d_model, bias=False)
        self._fused: Optional[FusedWeight] = None

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # [B, T, D] -> [B, T, D]
        if torch.is_grad_enabled() or self.gate_proj._forward_hooks:
            # the reference: what autograd needs (silu's input kept), and what a forward hook on
            # gate_proj that keeps its output must see unchanged
            return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))
        h = F.silu(self.gate_proj(x), inplace=True)  # [B, T, F]; in place: two fewer [B, T, F] allocations
        return self.down_proj(h.mul_(self.up_proj(x)))  # the same values bit for bit

    def fused_gate_up(self) -> Optional[FusedWeight]:
        """gate and up weights as one [2F, D] matrix (as ``Attention.fused_qkv``)."""
        self._fused = refused(self._fused, (self.gate_proj, self.up_proj))
        return self._fused


class TransformerBlock(nn.Module):
    """One pre-norm layer. Its class name is the unit accelerate must not split across devices."""

    def __init__(self, cfg: TransformerConfig) -> None:
        super().__init__()
        self.attn_norm = RMSNorm(cfg.d_model, cfg.rms_eps, cfg.norm_round_once)
        self.attn = Attention(cfg)
        self.mlp_norm = RMSNorm(cfg.d_model, cfg.rms_eps, cfg.norm_round_once)
        self.mlp = MLP(cfg)

    def fused_weights(self) -> Optional[tuple[FusedWeight, Optional[FusedWeight]]]:
        """(q/k/v, gate/up) fused weights (gate/up None for an MoE feed-forward, which runs as its
        module), or None when this layer must run module by module: projections that cannot be fused,
        another feed-forward, or a norm with hooks (the fused path calls the norms' math, not the
        modules; a hooked module must run as one)."""
        norms = [m for m in self.modules() if isinstance(m, RMSNorm)]
        moe = isinstance(self.mlp, SparseMoE)
        if not (moe or type(self.mlp) is MLP) or any(m._forward_hooks or m._forward_pre_hooks for m in norms):
            return None
        qkv = self.attn.fused_qkv()
        if moe:
            return None if qkv is None else (qkv, None)
        gate_up = self.mlp.fused_gate_up()
        return None if qkv is None or gate_up is None else (qkv, gate_up)

    def forward(
        self,
        h: torch.Tensor,  # [B, T, D]
        cos: torch.Tensor,  # [B, 1, T, hd] float32
        sin: torch.Tensor,
        mask: Optional[torch.Tensor],  # bool [B, 1, T|1, K] or None (K = T without a cache)
        attn_fn: AttentionFn,
        return_probs: bool = False,
        kv_attend: Optional[KVAttend] = None,
        fused: Optional[FusedLayer] = None,
    ) -> tuple[torch.Tensor, Optional[torch.Tensor]]:
        """Two pure halves (``qkv_rows``, ``residual_out``: what ``dllm.models.core.compile`` compiles)
        around the K/V write and the attention backend, which stay eager. ``fused``: the layer's
        fused weights (``Transformer.fused_layers``); ``cos`` and ``sin`` are then the RoPE table's
        rows (``dllm.models.core.layer.rope.RopeTable``) as ``fused_qkv_rows`` takes them."""
        q, k, v = self.qkv_rows(h, cos, sin, fused)
        if kv_attend is not None:  # cached forward: store the fresh rows, attend to the buffer
            out, probs = kv_attend(q, k, v, mask, attn_fn, return_probs)  # [B, H, T, hd]
        else:
            out, probs = attn_fn(q, k, v, mask, return_probs)  # [B, H, T, hd]
        return self.residual_out(h, out, fused), probs

    def qkv_rows(self, h: torch.Tensor, cos: torch.Tensor, sin: Optional[torch.Tensor],
                 fused: Optional[FusedLayer] = None):
        """h [B, T, D] -> rotated q [B, H, T, hd], rotated k and v [B, Hkv, T, hd]."""
        if fused is not None:
            return fused_qkv_rows(fused, h, cos, sin)
        return self.attn.qkv(self.attn_norm(h), cos, sin)

    def residual_out(self, h: torch.Tensor, out: torch.Tensor, fused: Optional[FusedLayer] = None) -> torch.Tensor:
        """h [B, T, D], attention output [B, H, T, hd] -> the layer's output [B, T, D]."""
        if fused is not None:
            return fused_residual_out(fused, h, out)
        b, _, t, _ = out.shape
        h = h + self.attn.o_proj(out.transpose(1, 2).reshape(b, t, -1))  # [B, T, D]
        return h + self.mlp(self.mlp_norm(h))


__all__ = ["MLP", "Attention", "KVAttend", "TransformerBlock", "block_causal_mask", "combine_masks"]
