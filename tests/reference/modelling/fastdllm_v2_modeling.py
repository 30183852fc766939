"""Reference transcription of Fast-dLLM v2's inference modelling (the HF folder
Efficient-Large-Model/Fast_dLLM_v2_7B, ``modeling.py`` ``Fast_dLLM_QwenForCausalLM`` and
``configuration.py``), restated from the public code for ``dllm``'s tests; no code copied.
Test-only: the official file needs transformers' remote-code machinery, flex attention and einops.

Kept as in the original (what can change a logit or a cache):

* ``Fast_dLLM_QwenForCausalLM`` -> ``model`` (``embed_tokens``, ``layers``, ``norm``) + ``lm_head``,
  the official key names (Qwen2's, with q/k/v biases);
* RMSNorm (float32 normalise, cast back, times the weight); RoPE from ``inv_freq @ positions`` in
  float32, cos/sin cast to the activation dtype, rotate-half in that dtype;
* positions: ``cache_position = arange(past, past + T)`` with ``past`` the length of
  ``past_key_values``, or ``past + replace_position`` for a sub-block forward against the block cache;
* the mask: ``eval_block_diff_mask`` -> a 2-D bool ``[T, past + T]`` with ``(past + i) // block_size
  >= j // block_size`` (``block_size`` the forward's argument, default 32, not config ``bd_size``);
  none at all for a sub-block forward against a filled block cache;
* the caches: ``update_past_key_values=True`` appends the fresh K/V to ``past_key_values``; else
  the fresh K/V are attended after ``cat(past, fresh)`` without storing; ``use_block_cache``: the
  first call stores the block's K/V in a new block cache, later calls write their rows into it at
  ``replace_position`` in place and attend to ``cat(past, block cache)``;
* attention: transformers' ``sdpa_attention_forward`` with ``is_causal=False``: K/V heads repeated
  (``repeat_kv``) when a mask is given, ``enable_gqa`` without one.

Omitted: training (the doubled noisy/clean sequence, flex attention, the complementary mask), sliding
windows and ``rope_scaling`` (unused by the released config). The config is a plain dict.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Optional

import torch
import torch.nn as nn
import torch.nn.functional as F

from tests.reference.modelling.sdar_modeling import RefRMSNorm, RefRotary, _rotate_half


class RefDynamicCache:
    """``transformers.DynamicCache`` as the official code uses it (per layer, append on update)."""

    def __init__(self) -> None:
        self.k: list[torch.Tensor] = []
        self.v: list[torch.Tensor] = []

    def __len__(self) -> int:
        return len(self.k)

    def __getitem__(self, layer: int) -> tuple[torch.Tensor, torch.Tensor]:
        return self.k[layer], self.v[layer]

    def get_seq_length(self) -> int:
        return self.k[0].shape[-2] if self.k else 0

    def update(self, k: torch.Tensor, v: torch.Tensor, layer: int) -> tuple[torch.Tensor, torch.Tensor]:
        if len(self.k) <= layer:
            self.k.append(k)
            self.v.append(v)
        else:
            self.k[layer] = torch.cat([self.k[layer], k], dim=-2)
            self.v[layer] = torch.cat([self.v[layer], v], dim=-2)
        return self.k[layer], self.v[layer]


def _repeat_kv(x: torch.Tensor, n_rep: int) -> torch.Tensor:
    b, hkv, t, hd = x.shape
    if n_rep == 1:
        return x
    return x[:, :, None].expand(b, hkv, n_rep, t, hd).reshape(b, hkv * n_rep, t, hd)


def eval_mask(seqlen: int, block_size: int, cache_seq_len: int) -> torch.Tensor:
    """``Fast_dLLM_QwenModel.eval_mask``: bool [T, past + T], query i at position past + i."""
    q = torch.arange(seqlen) + cache_seq_len
    k = torch.arange(seqlen + cache_seq_len)
    return (q[:, None] // block_size) >= (k[None, :] // block_size)


class RefAttention(nn.Module):
    def __init__(self, cfg: dict, layer_idx: int) -> None:
        super().__init__()
        self.layer_idx = layer_idx
        d, h, hkv = cfg["hidden_size"], cfg["num_attention_heads"], cfg["num_key_value_heads"]
        self.head_dim = cfg.get("head_dim", d // h)
        self.groups = h // hkv
        self.scaling = self.head_dim ** -0.5
        self.q_proj = nn.Linear(d, h * self.head_dim, bias=True)
        self.k_proj = nn.Linear(d, hkv * self.head_dim, bias=True)
        self.v_proj = nn.Linear(d, hkv * self.head_dim, bias=True)
        self.o_proj = nn.Linear(h * self.head_dim, d, bias=False)

    def forward(self, x, position_embeddings, attention_mask, past_key_value, update_past_key_values,
                block_past_key_values, replace_position) -> torch.Tensor:
        bsz, t = x.shape[:-1]
        shape = (bsz, t, -1, self.head_dim)
        q = self.q_proj(x).view(shape).transpose(1, 2)
        k = self.k_proj(x).view(shape).transpose(1, 2)
        v = self.v_proj(x).view(shape).transpose(1, 2)
        cos, sin = position_embeddings
        cos, sin = cos.unsqueeze(1), sin.unsqueeze(1)
        q = (q * cos) + (_rotate_half(q) * sin)
        k = (k * cos) + (_rotate_half(k) * sin)
        if block_past_key_values is not None:
            if len(block_past_key_values) <= self.layer_idx:
                k, v = block_past_key_values.update(k, v, self.layer_idx)
            else:
                bk, bv = block_past_key_values[self.layer_idx]
                bk[:, :, replace_position:replace_position + k.shape[2]] = k  # in place, as the original
                bv[:, :, replace_position:replace_position + v.shape[2]] = v
                k, v = bk, bv
        if past_key_value is not None:
            if update_past_key_values:
                k, v = past_key_value.update(k, v, self.layer_idx)
            elif len(past_key_value) > self.layer_idx:
                k = torch.cat((past_key_value[self.layer_idx][0], k), dim=-2)
                v = torch.cat((past_key_value[self.layer_idx][1], v), dim=-2)
        kwargs = {}
        if attention_mask is None and self.groups > 1:
            kwargs["enable_gqa"] = True
        else:
            k, v = _repeat_kv(k, self.groups), _repeat_kv(v, self.groups)
        out = F.scaled_dot_product_attention(q.contiguous(), k.contiguous(), v.contiguous(), attn_mask=attention_mask,
                                             dropout_p=0.0, scale=self.scaling, is_causal=False, **kwargs)
        out = out.transpose(1, 2).contiguous().reshape(bsz, t, -1)
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
        self.input_layernorm = RefRMSNorm(cfg["hidden_size"], cfg["rms_norm_eps"])
        self.post_attention_layernorm = RefRMSNorm(cfg["hidden_size"], cfg["rms_norm_eps"])

    def forward(self, h, pe, mask, past, update, block_past, replace_position):
        h = h + self.self_attn(self.input_layernorm(h), pe, mask, past, update, block_past, replace_position)
        return h + self.mlp(self.post_attention_layernorm(h))


class RefModel(nn.Module):
    def __init__(self, cfg: dict) -> None:
        super().__init__()
        self.embed_tokens = nn.Embedding(cfg["vocab_size"], cfg["hidden_size"])
        self.layers = nn.ModuleList(RefLayer(cfg, i) for i in range(cfg["num_hidden_layers"]))
        self.norm = RefRMSNorm(cfg["hidden_size"], cfg["rms_norm_eps"])
        hd = cfg.get("head_dim", cfg["hidden_size"] // cfg["num_attention_heads"])
        self.rotary_emb = RefRotary(hd, float(cfg["rope_theta"]))


class RefOutput:
    def __init__(self, logits, past_key_values, block_past_key_values) -> None:
        self.logits = logits
        self.past_key_values = past_key_values
        self.block_past_key_values = block_past_key_values


class RefFastDLLMv2ForCausalLM(nn.Module):
    """The official inference forward (``self.training`` False)."""

    def __init__(self, cfg: dict) -> None:
        super().__init__()
        self.config = cfg
        self.model = RefModel(cfg)
        self.lm_head = nn.Linear(cfg["hidden_size"], cfg["vocab_size"], bias=False)

    @property
    def device(self) -> torch.device:
        return self.lm_head.weight.device

    @torch.no_grad()
    def forward(self, input_ids: torch.Tensor, past_key_values: Optional[RefDynamicCache] = None,
                use_cache: bool = False, update_past_key_values: bool = False, block_size: int = 32,
                use_block_cache: bool = False, block_past_key_values: Optional[RefDynamicCache] = None,
                replace_position: Optional[int] = None, mask_2d: bool = True) -> RefOutput:
        """``mask_2d=False`` hands SDPA the same mask as [1, 1, T, K] (a test switch: see the tests)."""
        h = self.model.embed_tokens(input_ids)
        if use_cache and past_key_values is None:
            past_key_values = RefDynamicCache()
        if use_block_cache and block_past_key_values is None:
            block_past_key_values = RefDynamicCache()
        past = past_key_values.get_seq_length() if past_key_values is not None else 0
        start = past + replace_position if use_block_cache and replace_position is not None else past
        position_ids = torch.arange(start, start + input_ids.shape[1], device=input_ids.device)[None]
        if use_block_cache and block_past_key_values.get_seq_length() != 0:
            mask = None
        else:
            mask = eval_mask(input_ids.shape[1], block_size, past).to(input_ids.device)
            if not mask_2d:
                mask = mask[None, None]
        pe = self.model.rotary_emb(h, position_ids)
        for layer in self.model.layers:
            h = layer(h, pe, mask, past_key_values, update_past_key_values,
                      block_past_key_values if use_block_cache else None, replace_position)
        logits = self.lm_head(self.model.norm(h))
        return RefOutput(logits, past_key_values if use_cache else None,
                         block_past_key_values if use_block_cache else None)

    @classmethod
    def from_pretrained(cls, directory, dtype: torch.dtype = torch.float32) -> "RefFastDLLMv2ForCausalLM":
        """Build from an official-layout directory (config.json + safetensors); strict key match."""
        from safetensors.torch import load_file

        directory = Path(directory)
        cfg = json.loads((directory / "config.json").read_text())
        if cfg.get("model_type") != "Fast_dLLM_Qwen":
            raise ValueError(f"not a Fast-dLLM v2 config: model_type={cfg.get('model_type')!r}")
        model = cls(cfg)
        state: dict[str, torch.Tensor] = {}
        for f in sorted(directory.glob("*.safetensors")):
            state.update(load_file(str(f)))
        if cfg.get("tie_word_embeddings"):
            state.setdefault("lm_head.weight", state["model.embed_tokens.weight"])
        model.load_state_dict(state, strict=True)
        model = model.to(dtype).eval()
        hd = cfg.get("head_dim", cfg["hidden_size"] // cfg["num_attention_heads"])
        model.model.rotary_emb.inv_freq = RefRotary(hd, float(cfg["rope_theta"])).inv_freq  # float32 buffer
        return model
