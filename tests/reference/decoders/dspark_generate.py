"""Reference transcription of DSpark's drafter and decoding loop (Cheng et al., arXiv 2607.05147;
authors' code github.com/deepseek-ai/DeepSpec: ``deepspec/modeling/dspark/qwen3/modeling.py``
``Qwen3DSparkModel``, ``deepspec/modeling/dspark/markov_head.py``, ``deepspec/eval/dspark/draft_ops.py``
``forward_dspark_draft_block`` / ``build_dspark_proposal`` / ``_confident_prefix_length``, and the loop
``deepspec/eval/base_evaluator.py`` ``generate_decoding_sample``), restated for ``dllm``'s tests; no
code copied. Test-only, independent of ``dllm``.

Kept as in the original (what can change a draft, a verify length or a token):

* the model is a transformers ``Qwen3PreTrainedModel`` with the original's module names, so
  ``from_pretrained`` reads a checkpoint in the authors' layout by the same keys: ``embed_tokens``,
  ``layers.N.self_attn.{q,k,v,o}_proj``, ``q_norm``, ``k_norm``, ``layers.N.mlp.*``, the two layer
  norms, ``norm``, ``fc``, ``hidden_norm``, ``lm_head``, ``markov_head.markov_w1`` / ``markov_w2`` (+
  ``gate_proj`` gated, ``joint_proj`` rnn), ``confidence_head.proj``; config fields at the top level;
* backbone: context = ``hidden_norm(fc(taps))``; keys / values ``cat([k_proj(ctx), k_proj(block)])``,
  ``k_norm`` on all keys, rotate-half RoPE over context-then-block positions (q takes the last rows),
  through the draft ``DynamicCache``; attention without a mask, ``is_causal=False``; final ``norm``;
* a round (batch 1): block = ``[output_ids[start], MASK x (block_size - 1)]`` embedded by the drafter's
  own ``embed_tokens``, positions ``cache_len .. start + block_size``, the draft cache cropped back to
  ``start``; base logits ``lm_head`` of ALL ``block_size`` rows (row k predicts ``start + k + 1``);
  the Markov head picks tokens left to right from ``base_k + bias(prev_k)`` with ``prev_0`` the anchor;
  confidence logits from ``[h_k ; W1[prev_k]]`` (``prev`` = anchor then the picked tokens but the last);
  verify length = ``block_size`` when ``threshold <= 0``, else the index of the first position with
  ``sigmoid(logit) < threshold`` (``block_size`` if none); length 0 verifies the anchor alone;
* the loop: prefill with hidden states, first token the arg-max (greedy); each round the target
  verifies ``[anchor, d_1..d_L]``; accepted = the matching prefix of drafts and target arg-maxes, then
  the target's token; the target cache cropped to the new start; the next context features are the
  verify pass's taps ``[: accepted + 1]``; the loop ends once ``start >= max_length`` or a stop token
  was emitted; the output is cut to ``max_length`` and after its first stop token.

Differences, inert for what is tested: greedy only (the original's ``torch.multinomial`` draws depend
on the random stream, not on the model); ``crop(n)`` is spelled ``ref_crop`` (transformers 5 reads a
positive count differently); a stop token among accepted drafts ends the loop as the original's
``verify_draft_tokens`` does (it cuts the accepted drafts at the stop token); the loop returns, per
round, the drafted tokens, the verify length and the accepted drafts, which the original collects for
its metrics.
"""

from __future__ import annotations

from typing import Optional

import torch
from torch import nn
from transformers import DynamicCache
from transformers.models.qwen3.modeling_qwen3 import (ALL_ATTENTION_FUNCTIONS, Qwen3MLP, Qwen3PreTrainedModel,
                                                      Qwen3RMSNorm, Qwen3RotaryEmbedding, eager_attention_forward,
                                                      rotate_half)


