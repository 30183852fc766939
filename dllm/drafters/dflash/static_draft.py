"""DFlash drafting for one row on a preallocated context K/V buffer (the batch-1 fast path).

``DFlashDrafter.forward`` serves batches: per-row positions, validity masks over padded slots, and a
``DraftKVCache`` that concatenates every layer's stored context K/V with the round's new ones (and
the block's) each round. For one row with every slot real none of that is needed: ``StaticDraft``
runs the same layers (``model.py``: the layer modules themselves for norms, the same
``apply_rotary``; sdpa with GQA inside it where ``sdpa_attention`` expands K/V: the same dot
products) with

- q/k/v of the block in one matmul, k/v of the context in another, gate/up of the MLP in a third
  (the projections' weights stacked on the output dimension: each output is the same dot product);

- one K/V buffer per layer ``[1, Hkv, C, hd]``: a round writes its N new context slots at
  ``[S, S + N)`` and the block's T slots right after them (scratch: the next round's context
  overwrites them, as the reference crops its cache back to the context after the draft forward);
  attention reads ``[0, S + N + T)``, a view. C doubles (one copy) when a call outgrows it;
- RoPE tables for positions ``0..C-1`` from the model's own ``_rope_tables`` (an elementwise
  function of the position, so a slice equals the per-round tables);
- no attention mask: every key is real and DFlash's block attends to all of them (a drafter whose
  layers are causal or windowed does not take this path: ``static_draft_issue``).

Used by ``DFlashSession`` when the loop passes one row without feature masks (``fast_path/fast_loop.py``),
for DFlash and DFlare drafters (DFlare: each layer's own context, through its own context K/V rows).
Tokens and acceptance equal the general path's (``tests/drafters/fast_path/test_fast_loop.py``).
"""

from __future__ import annotations

from typing import Optional

import torch
import torch.nn as nn
import torch.nn.functional as F

from dllm.drafters.dflash.dflare.model import DFlareDrafter
from dllm.drafters.dflash.model import DFlashDrafter, DraftBlock
from dllm.drafters.dflash.ops import apply_rotary
from dllm.drafters.fast_path.static_target import plain_linear
from dllm.models.core.transformer import rms_norm

MIN_CAPACITY = 256  # slots allocated at the first round (doubled when outgrown)


def static_draft_issue(model: DFlashDrafter) -> Optional[str]:
    """None when ``model`` can draft on ``StaticDraft``; else the reason."""
    if type(model) not in (DFlashDrafter, DFlareDrafter):
        return f"{type(model).__name__} (the static path drafts plain DFlash and DFlare checkpoints)"
    cfg = model.config
    fused = [m for layer in model.layers for m in (layer.self_attn.q_proj, layer.self_attn.k_proj,
                                                    layer.self_attn.v_proj, layer.mlp.gate_proj, layer.mlp.up_proj)]
    if isinstance(model, DFlareDrafter):
        fused += [m for layer in model.layers for m in (layer.self_attn.k_proj_target, layer.self_attn.v_proj_target)]
    if not all(plain_linear(m) for m in fused):
        return "projections that are not plain nn.Linear (quantized weights)"
    if cfg.attention_bias:
        return "attention biases (the static path fuses bias-free projections)"
    if any(cfg.layer_causal(i) or cfg.layer_window(i) is not None for i in range(cfg.num_layers)):
        return "causal or sliding-window draft layers (the static path attends to every key)"
    return None


def _norm(norm: nn.Module, x: torch.Tensor) -> torch.Tensor:
    """An ``RMSNorm`` module's forward without the module call (``models.core.transformer.rms_norm``)."""
    return rms_norm(x, norm.weight, norm.eps)


