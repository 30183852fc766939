"""Reference transcription of DFlare's draft model and decoding loop (Tencent/AngelSlim
``angelslim/compressor/speculative/train/models/draft/qwen_dflare.py``: ``QwenDFlareDraftModel`` and
its ``spec_generate``; arXiv 2606.02091), restated from the public code for ``dllm``'s tests; no code
copied. Test-only: the original imports AngelSlim's draft-model factory (and through it the training
stack), so it cannot be imported here on its own.

Kept as in the original (what can change a logit or a token):

* the model is a transformers ``Qwen3PreTrainedModel`` named as the original (``save_pretrained``
  writes ``architectures: ["QwenDFlareDraftModel"]``) with the original's module names, so
  ``from_pretrained`` reads a checkpoint in the authors' layout by the same keys and strictness:
  ``layers.N.self_attn.{q,k,v,o}_proj``, ``k_proj_target``, ``v_proj_target``, ``q_norm``, ``k_norm``,
  ``layers.N.mlp.*``, ``layers.N.{input,post_attention}_layernorm``, ``norm``, ``hidden_norm``,
  ``layer_fusion_weights`` [L, T]; taps ``dflash_config.target_layer_ids`` (default: the DFlash spacing
  rule over ``num_target_layers``), ``mask_token_id`` from ``dflash_config``, ``block_size`` top level;
* fusion: the concatenated taps [B, S, T*D] viewed as [B, S, T, D], mixed per draft layer by
  ``einsum("bsth,dt->bsdh", taps, softmax(layer_fusion_weights, dim=1))``, then ``hidden_norm``; layer i
  reads slice i;
* attention: q from the block (``q_proj``, ``q_norm`` per head); keys / values are
  ``cat([k_proj_target(ctx), k_proj(block)])`` and ``cat([v_proj_target(ctx), v_proj(block)])`` along
  the sequence, ``k_norm`` on all keys, rotate-half RoPE over the context-then-block positions (q takes
  the last q_len rows of cos/sin); the keys / values go through the draft ``DynamicCache`` (``update``)
  and transformers' attention function of the config (sdpa by default) with no mask and
  ``is_causal=False``;
* ``spec_generate`` (batch 1): a buffer of ``max_length + block_size`` mask ids, prefill with
  ``logits_to_keep=1`` and hidden states, the first token sampled from it; per round: the block
  ``[anchor, MASK ...]`` embedded by the target's ``embed_tokens``, the drafter over the newly committed
  features at positions ``cache_len .. start + B``, draft cache cropped back to ``start``, drafts the
  arg-max of ``lm_head`` on block rows 1..B-1 (the draft is always greedy); the target verifies the
  block; accepted = the cumulative-product match of drafts and the target's choices, then the bonus; the
  target cache is cropped to the new start; the next features are the verify pass's taps of the
  accepted tokens and the bonus's predecessor rows ``[: accepted + 1]``; a stop token anywhere in the
  output ends the loop, the output is cut to ``max_length``, mask ids dropped, and cut after the first
  stop token.

Differences, inert for what is tested: ``crop(n)`` is spelled ``ref_crop`` (transformers 5 reads a
positive count differently; the original ran on 4.57, where it keeps n slots); ``sample`` at T > 0
(``torch.multinomial``) is kept but only greedy runs are compared (a sampled run depends on the random
stream, not on the model); ``spec_generate`` also returns the per-round acceptance lengths the original
collects (and drops); training-only code (gradient checkpointing, flash attention kwargs) is left out;
the sliding window of a ``sliding_attention`` layer is passed on as the original does (sdpa ignores it
without a mask).
"""

from __future__ import annotations

from typing import Optional

import torch
from torch import nn
from transformers import DynamicCache
from transformers.models.qwen3.modeling_qwen3 import (ALL_ATTENTION_FUNCTIONS, Qwen3Config, Qwen3MLP,
                                                      Qwen3PreTrainedModel, Qwen3RMSNorm, Qwen3RotaryEmbedding,
                                                      eager_attention_forward, rotate_half)


def ref_sample(logits: torch.Tensor, temperature: float = 0.0) -> torch.Tensor:
    """Arg-max below temperature 1e-5, else one multinomial draw per row of softmax(logits / T)."""
    if temperature < 1e-5:
        return logits.argmax(dim=-1)
    b, s, v = logits.shape
    probs = torch.softmax(logits.reshape(-1, v) / temperature, dim=-1)
    return torch.multinomial(probs, num_samples=1).view(b, s)


