"""A batch-1 forward of a transformers Qwen3 / Qwen2 / Llama target over a preallocated KV buffer.

The speculative loop at batch 1 (``fast_loop.py``) spends most of a round in the target's forward,
and at small shapes most of that is per-call Python: transformers' output capturing, mask building
(``create_causal_mask``), the rotary module, the ``DynamicCache`` that concatenates every layer's K/V
each round and is cropped after each rejection. ``StaticTarget`` runs the same decoder math on the
model's own modules' weights, op for op as transformers' modelling files do
(``transformers/models/qwen3/modeling_qwen3.py``: ``Qwen3RMSNorm``, ``apply_rotary_pos_emb``,
``repeat_kv`` + ``sdpa_attention_forward``, ``Qwen3MLP``), with

- one K/V buffer per layer ``[1, Hkv, L, hd]`` allocated once per call (L = prompt + new tokens + a
  block): a forward writes its T slots at ``[start, start + T)``; rolling back a rejection is only
  the caller's next ``start`` (slots past it are overwritten before they are read, and never read
  before: the causal mask stops at the query's own slot);
- the rotary tables for positions ``0..L-1`` computed once by the model's own rotary module (an
  elementwise function of the position, so a slice equals the per-call computation);
- the causal mask of a block at ``start`` a slice of one lower-triangular [L, L] matrix.

Tapped hidden states follow transformers' ``output_hidden_states``: ``hidden_states[i + 1]`` is
decoder layer i's output, and the last entry is the final-norm output (``capture_outputs``'
``tie_last_hidden_states``). ``static_target_issue`` says why a model cannot run here (then the loop
keeps the general path); ``tests/drafters/fast_path/test_fast_loop.py`` compares both paths token for token.
"""

from __future__ import annotations

from typing import Optional

import torch
import torch.nn as nn
import torch.nn.functional as F

ARCHITECTURES = ("qwen3", "qwen2", "llama")


def plain_linear(m) -> bool:
    """An ``nn.Linear`` holding ordinary tensors: a quantized weight (torchao keeps the module an
    ``nn.Linear`` and swaps its weight for a tensor subclass) cannot be concatenated into a fused one."""
    if type(m) is not nn.Linear:
        return False
    return all(t is None or type(t.data) is torch.Tensor for t in (m.weight, m.bias))


def static_target_issue(model) -> Optional[str]:
    """None when ``model`` runs on ``StaticTarget`` exactly as transformers runs it; else the reason."""
    cfg = getattr(model, "config", None)
    kind = getattr(cfg, "model_type", None)
    if kind not in ARCHITECTURES:
        return f"model_type {kind!r} (static forward: {', '.join(ARCHITECTURES)})"
    if getattr(cfg, "_attn_implementation", None) != "sdpa":
        return f"attention implementation {getattr(cfg, '_attn_implementation', None)!r} (static forward: sdpa)"
    if getattr(cfg, "hidden_act", None) != "silu" or getattr(cfg, "pretraining_tp", 1) != 1:
        return "an activation other than silu, or pretraining_tp > 1"
    if getattr(cfg, "use_sliding_window", False) or any(t != "full_attention" for t in getattr(cfg, "layer_types", None) or ()):
        return "sliding-window layers"
    rope = getattr(cfg, "rope_parameters", None) or getattr(cfg, "rope_scaling", None) or {}
    if rope.get("rope_type", rope.get("type", "default")) != "default":
        return f"rope type {rope.get('rope_type', rope.get('type'))!r} (static forward: default)"
    inner = getattr(model, "model", None)
    layers = getattr(inner, "layers", None)
    if layers is None or not hasattr(inner, "rotary_emb") or not isinstance(getattr(model, "lm_head", None), nn.Linear):
        return "not a decoder-only model with model.layers, model.rotary_emb and an nn.Linear lm_head"
    if type(inner.embed_tokens) is not nn.Embedding or getattr(cfg, "final_logit_softcapping", None):
        return "a custom embedding or logit soft-capping"
    names = ("q_proj", "k_proj", "v_proj", "o_proj")
    for layer in layers:
        attn, mlp = layer.self_attn, layer.mlp
        if not all(plain_linear(getattr(attn, n, None)) for n in names) or \
                not all(plain_linear(getattr(mlp, n, None)) for n in ("gate_proj", "up_proj", "down_proj")):
            return "projections that are not plain nn.Linear (quantized or adapted weights)"
        if (getattr(attn, "q_norm", None) is None) != (kind != "qwen3"):
            return "q_norm / k_norm where the architecture has none (or missing)"
    return None