class StaticDraft:
    """One call's batch-1 DFlash drafting state (module docstring)."""

    def __init__(self, model: DFlashDrafter) -> None:
        issue = static_draft_issue(model)
        if issue is not None:
            raise ValueError(f"StaticDraft cannot draft with {issue}")
        self.model = model
        cfg = model.config
        self.heads, self.kv_heads, self.head_dim = cfg.num_heads, cfg.num_kv_heads, cfg.head_dim
        self.keys: list[torch.Tensor] = []
        self.values: list[torch.Tensor] = []
        self.cos = self.sin = None  # [1, 1, C, hd]
        self.capacity = 0
        self.stored = 0  # S: context slots held (positions 0..S-1)
        self.qkv = [torch.cat([l.self_attn.q_proj.weight, l.self_attn.k_proj.weight, l.self_attn.v_proj.weight])
                    for l in model.layers]  # [(H + 2 Hkv) hd, D] per layer
        # the context's k/v rows [2 Hkv hd, D]: the block's own (DFlash) or the layer's target projections (DFlare)
        self.ctx_kv = [torch.cat([l.self_attn.k_proj_target.weight, l.self_attn.v_proj_target.weight])
                       if isinstance(model, DFlareDrafter) else w[self.heads * self.head_dim:]
                       for l, w in zip(model.layers, self.qkv)]
        self.gate_up = [torch.cat([l.mlp.gate_proj.weight, l.mlp.up_proj.weight]) for l in model.layers]  # [2 I, D]

    def _reserve(self, needed: int, device: torch.device, dtype: torch.dtype) -> None:
        if needed <= self.capacity:
            return
        cap = max(MIN_CAPACITY, self.capacity)
        while cap < needed:
            cap *= 2
        shape = (1, self.kv_heads, cap, self.head_dim)
        keys = [torch.zeros(shape, device=device, dtype=dtype) for _ in self.model.layers]
        values = [torch.zeros(shape, device=device, dtype=dtype) for _ in self.model.layers]
        for new, old in zip(keys + values, self.keys + self.values):
            new[:, :, :self.stored] = old[:, :, :self.stored]
        self.keys, self.values, self.capacity = keys, values, cap
        self.cos, self.sin = self.model._rope_tables(torch.arange(cap, device=device)[None, :], dtype)

    @torch.no_grad()
    def draft(self, features: torch.Tensor, block_ids: torch.Tensor, embed: torch.Tensor, lm_head) -> DraftBlock:
        """features [1, N, L*D]: the tapped target states of the N tokens committed since the last
        round (positions S..S+N-1); block_ids [1, T] = [anchor, MASK x (T-1)] at positions S+N..S+N+T-1
        (the anchor has no features yet). Returns tokens / logits / hidden of block positions 1..T-1."""
        model, cfg = self.model, self.model.config
        n, t = features.shape[1], block_ids.shape[1]
        s, mid, end = self.stored, self.stored + n, self.stored + n + t
        dtype = model.dtype
        self._reserve(end, block_ids.device, dtype)
        h = F.embedding(block_ids, embed)  # [1, T, D]
        if cfg.input_embedding_scale != 1.0:
            h = h * cfg.input_embedding_scale
        h = h.to(dtype)
        contexts = model.layer_contexts(features)  # per layer [1, N, D] (DFlash: one shared)
        rope = (self.cos[:, :, s:end], self.sin[:, :, s:end])  # type: ignore[index]  # context then block
        hq, hk = self.heads, self.kv_heads
        for i, layer in enumerate(model.layers):
            attn = layer.self_attn
            x = _norm(layer.input_layernorm, h)  # [1, T, D]
            # q/k/v of the block and k/v of the context: one matmul each (fused output rows)
            qkv = F.linear(x, self.qkv[i]).view(1, t, hq + 2 * hk, self.head_dim)  # [1, T, H + 2 Hkv, hd]
            kv = F.linear(contexts[i], self.ctx_kv[i]).view(1, n, 2 * hk, self.head_dim)
            q = _norm(attn.q_norm, qkv[:, :, :hq]).transpose(1, 2)  # [1, H, T, hd]
            k = _norm(attn.k_norm, torch.cat([kv[:, :, :hk], qkv[:, :, hq:hq + hk]], dim=1)).transpose(1, 2)  # [1, Hkv, N+T, hd]
            v = torch.cat([kv[:, :, hk:], qkv[:, :, hq + hk:]], dim=1).transpose(1, 2)
            q = apply_rotary(q, (rope[0][:, :, n:], rope[1][:, :, n:]))
            keys, values = self.keys[i], self.values[i]
            keys[:, :, s:end] = apply_rotary(k, rope)  # context slots, then the block's (scratch)
            values[:, :, s:end] = v
            out = F.scaled_dot_product_attention(q, keys[:, :, :end], values[:, :, :end],
                                                 enable_gqa=hq != hk)  # [1, H, T, hd]; sdpa_attention's math
            out = out.transpose(1, 2).reshape(1, t, hq * self.head_dim)
            h = h + attn.o_proj(out)
            mlp = layer.mlp  # DFlashMLP with gate and up in one matmul
            gate, up = F.linear(_norm(layer.post_attention_layernorm, h), self.gate_up[i]).chunk(2, dim=-1)
            h = h + mlp.down_proj(mlp.act(gate) * up)
        self.stored = mid
        hidden = _norm(model.norm, h)[:, 1:]  # [1, T-1, D]
        logits = model.compute_logits(hidden, lm_head)  # [1, T-1, V]
        return DraftBlock(tokens=logits.argmax(dim=-1), logits=logits, hidden=hidden)


__all__ = ["MIN_CAPACITY", "StaticDraft", "static_draft_issue"]