def ref_target_layer_ids(num_target_layers: int, num_draft_layers: int) -> list[int]:
    if num_draft_layers == 1:
        return [num_target_layers // 2]
    lo, hi = 1, num_target_layers - 3
    return [int(round(lo + i * (hi - lo) / (num_draft_layers - 1))) for i in range(num_draft_layers)]


def ref_context_feature(hidden_states, layer_ids) -> torch.Tensor:
    """Concatenate ``hidden_states[i + 1]`` (decoder layer i's output) over the taps, last dim."""
    return torch.cat([hidden_states[i + 1] for i in layer_ids], dim=-1)


def ref_crop(cache: DynamicCache, length: int) -> None:
    """``cache.crop(length)`` as the original's transformers (4.57) reads it: keep the first ``length``
    slots (transformers 5 takes a count of slots to remove, negative)."""
    remove = cache.get_seq_length() - length
    if remove > 0:
        cache.crop(-remove)


def _rotate(q: torch.Tensor, k: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor):
    cos, sin = cos.unsqueeze(1), sin.unsqueeze(1)  # [B, 1, S, hd]
    n = q.shape[-2]
    q_out = q * cos[..., -n:, :] + rotate_half(q) * sin[..., -n:, :]
    return q_out, k * cos + rotate_half(k) * sin


class RefDFlareAttention(nn.Module):
    def __init__(self, config: Qwen3Config, layer_idx: int) -> None:
        super().__init__()
        self.config, self.layer_idx = config, layer_idx
        self.head_dim = getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads
        self.num_key_value_groups = config.num_attention_heads // config.num_key_value_heads
        self.scaling = self.head_dim ** -0.5
        self.attention_dropout = config.attention_dropout
        self.is_causal = False
        d, bias = config.hidden_size, config.attention_bias
        q_width, kv_width = config.num_attention_heads * self.head_dim, config.num_key_value_heads * self.head_dim
        self.q_proj = nn.Linear(d, q_width, bias=bias)
        self.k_proj = nn.Linear(d, kv_width, bias=bias)
        self.k_proj_target = nn.Linear(d, kv_width, bias=bias)
        self.v_proj = nn.Linear(d, kv_width, bias=bias)
        self.v_proj_target = nn.Linear(d, kv_width, bias=bias)
        self.o_proj = nn.Linear(q_width, d, bias=bias)
        self.q_norm = Qwen3RMSNorm(self.head_dim, eps=config.rms_norm_eps)
        self.k_norm = Qwen3RMSNorm(self.head_dim, eps=config.rms_norm_eps)
        self.sliding_window = (config.sliding_window if config.layer_types[layer_idx] == "sliding_attention"
                               else None)

    def forward(self, hidden_states, target_hidden, position_embeddings, past_key_values=None, **kwargs):
        b, n = hidden_states.shape[:-1]
        m = target_hidden.shape[1]
        q = self.q_norm(self.q_proj(hidden_states).view(b, n, -1, self.head_dim)).transpose(1, 2)
        k = torch.cat([self.k_proj_target(target_hidden), self.k_proj(hidden_states)], dim=1)
        v = torch.cat([self.v_proj_target(target_hidden), self.v_proj(hidden_states)], dim=1)
        k = self.k_norm(k.view(b, m + n, -1, self.head_dim)).transpose(1, 2)
        v = v.view(b, m + n, -1, self.head_dim).transpose(1, 2)
        cos, sin = position_embeddings
        q, k = _rotate(q, k, cos, sin)
        if past_key_values is not None:
            k, v = past_key_values.update(k, v, self.layer_idx, {"sin": sin, "cos": cos, "cache_position": None})
        attend = eager_attention_forward
        if self.config._attn_implementation != "eager":
            attend = ALL_ATTENTION_FUNCTIONS[self.config._attn_implementation]
        out, _ = attend(self, q, k, v, None, dropout=0.0, scaling=self.scaling, sliding_window=self.sliding_window,
                        **kwargs)
        return self.o_proj(out.reshape(b, n, -1))


class RefDFlareDecoderLayer(nn.Module):
    def __init__(self, config: Qwen3Config, layer_idx: int) -> None:
        super().__init__()
        self.self_attn = RefDFlareAttention(config, layer_idx)
        self.mlp = Qwen3MLP(config)
        self.input_layernorm = Qwen3RMSNorm(config.hidden_size, eps=config.rms_norm_eps)
        self.post_attention_layernorm = Qwen3RMSNorm(config.hidden_size, eps=config.rms_norm_eps)

    def forward(self, hidden_states, target_hidden, position_embeddings, past_key_values=None, **kwargs):
        h = hidden_states + self.self_attn(self.input_layernorm(hidden_states), target_hidden, position_embeddings,
                                           past_key_values, **kwargs)
        return h + self.mlp(self.post_attention_layernorm(h))


class QwenDFlareDraftModel(Qwen3PreTrainedModel):
    config_class = Qwen3Config
    _no_split_modules = ["RefDFlareDecoderLayer"]

    def __init__(self, config) -> None:
        super().__init__(config)
        self.layers = nn.ModuleList(RefDFlareDecoderLayer(config, i) for i in range(config.num_hidden_layers))
        self.num_draft_layers = config.num_hidden_layers
        dflash = getattr(config, "dflash_config", {}) or {}
        self.target_layer_ids = dflash.get("target_layer_ids",
                                           ref_target_layer_ids(config.num_target_layers, config.num_hidden_layers))
        self.num_target_layers = len(self.target_layer_ids)
        self.norm = Qwen3RMSNorm(config.hidden_size, eps=config.rms_norm_eps)
        self.rotary_emb = Qwen3RotaryEmbedding(config)
        self.layer_fusion_weights = nn.Parameter(torch.zeros(self.num_draft_layers, self.num_target_layers))
        for d in range(self.num_draft_layers):  # each draft layer starts on "its" tap
            t = min(self.num_target_layers - 1, int(d / self.num_draft_layers * self.num_target_layers))
            self.layer_fusion_weights.data[d, t] = 2.0
        self.hidden_norm = Qwen3RMSNorm(config.hidden_size, eps=config.rms_norm_eps)
        self.block_size = config.block_size
        self.mask_token_id = dflash.get("mask_token_id", None)
        self.post_init()

    def forward(self, position_ids, noise_embedding, target_hidden, past_key_values=None, **kwargs):
        b, s, _ = target_hidden.shape
        taps = target_hidden.view(b, s, self.num_target_layers, self.config.hidden_size)
        fused = torch.einsum("bsth,dt->bsdh", taps, torch.softmax(self.layer_fusion_weights, dim=1))
        fused = self.hidden_norm(fused)
        h = noise_embedding
        rope = self.rotary_emb(h, position_ids)
        for i, layer in enumerate(self.layers):
            h = layer(h, fused[:, :, i, :], rope, past_key_values, **kwargs)
        return self.norm(h)


@torch.inference_mode()
def ref_spec_generate(model: QwenDFlareDraftModel, target: nn.Module, input_ids: torch.Tensor, max_new_tokens: int,
                      stop_token_ids: Optional[list[int]], temperature: float = 0.0):
    """(output ids [1, <= P + max_new_tokens], per-round acceptance lengths incl. the bonus)."""
    model.eval()
    n_in = input_ids.shape[1]
    max_length = n_in + max_new_tokens
    size = model.block_size
    out_ids = torch.full((1, max_length + size), model.mask_token_id, dtype=torch.long, device=input_ids.device)
    pos = torch.arange(out_ids.shape[1], device=input_ids.device)[None]
    target_cache, draft_cache = DynamicCache(), DynamicCache()
    out = target(input_ids, position_ids=pos[:, :n_in], past_key_values=target_cache, use_cache=True,
                 logits_to_keep=1, output_hidden_states=True)
    out_ids[:, :n_in] = input_ids
    out_ids[:, n_in:n_in + 1] = ref_sample(out.logits, temperature)
    feats = ref_context_feature(out.hidden_states, model.target_layer_ids)
    lengths = []
    start = n_in
    while start < max_length:
        block = out_ids[:, start:start + size].clone()
        hidden = model(target_hidden=feats, noise_embedding=target.model.embed_tokens(block),
                       position_ids=pos[:, draft_cache.get_seq_length():start + size], past_key_values=draft_cache,
                       use_cache=True, is_causal=False)
        draft_logits = target.lm_head(hidden[:, -size + 1:, :])
        ref_crop(draft_cache, start)
        block[:, 1:] = ref_sample(draft_logits)
        out = target(block, position_ids=pos[:, start:start + size], past_key_values=target_cache, use_cache=True,
                     output_hidden_states=True)
        posterior = ref_sample(out.logits, temperature)
        accepted = int((block[:, 1:] == posterior[:, :-1]).cumprod(dim=1).sum(dim=1)[0])
        out_ids[:, start:start + accepted + 1] = block[:, :accepted + 1]
        out_ids[:, start + accepted + 1] = posterior[:, accepted]
        start += accepted + 1
        ref_crop(target_cache, start)
        feats = ref_context_feature(out.hidden_states, model.target_layer_ids)[:, :accepted + 1, :]
        lengths.append(accepted + 1)
        if stop_token_ids is not None and any(t in out_ids[:, n_in:] for t in stop_token_ids):
            break
    out_ids = out_ids[:, :max_length]
    out_ids = out_ids[:, out_ids[0] != model.mask_token_id]
    if stop_token_ids is not None:
        hits = torch.isin(out_ids[0][n_in:], torch.tensor(stop_token_ids, device=out_ids.device)).nonzero()[:, 0]
        if hits.numel() > 0:
            out_ids = out_ids[:, :n_in + int(hits[0]) + 1]
    return out_ids, lengths
