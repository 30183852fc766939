"""Reference transcription of LLaDA 2.x MoE's inference modelling (inclusionAI/dFactory
``models/llada2_moe/modeling_llada2_moe.py`` and ``configuration_llada2_moe.py``), restated from the
public code for ``dllm``'s tests; no code copied. Test-only: the official file imports veomni and
liger_kernel, so it cannot be imported here.

Kept as in the original (what can change a logit):

* ``LLaDA2MoeModelLM`` -> ``LLaDA2MoeModel`` (``word_embeddings``, ``layers``, ``norm``) + ``lm_head``,
  logits cast to float32; the official key names (``model.layers.{i}.attention.query_key_value.weight``,
  ``mlp.gate.expert_bias``, ``mlp.experts.{e}.gate_proj.weight`` ...);
* RMSNorm: normalise in float32, cast back, multiply by the weight;
* rotary embedding: ``inv_freq = 1 / theta^(arange(0, rd, 2) / rd)`` with ``rd = int(head_dim *
  partial_rotary_factor)`` (transformers' default rope init), angles from the matmul
  ``inv_freq[:, None] @ positions[None]`` in float32, cos/sin cast to the activation dtype;
* attention (``LLaDA2MoeSdpaAttention``): fused ``query_key_value`` viewed as [B, T, H + 2 Hkv, hd] and
  split; ``query_layernorm`` / ``key_layernorm`` per head after the transpose and BEFORE RoPE (the
  Hugging Face release's copy of the file gates them on ``use_qk_norm``; dFactory's always applies them); RoPE on
  the first ``rd`` channels only (``apply_rotary_pos_emb``: rotate ``[..., :rd]``, concatenate the
  rest); ``repeat_kv``; ``F.scaled_dot_product_attention(q, k, v, attn_mask=mask)`` with the caller's
  4-D mask (transformers' ``_prepare_4d_causal_attention_mask_for_sdpa`` passes a 4-D mask through);
  ``dense``;
* the layer: dense ``LLaDA2MoeMLP`` below ``first_k_dense_replace``, else ``LLaDA2MoeSparseMoeBlock``
  (the ``llada2_moe`` branch: experts as a ModuleList, inference through ``moe_infer``);
* ``LLaDA2MoeGate``: float32 logits, sigmoid scores, expert choice on ``scores + expert_bias`` by
  ``group_limited_topk`` (groups scored by their best two, ``topk_group`` kept), weights = unbiased
  scores / (sum + 1e-20) when top_k > 1, times ``routed_scaling_factor``;
* ``moe_infer``: assignments sorted by expert (``argsort``), each expert on its rows, scattered back,
  weighted and summed in the weights' dtype (float32), cast back; ``+ shared_experts(x)``.

Differences, inert for what is tested: training-only paths (dropout, the veomni fused expert kernel
and expert parallelism, the router aux outputs, the loss), the KV cache, ``output_attentions`` and
the eager attention class are omitted; the config is a plain dict (the checkpoint's config.json).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Optional

import torch
import torch.nn as nn
import torch.nn.functional as F


class RefRMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))
        self.variance_epsilon = eps

    def forward(self, hidden_states: torch.Tensor) -> torch.Tensor:
        input_dtype = hidden_states.dtype
        hidden_states = hidden_states.to(torch.float32)
        variance = hidden_states.pow(2).mean(-1, keepdim=True)
        hidden_states = hidden_states * torch.rsqrt(variance + self.variance_epsilon)
        return self.weight * hidden_states.to(input_dtype)


def _head_dim(cfg: dict) -> int:
    return cfg.get("head_dim") or cfg["hidden_size"] // cfg["num_attention_heads"]


class RefRotary(nn.Module):
    def __init__(self, cfg: dict) -> None:
        super().__init__()
        dim = int(_head_dim(cfg) * cfg.get("partial_rotary_factor", 1.0))
        exps = torch.arange(0, dim, 2, dtype=torch.int64).to(dtype=torch.float) / dim
        self.register_buffer("inv_freq", 1.0 / (float(cfg["rope_theta"]) ** exps), persistent=False)

    def forward(self, x: torch.Tensor, position_ids: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        inv = self.inv_freq[None, :, None].float().expand(position_ids.shape[0], -1, 1)
        pos = position_ids[:, None, :].float()
        freqs = (inv.float() @ pos.float()).transpose(1, 2)  # [B, T, rd/2]
        emb = torch.cat((freqs, freqs), dim=-1)
        return (emb.cos() * 1.0).to(x.dtype), (emb.sin() * 1.0).to(x.dtype)


def _rotate_half(x: torch.Tensor) -> torch.Tensor:
    x1, x2 = x[..., : x.shape[-1] // 2], x[..., x.shape[-1] // 2:]
    return torch.cat((-x2, x1), dim=-1)


def _apply_rotary(q, k, cos, sin):
    cos, sin = cos.unsqueeze(1), sin.unsqueeze(1)
    rd = cos.shape[-1]
    q_rot, q_pass = q[..., :rd], q[..., rd:]
    k_rot, k_pass = k[..., :rd], k[..., rd:]
    q_embed = (q_rot * cos) + (_rotate_half(q_rot) * sin)
    k_embed = (k_rot * cos) + (_rotate_half(k_rot) * sin)
    return torch.cat([q_embed, q_pass], dim=-1), torch.cat([k_embed, k_pass], dim=-1)


def _repeat_kv(x: torch.Tensor, n_rep: int) -> torch.Tensor:
    b, h, t, d = x.shape
    if n_rep == 1:
        return x
    return x[:, :, None, :, :].expand(b, h, n_rep, t, d).reshape(b, h * n_rep, t, d)


class RefAttention(nn.Module):
    def __init__(self, cfg: dict) -> None:
        super().__init__()
        self.num_heads = cfg["num_attention_heads"]
        self.num_kv = cfg["num_key_value_heads"]
        self.head_dim = _head_dim(cfg)
        self.query_key_value = nn.Linear(cfg["hidden_size"], (self.num_heads + 2 * self.num_kv) * self.head_dim,
                                         bias=cfg.get("use_qkv_bias", False))
        self.qk_norm = cfg.get("use_qk_norm", True)  # the HF release's switch; dFactory always normalises
        if self.qk_norm:
            self.query_layernorm = RefRMSNorm(self.head_dim, cfg["rms_norm_eps"])
            self.key_layernorm = RefRMSNorm(self.head_dim, cfg["rms_norm_eps"])
        self.dense = nn.Linear(self.num_heads * self.head_dim, cfg["hidden_size"], bias=cfg.get("use_bias", True))

    def forward(self, hidden_states, attention_mask, position_embeddings):
        bsz, q_len, _ = hidden_states.size()
        qkv = self.query_key_value(hidden_states).view(bsz, q_len, self.num_heads + 2 * self.num_kv, self.head_dim)
        q, k, v = qkv.split([self.num_heads, self.num_kv, self.num_kv], dim=-2)
        q, k, v = q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2)
        if self.qk_norm:
            q = self.query_layernorm(q)
            k = self.key_layernorm(k)
        cos, sin = position_embeddings
        q, k = _apply_rotary(q, k, cos, sin)
        k = _repeat_kv(k, self.num_heads // self.num_kv)
        v = _repeat_kv(v, self.num_heads // self.num_kv)
        out = F.scaled_dot_product_attention(q, k, v, attn_mask=attention_mask, dropout_p=0.0, is_causal=False)
        out = out.transpose(1, 2).contiguous().reshape(bsz, q_len, -1)
        return self.dense(out)


class RefMLP(nn.Module):
    def __init__(self, cfg: dict, intermediate_size: int) -> None:
        super().__init__()
        d = cfg["hidden_size"]
        self.gate_proj = nn.Linear(d, intermediate_size, bias=False)
        self.up_proj = nn.Linear(d, intermediate_size, bias=False)
        self.down_proj = nn.Linear(intermediate_size, d, bias=False)

    def forward(self, x):
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


class RefGate(nn.Module):
    def __init__(self, cfg: dict) -> None:
        super().__init__()
        self.top_k = cfg["num_experts_per_tok"]
        self.num_experts = cfg["num_experts"]
        self.n_group, self.topk_group = cfg["n_group"], cfg["topk_group"]
        self.routed_scaling_factor = cfg["routed_scaling_factor"]
        self.weight = nn.Parameter(torch.empty((self.num_experts, cfg["hidden_size"])))
        self.register_buffer("expert_bias", torch.zeros(self.num_experts))

    def group_limited_topk(self, scores):
        num_tokens, _ = scores.size()
        group_scores = scores.view(num_tokens, self.n_group, -1).topk(2, dim=-1)[0].sum(dim=-1)
        group_idx = torch.topk(group_scores, k=self.topk_group, dim=-1, sorted=False)[1]
        group_mask = torch.zeros_like(group_scores)
        group_mask.scatter_(1, group_idx, 1)
        score_mask = (group_mask.unsqueeze(-1).expand(num_tokens, self.n_group, self.num_experts // self.n_group)
                      .reshape(num_tokens, -1))
        masked_scores = scores.masked_fill(~score_mask.bool(), float("-inf"))
        return torch.topk(masked_scores, k=self.top_k, dim=-1)

    def forward(self, hidden_states):
        hidden_states = hidden_states.view(-1, hidden_states.shape[-1])
        logits = F.linear(hidden_states.type(torch.float32), self.weight.type(torch.float32))
        scores = torch.sigmoid(logits.float()).type_as(logits)
        _, topk_idx = self.group_limited_topk(scores + self.expert_bias)
        scores = torch.gather(scores, dim=1, index=topk_idx).type_as(logits)
        topk_weight = scores / (scores.sum(dim=-1, keepdim=True) + 1e-20) if self.top_k > 1 else scores
        return topk_idx, topk_weight * self.routed_scaling_factor


class RefSparseMoe(nn.Module):
    def __init__(self, cfg: dict) -> None:
        super().__init__()
        self.experts = nn.ModuleList(RefMLP(cfg, cfg["moe_intermediate_size"]) for _ in range(cfg["num_experts"]))
        self.gate = RefGate(cfg)
        shared = cfg.get("num_shared_experts")
        self.shared_experts = RefMLP(cfg, cfg["moe_intermediate_size"] * shared) if shared is not None else None

    def forward(self, hidden_states):
        identity = hidden_states
        bsz, seq_len, h = hidden_states.shape
        topk_idx, topk_weight = self.gate(hidden_states)
        y = self.moe_infer(hidden_states.view(-1, h), topk_idx, topk_weight).view(bsz, seq_len, h)
        return y + self.shared_experts(identity) if self.shared_experts is not None else y

    def moe_infer(self, x, topk_ids, topk_weight):
        cnts = topk_ids.new_zeros((topk_ids.shape[0], len(self.experts)))
        cnts.scatter_(1, topk_ids, 1)
        tokens_per_expert = cnts.sum(dim=0).cpu().numpy()
        idxs = topk_ids.view(-1).argsort()
        sorted_tokens = x[idxs // topk_ids.shape[1]]
        outputs, start_idx = [], 0
        for i, num_tokens in enumerate(tokens_per_expert):
            end_idx = start_idx + num_tokens
            if num_tokens == 0:
                continue
            outputs.append(self.experts[i](sorted_tokens[start_idx:end_idx]))
            start_idx = end_idx
        outs = torch.cat(outputs, dim=0) if len(outputs) else sorted_tokens.new_empty(0)
        new_x = torch.empty_like(outs)
        new_x[idxs] = outs
        return (new_x.view(*topk_ids.shape, -1).type(topk_weight.dtype).mul_(topk_weight.unsqueeze(dim=-1))
                .sum(dim=1).type(new_x.dtype))


class RefLayer(nn.Module):
    def __init__(self, cfg: dict, layer_idx: int) -> None:
        super().__init__()
        self.attention = RefAttention(cfg)
        moe = cfg.get("num_experts") is not None and layer_idx >= cfg.get("first_k_dense_replace", 0)
        self.mlp = RefSparseMoe(cfg) if moe else RefMLP(cfg, cfg["intermediate_size"])
        self.input_layernorm = RefRMSNorm(cfg["hidden_size"], cfg["rms_norm_eps"])
        self.post_attention_layernorm = RefRMSNorm(cfg["hidden_size"], cfg["rms_norm_eps"])

    def forward(self, h, attention_mask, position_embeddings):
        residual = h
        h = residual + self.attention(self.input_layernorm(h), attention_mask, position_embeddings)
        residual = h
        return residual + self.mlp(self.post_attention_layernorm(h))


class RefModel(nn.Module):
    def __init__(self, cfg: dict) -> None:
        super().__init__()
        self.word_embeddings = nn.Embedding(cfg["vocab_size"], cfg["hidden_size"])
        self.layers = nn.ModuleList(RefLayer(cfg, i) for i in range(cfg["num_hidden_layers"]))
        self.norm = RefRMSNorm(cfg["hidden_size"], cfg["rms_norm_eps"])
        self.rotary_emb = RefRotary(cfg)


class RefOutput:
    def __init__(self, logits: torch.Tensor) -> None:
        self.logits = logits


class RefLLaDA2MoeModelLM(nn.Module):
    """The official inference forward: ``model(input_ids, attention_mask [B, 1, T, T], position_ids).logits``."""

    def __init__(self, cfg: dict) -> None:
        super().__init__()
        self.config = cfg
        self.model = RefModel(cfg)
        self.lm_head = nn.Linear(cfg["hidden_size"], cfg["vocab_size"], bias=False)
        if cfg.get("tie_word_embeddings"):
            self.lm_head.weight = self.model.word_embeddings.weight

    @torch.no_grad()
    def forward(self, input_ids: torch.Tensor, attention_mask: Optional[torch.Tensor] = None,
                position_ids: Optional[torch.Tensor] = None) -> RefOutput:
        if position_ids is None:
            position_ids = torch.arange(input_ids.shape[1], device=input_ids.device)[None]
        h = self.model.word_embeddings(input_ids)
        pe = self.model.rotary_emb(h, position_ids)
        for layer in self.model.layers:
            h = layer(h, attention_mask, pe)
        return RefOutput(self.lm_head(self.model.norm(h)).float())

    @classmethod
    def random(cls, cfg: dict, seed: int = 0) -> "RefLLaDA2MoeModelLM":
        """A random model built by the official classes' shapes (weights ~ N(0, 1/fan_in), norms ~ 1 +
        N(0, 0.1), expert biases ~ N(0, 0.05^2)), for a tiny official-format checkpoint."""
        model = cls(cfg)
        g = torch.Generator().manual_seed(seed)
        with torch.no_grad():
            for name, p in model.named_parameters():
                noise = torch.randn(p.shape, generator=g)
                p.copy_(1.0 + 0.1 * noise if name.endswith("norm.weight") or "layernorm" in name
                        else noise if "word_embeddings" in name else noise / p.shape[-1] ** 0.5)
            for name, b in model.named_buffers():
                if name.endswith("expert_bias"):
                    b.copy_(0.05 * torch.randn(b.shape, generator=g))
        return model.eval()

    def save_official(self, directory) -> None:
        """config.json + model.safetensors with the official key names."""
        from safetensors.torch import save_file

        directory = Path(directory)
        directory.mkdir(parents=True, exist_ok=True)
        state = {k: v.contiguous() for k, v in self.state_dict().items()}
        if self.config.get("tie_word_embeddings"):
            state.pop("lm_head.weight")
        save_file(state, str(directory / "model.safetensors"))
        (directory / "config.json").write_text(json.dumps(self.config, indent=2))

    @classmethod
    def from_pretrained(cls, directory, dtype: torch.dtype = torch.float32) -> "RefLLaDA2MoeModelLM":
        """Build from an official-layout directory; every key must match a parameter / buffer (strict)."""
        from safetensors.torch import load_file

        directory = Path(directory)
        cfg = json.loads((directory / "config.json").read_text())
        if cfg.get("model_type") != "llada2_moe":
            raise ValueError(f"not a LLaDA2 MoE config: model_type={cfg.get('model_type')!r}")
        model = cls(cfg)
        state: dict[str, torch.Tensor] = {}
        for f in sorted(directory.glob("*.safetensors")):
            state.update(load_file(str(f)))
        if cfg.get("tie_word_embeddings"):
            state.setdefault("lm_head.weight", state["model.word_embeddings.weight"])
        model.load_state_dict(state, strict=True)
        return model.to(dtype).eval()
