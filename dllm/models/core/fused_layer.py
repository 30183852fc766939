"""The fused inference layer's two halves, as plain functions over what one layer's fused path reads.

``TransformerBlock`` keeps its module-by-module path as the reference; its fused path
(``Transformer.fused_layers``) runs ``fused_qkv_rows`` and ``fused_residual_out`` here on a
``FusedLayer``: the layer's modules and fused weights gathered once. The functions read parameters
from the modules' ``_parameters`` and plain attributes (never ``nn.Module.__getattr__``, a Python
call per read) and call no module but a hooked or replaced projection, because on a GPU a cached step's
layer is bound by the Python around its ~14 launches. The same values as the reference, bit for
bit off CUDA (tests/models/core/test_fused.py).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

import torch
import torch.nn as nn
import torch.nn.functional as F

from dllm.kernels.fused_ops import rope_rows as op_rope_rows
from dllm.kernels.layer_ops import rope_rows, rope_rows_pair
from dllm.models.core.fused import FusedWeight, linear_or_module
from dllm.models.core.norm import RMSNorm, fused_norm, qk_norms_fused


@dataclass(frozen=True)
class FusedLayer:
    """What one layer's fused path reads, gathered once (``Transformer.fused_layers``): the q/k/v and
    gate/up ``FusedWeight``, whether norms and RoPE run as the one-launch operators, the layer's
    modules, and the output and down projections' weights when they may run as ``F.linear`` (None:
    their modules are called; ``linear_or_module`` checks their hooks and weights at every call)."""

    qkv: FusedWeight
    gate_up: Optional[FusedWeight]  # None: an MoE feed-forward, run as its module
    ops: bool
    attn: nn.Module  # the layer's Attention (head counts, q/k norms)
    mlp: nn.Module  # its MLP or SparseMoE
    attn_norm: RMSNorm
    mlp_norm: RMSNorm
    o_proj: nn.Linear
    down_proj: Optional[nn.Linear]  # None with an MoE feed-forward
    o_weight: Optional[torch.Tensor] = None
    down_weight: Optional[torch.Tensor] = None


def fused_qkv_rows(p: FusedLayer, h: torch.Tensor, cos: torch.Tensor, sin: Optional[torch.Tensor] = None
                   ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The attention norm, q/k/v in one matmul and one rotation of q and k together: h [B, T, D] ->
    q [B, H, T, hd], k and v [B, Hkv, T, hd] (strided views). ``cos``, ``sin``: the RoPE table's cos
    and signed sin [B, T, 1, hd] (``Transformer.forward`` unbinds the table once for every layer); with
    ``sin`` None, ``cos`` is the whole table [B, T, 2, 1, hd] (``RopeTable.lookup``), which the
    one-launch ``dllm::rope_rows`` takes."""
    attn = p.attn
    b, t, _ = h.shape
    nh, nk, hd = attn.n_heads, attn.n_kv_heads, attn.head_dim
    w = p.qkv
    qkv = F.linear(fused_norm(p.attn_norm, h, p.ops), w.weight, w.bias).view(b, t, nh + 2 * nk, hd)  # [B, T, H + 2Hkv, hd]
    if attn.qk_norm:
        qk = qk_norms_fused(attn.q_norm, attn.k_norm, qkv, nh, nk, p.ops)  # [B, T, H + Hkv, hd]
    else:
        qk = qkv[:, :, :nh + nk]
    rd, fp32 = cos.shape[-1], attn.rope_fp32
    if rd < hd:  # partial rotary (LLaDA 2.x): the first rd channels turn, the rest pass
        turned = rope_rows(qk[..., :rd], cos, fp32=fp32) if sin is None else rope_rows_pair(qk[..., :rd], cos, sin,
                                                                                            fp32=fp32)
        qk = torch.cat((turned, qk[..., rd:]), dim=-1)
    elif sin is None:
        qk = (op_rope_rows if p.ops else rope_rows)(qk, cos, fp32=fp32)
    else:
        qk = rope_rows_pair(qk, cos, sin, fp32=fp32)
    q, k = qk.transpose(1, 2).split_with_sizes([nh, nk], dim=1)  # [B, H|Hkv, T, hd]
    return q, k, qkv[:, :, nh + nk:].transpose(1, 2)


def fused_residual_out(p: FusedLayer, h: torch.Tensor, out: torch.Tensor) -> torch.Tensor:
    """h [B, T, D], attention output [B, H, T, hd] -> the layer's output [B, T, D]: the output
    projection and residual, the MLP norm, one gate-up matmul, SiLU times up, down and residual."""
    b, _, t, _ = out.shape
    h = h + linear_or_module(p.o_proj, p.o_weight, out.transpose(1, 2).reshape(b, t, -1))  # [B, T, D]
    x = fused_norm(p.mlp_norm, h, p.ops)
    if p.gate_up is None:  # an MoE feed-forward (LLaDA 2.x): its module
        return h + p.mlp(x)
    gate, up = F.linear(x, p.gate_up.weight).chunk(2, dim=-1)  # [B, T, F] each (views)
    return h + linear_or_module(p.down_proj, p.down_weight, F.silu(gate).mul_(up))


__all__ = ["FusedLayer", "fused_qkv_rows", "fused_residual_out"]