def _rms_norm(norm: nn.Module, x: torch.Tensor) -> torch.Tensor:
    """``Qwen3RMSNorm`` / ``LlamaRMSNorm`` forward, op for op."""
    dtype = x.dtype
    h = x.to(torch.float32)
    variance = h.pow(2).mean(-1, keepdim=True)
    h = h * torch.rsqrt(variance + norm.variance_epsilon)
    return norm.weight * h.to(dtype)


def _normalize(x: torch.Tensor, eps: float) -> torch.Tensor:
    """The weight-free part of ``Qwen3RMSNorm`` for float32 x (its casts are then no-ops)."""
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps)


def _rotate_half(x: torch.Tensor) -> torch.Tensor:
    half = x.shape[-1] // 2
    return torch.cat((-x[..., half:], x[..., :half]), dim=-1)


class StaticTarget:
    """One call's batch-1 forward state: K/V buffers, rotary tables, the causal mask (module docstring)."""

    @torch.no_grad()  # fused weights and tables are constants of the call, never part of a graph
    def __init__(self, model, taps: tuple[int, ...], length: int) -> None:
        issue = static_target_issue(model)
        if issue is not None:
            raise ValueError(f"StaticTarget cannot run {type(model).__name__}: {issue}")
        cfg = model.config
        self.model, self.inner, self.taps, self.length = model, model.model, tuple(taps), int(length)
        self.layers = list(self.inner.layers)[:cfg.num_hidden_layers]
        self.qk_norm = cfg.model_type == "qwen3"
        self.heads = cfg.num_attention_heads
        self.kv_heads = cfg.num_key_value_heads
        self.head_dim = getattr(cfg, "head_dim", None) or cfg.hidden_size // cfg.num_attention_heads
        self.groups = self.heads // self.kv_heads
        self.scaling = self.layers[0].self_attn.scaling
        weight = model.lm_head.weight
        device, dtype = weight.device, self.inner.embed_tokens.weight.dtype
        shape = (1, self.kv_heads, self.length, self.head_dim)
        self.keys = [torch.zeros(shape, device=device, dtype=dtype) for _ in self.layers]
        self.values = [torch.zeros(shape, device=device, dtype=dtype) for _ in self.layers]
        positions = torch.arange(self.length, device=device)[None, :]  # [1, L]
        probe = torch.zeros((), device=device, dtype=dtype)
        cos, sin = self.inner.rotary_emb(probe, positions)  # [1, L, hd]: the model's own rotary module
        self.cos, self.sin = cos[:, None], sin[:, None]  # [1, 1, L, hd]
        self.causal = torch.ones((self.length, self.length), dtype=torch.bool, device=device).tril()  # [L, L]
        self.tap_set = {i: n for n, i in enumerate(self.taps)}
        # fused weights (one matmul where transformers runs three, or two); rows of a matmul are independent
        # dot products over the same inputs, so every output is the unfused one (tests check it bit for bit)
        self.fp32 = dtype == torch.float32
        self.qkv = [_fused([l.self_attn.q_proj, l.self_attn.k_proj, l.self_attn.v_proj]) for l in self.layers]
        self.gate_up = [_fused([l.mlp.gate_proj, l.mlp.up_proj]) for l in self.layers]
        if self.qk_norm:  # q_norm's weight on the query heads, k_norm's on the key heads: [H + Hkv, hd]
            self.qk_weight = [torch.cat([l.self_attn.q_norm.weight.expand(self.heads, -1),
                                         l.self_attn.k_norm.weight.expand(self.kv_heads, -1)]) for l in self.layers]

    def forward(self, ids: torch.Tensor, start: int, *,
                last_only: bool = False) -> tuple[torch.Tensor, Optional[torch.Tensor]]:
        """ids [1, T] at positions (= slots) ``start .. start + T - 1`` -> (logits [1, T, V] (``[1, 1, V]``
        with ``last_only``), tapped hidden states [1, T, len(taps) * D] or None). Writes the T slots."""
        t = ids.shape[1]
        end = start + t
        if end > self.length:
            raise ValueError(f"StaticTarget holds {self.length} slots; a forward to slot {end} does not fit")
        x = self.inner.embed_tokens(ids)  # [1, T, D] (the module: its hooks see every forward, as in transformers)
        cos, sin = self.cos[:, :, start:end], self.sin[:, :, start:end]  # [1, 1, T, hd]
        mask = self.causal[start:end, :end][None, None]  # [1, 1, T, end]
        taps: list[Optional[torch.Tensor]] = [None] * len(self.taps)
        last = len(self.layers) - 1
        for i, layer in enumerate(self.layers):
            x = self._layer(i, layer, x, cos, sin, mask, start, end)
            if i in self.tap_set and i != last:
                taps[self.tap_set[i]] = x
        x = self._norm(self.inner.norm, x)
        if last in self.tap_set:
            taps[self.tap_set[last]] = x  # transformers ties the last hidden state to the final-norm output
        logits = self.model.lm_head(x[:, -1:] if last_only else x)
        hidden = torch.cat(taps, dim=-1) if taps else None  # type: ignore[arg-type]
        return logits, hidden

    def _layer(self, i: int, layer: nn.Module, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor,
               mask: torch.Tensor, start: int, end: int) -> torch.Tensor:
        attn, mlp = layer.self_attn, layer.mlp
        norm = self._norm
        h = norm(layer.input_layernorm, x)  # [1, T, D]
        if x.shape[1] == 1:  # one query row: a fused matrix-vector product rounds unlike the three
            # separate ones transformers runs (a 2e-5 near-tie flipped on tiny-ar), so run those
            qkv = torch.cat([attn.q_proj(h), attn.k_proj(h), attn.v_proj(h)], dim=-1)
            qkv = qkv.view(*h.shape[:-1], -1, self.head_dim)  # [1, 1, H + 2 Hkv, hd]
        else:
            qkv = F.linear(h, *self.qkv[i]).view(*h.shape[:-1], -1, self.head_dim)  # [1, T, H + 2 Hkv, hd]
        nq = self.heads + self.kv_heads
        qk, v = qkv[:, :, :nq], qkv[:, :, nq:]
        if self.qk_norm:  # q_norm and k_norm in one pass: the same per-head arithmetic
            eps = attn.q_norm.variance_epsilon
            if self.fp32 and eps == attn.k_norm.variance_epsilon:
                qk = self.qk_weight[i] * _normalize(qk, eps)
            else:
                qk = torch.cat([_rms_norm(attn.q_norm, qk[:, :, :self.heads]),
                                _rms_norm(attn.k_norm, qk[:, :, self.heads:])], dim=2)
        qk = qk.transpose(1, 2)  # [1, H + Hkv, T, hd]
        qk = (qk * cos) + (_rotate_half(qk) * sin)  # RoPE on queries and keys at once
        q, k = qk[:, :self.heads], qk[:, self.heads:]
        self.keys[i][:, :, start:end] = k
        self.values[i][:, :, start:end] = v.transpose(1, 2)
        keys, values = self.keys[i][:, :, :end], self.values[i][:, :, :end]  # [1, Hkv, end, hd]
        # GQA inside sdpa: the same dot products as transformers' repeat_kv copies (tests: bit for bit)
        out = F.scaled_dot_product_attention(q, keys, values, attn_mask=mask, dropout_p=0.0, scale=self.scaling,
                                             enable_gqa=self.groups > 1)
        out = out.transpose(1, 2).reshape(*x.shape[:-1], -1)
        x = x + attn.o_proj(out)
        h = norm(layer.post_attention_layernorm, x)
        if x.shape[1] == 1:  # as q/k/v above
            gate, up = mlp.gate_proj(h), mlp.up_proj(h)
        else:
            gate, up = F.linear(h, *self.gate_up[i]).chunk(2, dim=-1)
        return x + mlp.down_proj(F.silu(gate) * up)

    def _norm(self, norm: nn.Module, x: torch.Tensor) -> torch.Tensor:
        return norm.weight * _normalize(x, norm.variance_epsilon) if self.fp32 else _rms_norm(norm, x)


def _fused(linears: list[nn.Linear]) -> tuple[torch.Tensor, Optional[torch.Tensor]]:
    """(weight, bias) of several nn.Linear on the same input stacked on the output dimension."""
    weight = torch.cat([m.weight for m in linears])
    biases = [m.bias for m in linears]
    if all(b is None for b in biases):
        return weight, None
    return weight, torch.cat([b if b is not None else weight.new_zeros(m.out_features) for b, m in zip(biases, linears)])


__all__ = ["ARCHITECTURES", "StaticTarget", "static_target_issue"]