def ref_crop(cache: DynamicCache, length: int) -> None:
    """Keep the first ``length`` slots of ``cache``."""
    remove = cache.get_seq_length() - length
    if remove > 0:
        cache.crop(-remove)


def _rotate(q, k, cos, sin):
    cos, sin = cos.unsqueeze(1), sin.unsqueeze(1)
    n = q.shape[-2]
    return q * cos[..., -n:, :] + rotate_half(q) * sin[..., -n:, :], k * cos + rotate_half(k) * sin


class RefDSparkAttention(nn.Module):
    def __init__(self, config, layer_idx: int) -> None:
        super().__init__()
        self.config, self.layer_idx = config, layer_idx
        self.head_dim = getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads
        self.num_key_value_groups = config.num_attention_heads // config.num_key_value_heads
        self.scaling = self.head_dim ** -0.5
        self.is_causal = False
        d, bias = config.hidden_size, config.attention_bias
        self.q_proj = nn.Linear(d, config.num_attention_heads * self.head_dim, bias=bias)
        self.k_proj = nn.Linear(d, config.num_key_value_heads * self.head_dim, bias=bias)
        self.v_proj = nn.Linear(d, config.num_key_value_heads * self.head_dim, bias=bias)
        self.o_proj = nn.Linear(config.num_attention_heads * self.head_dim, d, bias=bias)
        self.q_norm = Qwen3RMSNorm(self.head_dim, eps=config.rms_norm_eps)
        self.k_norm = Qwen3RMSNorm(self.head_dim, eps=config.rms_norm_eps)

    def forward(self, hidden_states, target_hidden, position_embeddings, past_key_values=None):
        b, n = hidden_states.shape[:-1]
        m = target_hidden.shape[1]
        q = self.q_norm(self.q_proj(hidden_states).view(b, n, -1, self.head_dim)).transpose(1, 2)
        k = torch.cat([self.k_proj(target_hidden), self.k_proj(hidden_states)], dim=1)
        v = torch.cat([self.v_proj(target_hidden), self.v_proj(hidden_states)], dim=1)
        k = self.k_norm(k.view(b, m + n, -1, self.head_dim)).transpose(1, 2)
        v = v.view(b, m + n, -1, self.head_dim).transpose(1, 2)
        cos, sin = position_embeddings
        q, k = _rotate(q, k, cos, sin)
        if past_key_values is not None:
            k, v = past_key_values.update(k, v, self.layer_idx, {"sin": sin, "cos": cos, "cache_position": None})
        attend = eager_attention_forward
        if self.config._attn_implementation != "eager":
            attend = ALL_ATTENTION_FUNCTIONS[self.config._attn_implementation]
        out, _ = attend(self, q, k, v, None, dropout=0.0, scaling=self.scaling, is_causal=False)
        return self.o_proj(out.reshape(b, n, -1))


class RefDSparkLayer(nn.Module):
    def __init__(self, config, layer_idx: int) -> None:
        super().__init__()
        self.self_attn = RefDSparkAttention(config, layer_idx)
        self.mlp = Qwen3MLP(config)
        self.input_layernorm = Qwen3RMSNorm(config.hidden_size, eps=config.rms_norm_eps)
        self.post_attention_layernorm = Qwen3RMSNorm(config.hidden_size, eps=config.rms_norm_eps)

    def forward(self, h, target_hidden, position_embeddings, past_key_values=None):
        h = h + self.self_attn(self.input_layernorm(h), target_hidden, position_embeddings, past_key_values)
        return h + self.mlp(self.post_attention_layernorm(h))


