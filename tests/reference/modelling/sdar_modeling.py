"""Reference transcription of SDAR's inference modelling (JetAstra/SDAR
``training/model/SDAR-4B-Chat/modeling_sdar.py`` and ``configuration_sdar.py``), restated from the
public code for ``dllm``'s tests; no code copied. Test-only: the official file imports flash_attn,
einops and liger_kernel, so it cannot be imported on a CPU machine.

Kept as in the original (what can change a logit):

* ``SDARForCausalLM`` -> ``SDARModel`` (``embed_tokens``, ``layers``, ``norm``) + ``lm_head``; the
  checkpoint key names are the official ones (``model.layers.{i}.self_attn.q_norm.weight`` ...);
* RMSNorm as it runs: ``SDARRMSNorm.forward`` calls flash_attn's Triton ``rms_norm_fn``
  (``flash_attn/ops/triton/layer_norm.py``), which loads x and the weight as float32, computes
  ``x * rstd * w`` in float32 and rounds once when it stores the output (``RefRMSNorm(round_once=
  True)``); the eager form left commented in the file (cast back, then multiply by the weight,
  two roundings) is what Qwen2-style models run (Fast-dLLM v2 reuses it with ``round_once=False``);
* attention: ``q_norm`` / ``k_norm`` on ``q_proj(x).view(B, T, H, hd)`` BEFORE the transpose and
  RoPE; rotate-half RoPE with ``inv_freq = 1 / theta^(arange(0, hd, 2) / hd)``, angles from the
  matmul ``inv_freq[:, None] @ positions[None]`` in float32, cos/sin cast to the activation dtype;
* the KV cache of ``generate.py``: ``store_kv=True`` appends the fresh (rotated) K/V of the forward
  to the layer's cache and attends to the result; ``store_kv=False`` attends to ``cat(cache,
  fresh)`` without storing;
* the mask is the caller's (``attention_mask.bool()``, [1, T, K] or [B, 1, T, K]); a partly False
  mask goes to ``F.scaled_dot_product_attention(..., attn_mask=mask, enable_gqa=True,
  scale=hd ** -0.5)``.

Differences, inert for what is tested:

* an all-True mask takes ``flash_attn_func(..., causal=False)`` in the original (the decoding
  path); here it takes the same SDPA call without a mask (flash_attn has no CPU kernel). The two
  compute the same attention up to float summation order, which is what a GPU run of the original
  gives as well;
* ``rms_norm_fn`` is a GPU-only Triton kernel; its arithmetic is restated in PyTorch (above);
* training-only paths (flex attention, the noising and the fused loss), sliding windows and
  ``rope_scaling`` (null in every released config) are omitted;
* the config is a plain dict (the checkpoint's config.json) instead of ``SDARConfig``.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Optional

import torch
import torch.nn as nn
import torch.nn.functional as F


class RefRMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float, round_once: bool = False) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))
        self.variance_epsilon = eps
        self.round_once = round_once

    def forward(self, hidden_states: torch.Tensor) -> torch.Tensor:
        input_dtype = hidden_states.dtype
        hidden_states = hidden_states.to(torch.float32)
        variance = hidden_states.pow(2).mean(-1, keepdim=True)
        hidden_states = hidden_states * torch.rsqrt(variance + self.variance_epsilon)
        if self.round_once:  # flash_attn rms_norm_fn: y = x_hat * w in float32, stored once
            return (hidden_states * self.weight.to(torch.float32)).to(input_dtype)
        return self.weight * hidden_states.to(input_dtype)


def _rotate_half(x: torch.Tensor) -> torch.Tensor:
    half = x.shape[-1] // 2
    return torch.cat((-x[..., half:], x[..., :half]), dim=-1)


class RefRotary(nn.Module):
    def __init__(self, head_dim: int, theta: float) -> None:
        super().__init__()
        exps = torch.arange(0, head_dim, 2, dtype=torch.int64).to(dtype=torch.float) / head_dim
        self.register_buffer("inv_freq", 1.0 / (theta ** exps), persistent=False)

    def forward(self, x: torch.Tensor, position_ids: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        inv = self.inv_freq[None, :, None].float().expand(position_ids.shape[0], -1, 1)
        pos = position_ids[:, None, :].float()
        freqs = (inv @ pos).transpose(1, 2)  # [B, T, hd/2]
        emb = torch.cat((freqs, freqs), dim=-1)
        return emb.cos().to(x.dtype), emb.sin().to(x.dtype)


class RefCache:
    """``transformers.DynamicCache`` as ``generate.py`` uses it: per layer, K/V appended on store."""

    def __init__(self) -> None:
        self.k: list[torch.Tensor] = []
        self.v: list[torch.Tensor] = []

    def __len__(self) -> int:
        return len(self.k)

    def update(self, k: torch.Tensor, v: torch.Tensor, layer: int) -> tuple[torch.Tensor, torch.Tensor]:
        if len(self.k) <= layer:
            self.k.append(k)
            self.v.append(v)
        else:
            self.k[layer] = torch.cat([self.k[layer], k], dim=-2)
            self.v[layer] = torch.cat([self.v[layer], v], dim=-2)
        return self.k[layer], self.v[layer]


class RefAttention(nn.Module):
    def __init__(self, cfg: dict, layer_idx: int) -> None:
        super().__init__()
        self.layer_idx = layer_idx
        self.head_dim = cfg["head_dim"]
        self.scaling = self.head_dim ** -0.5
        d, h, hkv = cfg["hidden_size"], cfg["num_attention_heads"], cfg["num_key_value_heads"]
        bias = cfg.get("attention_bias", False)
        self.q_proj = nn.Linear(d, h * self.head_dim, bias=bias)
        self.k_proj = nn.Linear(d, hkv * self.head_dim, bias=bias)
        self.v_proj = nn.Linear(d, hkv * self.head_dim, bias=bias)
        self.o_proj = nn.Linear(h * self.head_dim, d, bias=bias)
        self.q_norm = RefRMSNorm(self.head_dim, cfg["rms_norm_eps"], round_once=True)
        self.k_norm = RefRMSNorm(self.head_dim, cfg["rms_norm_eps"], round_once=True)

    def forward(self, hidden_states, position_embeddings, attention_mask, past_key_value=None,
                store_kv: bool = False) -> torch.Tensor:
        bsz, q_len = hidden_states.shape[:-1]
        shape = (bsz, q_len, -1, self.head_dim)
        q = self.q_norm(self.q_proj(hidden_states).view(shape)).transpose(1, 2)
        k = self.k_norm(self.k_proj(hidden_states).view(shape)).transpose(1, 2)
        v = self.v_proj(hidden_states).view(shape).transpose(1, 2)
        cos, sin = position_embeddings
        cos, sin = cos.unsqueeze(1), sin.unsqueeze(1)
        q = (q * cos) + (_rotate_half(q) * sin)
        k = (k * cos) + (_rotate_half(k) * sin)
        if past_key_value is not None and store_kv:
            k, v = past_key_value.update(k, v, self.layer_idx)
        elif past_key_value is not None and not store_kv and len(past_key_value) > self.layer_idx:
            k = torch.cat([past_key_value.k[self.layer_idx], k], dim=-2)
            v = torch.cat([past_key_value.v[self.layer_idx], v], dim=-2)
        mask = attention_mask.bool() if attention_mask is not None else None
        if mask is None or bool(torch.all(mask)):  # the original: flash_attn_func(causal=False)
            out = F.scaled_dot_product_attention(q, k, v, is_causal=False, scale=self.scaling, enable_gqa=True)
        else:
            out = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, is_causal=False, scale=self.scaling,
                                                 enable_gqa=True)
        out = out.transpose(1, 2).reshape(bsz, q_len, -1)  # rearrange 'b h l d -> b l (h d)'
        return self.o_proj(out)


class RefMLP(nn.Module):
    def __init__(self, cfg: dict) -> None:
        super().__init__()
        d, f = cfg["hidden_size"], cfg["intermediate_size"]
        self.gate_proj = nn.Linear(d, f, bias=False)
        self.up_proj = nn.Linear(d, f, bias=False)
        self.down_proj = nn.Linear(f, d, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


class RefLayer(nn.Module):
    def __init__(self, cfg: dict, layer_idx: int) -> None:
        super().__init__()
        self.self_attn = RefAttention(cfg, layer_idx)
        self.mlp = RefMLP(cfg)
        self.input_layernorm = RefRMSNorm(cfg["hidden_size"], cfg["rms_norm_eps"], round_once=True)
        self.post_attention_layernorm = RefRMSNorm(cfg["hidden_size"], cfg["rms_norm_eps"], round_once=True)

    def forward(self, h, position_embeddings, attention_mask, past_key_value, store_kv):
        residual = h
        h = residual + self.self_attn(self.input_layernorm(h), position_embeddings, attention_mask,
                                      past_key_value, store_kv)
        residual = h
        return residual + self.mlp(self.post_attention_layernorm(h))


class RefSDARModel(nn.Module):
    def __init__(self, cfg: dict) -> None:
        super().__init__()
        self.embed_tokens = nn.Embedding(cfg["vocab_size"], cfg["hidden_size"])
        self.layers = nn.ModuleList(RefLayer(cfg, i) for i in range(cfg["num_hidden_layers"]))
        self.norm = RefRMSNorm(cfg["hidden_size"], cfg["rms_norm_eps"], round_once=True)
        self.rotary_emb = RefRotary(cfg["head_dim"], float(cfg["rope_theta"]))


class RefOutput:
    def __init__(self, logits: torch.Tensor) -> None:
        self.logits = logits


class RefSDARForCausalLM(nn.Module):
    """The official inference forward: ``model(input_ids, attention_mask, position_ids,
    past_key_values, use_cache, store_kv).logits``."""

    def __init__(self, cfg: dict) -> None:
        super().__init__()
        self.config = cfg
        self.model = RefSDARModel(cfg)
        self.lm_head = nn.Linear(cfg["hidden_size"], cfg["vocab_size"], bias=False)

    @property
    def device(self) -> torch.device:
        return self.lm_head.weight.device

    @torch.no_grad()
    def forward(self, input_ids: torch.Tensor, attention_mask: Optional[torch.Tensor] = None,
                position_ids: Optional[torch.Tensor] = None, past_key_values: Optional[RefCache] = None,
                use_cache: bool = False, store_kv: bool = False) -> RefOutput:
        h = self.model.embed_tokens(input_ids)
        if position_ids is None:
            past = past_key_values.k[0].shape[-2] if past_key_values is not None and len(past_key_values) else 0
            position_ids = torch.arange(past, past + input_ids.shape[1], device=input_ids.device)[None]
        pe = self.model.rotary_emb(h, position_ids)
        for layer in self.model.layers:
            h = layer(h, pe, attention_mask, past_key_values, store_kv)
        return RefOutput(self.lm_head(self.model.norm(h)))

    @classmethod
    def from_pretrained(cls, directory, dtype: torch.dtype = torch.float32) -> "RefSDARForCausalLM":
        """Build from an official-layout directory (config.json + safetensors, one file or shards);
        every checkpoint key must match a parameter and vice versa (strict)."""
        from safetensors.torch import load_file

        directory = Path(directory)
        cfg = json.loads((directory / "config.json").read_text())
        if cfg.get("model_type") != "sdar":
            raise ValueError(f"not an SDAR config: model_type={cfg.get('model_type')!r}")
        model = cls(cfg)
        state: dict[str, torch.Tensor] = {}
        for f in sorted(directory.glob("*.safetensors")):
            state.update(load_file(str(f)))
        if cfg.get("tie_word_embeddings"):
            state.setdefault("lm_head.weight", state["model.embed_tokens.weight"])
        model.load_state_dict(state, strict=True)
        model = model.to(dtype).eval()
        # transformers' from_pretrained(torch_dtype=...) builds the model in that dtype, but the RoPE
        # init computes inv_freq with an explicit .float(): the buffer stays float32 (.to() would round it)
        model.model.rotary_emb.inv_freq = RefRotary(cfg["head_dim"], float(cfg["rope_theta"])).inv_freq
        return model