class RefMarkovHead(nn.Module):
    """vanilla: W2 W1[prev]; gated: W2 (sigmoid(gate([h; W1[prev]])) * W1[prev]); rnn: GRU-like state."""

    def __init__(self, kind: str, vocab: int, rank: int, hidden: int) -> None:
        super().__init__()
        self.kind, self.rank = kind, rank
        self.markov_w1 = nn.Embedding(vocab, rank)
        self.markov_w2 = nn.Linear(rank, vocab, bias=False)
        if kind == "gated":
            self.gate_proj = nn.Linear(hidden + rank, rank)
        if kind == "rnn":
            self.joint_proj = nn.Linear(2 * rank + hidden, 3 * rank)

    def sample_block(self, base_logits, first_prev, hidden):
        """Greedy picking: (tokens [1, K], corrected logits [1, K, V])."""
        prev, state = first_prev.long(), torch.zeros(base_logits.shape[0], self.rank, dtype=hidden.dtype)
        tokens, rows = [], []
        for k in range(base_logits.shape[1]):
            e = self.markov_w1(prev)
            h = hidden[:, k]
            if self.kind == "vanilla":
                bias = self.markov_w2(e)
            elif self.kind == "gated":
                bias = self.markov_w2(torch.sigmoid(self.gate_proj(torch.cat([h, e], dim=-1))) * e)
            else:
                g, c, o = self.joint_proj(torch.cat([state, e, h], dim=-1)).chunk(3, dim=-1)
                g = torch.sigmoid(g)
                state = g * state + (1.0 - g) * torch.tanh(c)
                bias = self.markov_w2(torch.tanh(o))
            row = base_logits[:, k] + bias
            prev = row.argmax(dim=-1)
            tokens.append(prev)
            rows.append(row)
        return torch.stack(tokens, dim=1), torch.stack(rows, dim=1)


class RefConfidence(nn.Module):
    def __init__(self, width: int) -> None:
        super().__init__()
        self.proj = nn.Linear(width, 1)


class Qwen3DSparkModel(Qwen3PreTrainedModel):
    _no_split_modules = ["RefDSparkLayer"]

    def __init__(self, config) -> None:
        super().__init__(config)
        self.target_layer_ids = list(config.target_layer_ids)
        self.embed_tokens = nn.Embedding(config.vocab_size, config.hidden_size)
        self.layers = nn.ModuleList(RefDSparkLayer(config, i) for i in range(config.num_hidden_layers))
        self.norm = Qwen3RMSNorm(config.hidden_size, eps=config.rms_norm_eps)
        self.rotary_emb = Qwen3RotaryEmbedding(config)
        self.fc = nn.Linear(len(self.target_layer_ids) * config.hidden_size, config.hidden_size, bias=False)
        self.hidden_norm = Qwen3RMSNorm(config.hidden_size, eps=config.rms_norm_eps)
        self.lm_head = nn.Linear(config.hidden_size, config.vocab_size, bias=False)
        self.block_size = int(config.block_size)
        self.mask_token_id = int(config.mask_token_id)
        rank = int(config.markov_rank)
        self.markov_head = (RefMarkovHead(config.markov_head_type, config.vocab_size, rank, config.hidden_size)
                            if rank > 0 else None)
        self.with_markov = bool(getattr(config, "confidence_head_with_markov", False)) and config.enable_confidence_head
        self.confidence_head = (RefConfidence(config.hidden_size + (rank if self.with_markov else 0))
                                if config.enable_confidence_head else None)
        self.post_init()

    def backbone(self, position_ids, noise_embedding, target_hidden, past_key_values):
        ctx = self.hidden_norm(self.fc(target_hidden))
        h = noise_embedding
        rope = self.rotary_emb(h, position_ids)
        for layer in self.layers:
            h = layer(h, ctx, rope, past_key_values)
        return self.norm(h)

    def propose(self, anchor, hidden, threshold: float):
        """(drafted tokens [1, K], verify length) of one block's states ``hidden`` [1, K, D]."""
        base = self.lm_head(hidden)
        if self.markov_head is None:
            tokens = base.argmax(dim=-1)
        else:
            tokens, _ = self.markov_head.sample_block(base, anchor, hidden)
        length = self.block_size
        if self.confidence_head is not None:
            prev = torch.cat([anchor[:, None], tokens[:, :-1]], dim=1)
            feats = hidden
            if self.with_markov:
                feats = torch.cat([hidden, self.markov_head.markov_w1(prev)], dim=-1)
            logits = self.confidence_head.proj(feats).float()[..., 0]  # [1, K]
            if threshold > 0.0:
                below = (logits.sigmoid() < threshold)[0]
                if bool(below.any()):
                    length = int(below.nonzero()[0, 0])
        return tokens, length


@torch.inference_mode()
def ref_dspark_generate(model: Qwen3DSparkModel, target: nn.Module, input_ids: torch.Tensor, max_new_tokens: int,
                        stop_token_ids: Optional[list[int]], threshold: float = 0.0):
    """(generated ids, rounds): rounds = [(drafted tokens, verify length, accepted drafts)] per round."""
    model.eval()
    n_in = input_ids.shape[1]
    max_length = n_in + max_new_tokens
    size = model.block_size
    out_ids = torch.empty((1, max_length + size + 1), dtype=torch.long)
    pos = torch.arange(out_ids.shape[1])[None]
    target_cache, draft_cache = DynamicCache(), DynamicCache()
    out = target(input_ids, position_ids=pos[:, :n_in], past_key_values=target_cache, use_cache=True,
                 logits_to_keep=1, output_hidden_states=True)
    out_ids[:, :n_in] = input_ids
    out_ids[:, n_in] = out.logits[:, -1].argmax(dim=-1)
    stops = set(stop_token_ids or [])
    rounds = []
    if int(out_ids[0, n_in]) in stops:
        return out_ids[0, n_in:n_in + 1].tolist(), rounds
    feats = torch.cat([out.hidden_states[i + 1] for i in model.target_layer_ids], dim=-1)
    start = n_in
    while start < max_length:
        block = torch.full((1, size), model.mask_token_id, dtype=torch.long)
        block[:, 0] = out_ids[:, start]
        hidden = model.backbone(pos[:, draft_cache.get_seq_length():start + size], model.embed_tokens(block), feats,
                                draft_cache)
        ref_crop(draft_cache, start)
        tokens, length = model.propose(out_ids[:, start], hidden[:, :size], threshold)
        verify = torch.cat([out_ids[:, start:start + 1], tokens[:, :length]], dim=1)
        out = target(verify, position_ids=pos[:, start:start + length + 1], past_key_values=target_cache,
                     use_cache=True, output_hidden_states=True)
        choice = out.logits.argmax(dim=-1)  # [1, L + 1]
        accepted = int((verify[:, 1:] == choice[:, :-1]).long().cumprod(dim=1).sum())
        drafted = verify[0, 1:1 + accepted].tolist()
        hit = next((i for i, t in enumerate(drafted) if t in stops), None)
        rounds.append((tokens[0].tolist(), length, accepted))
        if hit is not None:  # a stop token among the accepted drafts ends the output there
            out_ids[:, start + 1:start + hit + 2] = verify[:, 1:hit + 2]
            start += hit + 1
            break
        out_ids[:, start + 1:start + accepted + 1] = verify[:, 1:accepted + 1]
        out_ids[:, start + accepted + 1] = choice[:, accepted]
        new = out_ids[0, start + 1:start + accepted + 2].tolist()
        start += accepted + 1
        ref_crop(target_cache, start)
        feats = torch.cat([out.hidden_states[i + 1] for i in model.target_layer_ids], dim=-1)[:, :accepted + 1]
        if any(t in stops for t in new):
            break
    gen = out_ids[0, n_in:min(start + 1, max_length)].tolist()
    cut = next((i for i, t in enumerate(gen) if t in stops), None)
    return (gen if cut is None else gen[:cut + 1]), rounds


__all__ = ["Qwen3DSparkModel", "ref_crop", "ref_dspark_generate"]
