"""The DFlash block drafter (arXiv 2602.06036; reference code z-lab/dflash ``dflash/model.py``).

A small Qwen3-style transformer that drafts a whole block ``[anchor, MASK x (B-1)]`` in one
forward, conditioned on hidden states tapped from the autoregressive target:

1. Tap: the target's hidden states after layers ``target_layer_ids`` of every committed token are
   concatenated, ``[T, L*D]`` (``extract_context_feature``).
2. Fuse: ``ctx = hidden_norm(fc(taps))`` -> one context feature ``[T, D]`` per committed token.
3. Embed the block with the target's (frozen) embedding table, times ``input_embedding_scale``.
4. Each layer (pre-norm, residual): queries come from the block only; keys/values are
   ``[k/v_proj(ctx) ; k/v_proj(block)]`` through the layer's *shared* K/V projections, ``k_norm``
   and RoPE applied to both (KV injection). Attention inside the block is non-causal. The context
   skips the layer's Q, O, residual and MLP. Then the SwiGLU MLP.
5. Final RMSNorm, then the target's (frozen) LM head on block positions 1..B-1: position k
   predicts the token at its own position ``anchor_pos + k``.

The context K/V of each layer go to a ``DraftKVCache`` and are reused by later rounds, so a round
only projects the features of the tokens committed since the previous one. Parameter names are
the checkpoint's (``layers.N.self_attn.q_proj.weight``, ``fc.weight``, ``hidden_norm.weight``, ...).
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import TYPE_CHECKING, Callable, Optional, Sequence, Union

import torch
import torch.nn as nn
import torch.nn.functional as F

from dllm.drafters.dflash.cache import DraftKVCache
from dllm.drafters.dflash.config import DFlashConfig, tap_layer_ids
from dllm.drafters.dflash.ops import (Rope, apply_rotary, attention_mask, next_positions, rope_frequencies,
                                      rope_tables)
from dllm.kernels.attention import sdpa_attention
from dllm.models.core.transformer import RMSNorm

if TYPE_CHECKING:
    from dllm.drafters.dflash.static_draft import StaticDraft

# this round's context K/V [B, Hkv, N, hd] -> the layer's stored + new K/V [B, Hkv, S+N, hd]
JoinKV = Callable[[torch.Tensor, torch.Tensor], tuple[torch.Tensor, torch.Tensor]]

_ACTIVATIONS: dict[str, Callable[[torch.Tensor], torch.Tensor]] = {
    "silu": F.silu, "swish": F.silu, "relu": F.relu, "gelu": F.gelu,
    "gelu_pytorch_tanh": functools.partial(F.gelu, approximate="tanh"),
}


def extract_context_feature(hidden_states: Sequence[torch.Tensor], layer_ids: Sequence[int]) -> torch.Tensor:
    """Concatenate the outputs of target decoder layers ``layer_ids`` -> [B, T, len(ids) * D].

    ``hidden_states`` is a transformers ``output_hidden_states`` tuple: entry 0 is the embedding
    output and entry ``i + 1`` the output of decoder layer i, hence the +1.
    """
    n = len(hidden_states)
    for i in layer_ids:
        if not 0 <= i + 1 < n:
            raise ValueError(f"tapped target layer {i} needs hidden_states[{i + 1}], but the target returned "
                             f"{n} hidden states (embeddings + {n - 1} layers)")
    return torch.cat([hidden_states[i + 1] for i in layer_ids], dim=-1)


# ----------------------------------------------------------------------------------------------
# Layers


class DFlashAttention(nn.Module):
    """Qwen3 attention (q_norm/k_norm per head, RoPE, GQA) with context K/V injected before the block's."""

    def __init__(self, cfg: DFlashConfig) -> None:
        super().__init__()
        self.num_heads, self.num_kv_heads, self.head_dim = cfg.num_heads, cfg.num_kv_heads, cfg.head_dim
        d, bias = cfg.hidden_size, cfg.attention_bias
        self.q_proj = nn.Linear(d, cfg.num_heads * cfg.head_dim, bias=bias)
        self.k_proj = nn.Linear(d, cfg.num_kv_heads * cfg.head_dim, bias=bias)
        self.v_proj = nn.Linear(d, cfg.num_kv_heads * cfg.head_dim, bias=bias)
        self.o_proj = nn.Linear(cfg.num_heads * cfg.head_dim, d, bias=bias)
        self.q_norm = RMSNorm(cfg.head_dim, cfg.rms_norm_eps)
        self.k_norm = RMSNorm(cfg.head_dim, cfg.rms_norm_eps)

    def _heads(self, x: torch.Tensor, n: int) -> torch.Tensor:  # [B, T, n*hd] -> [B, T, n, hd]
        return x.view(*x.shape[:2], n, self.head_dim)

    def key_value(self, x: torch.Tensor, rope: Rope) -> tuple[torch.Tensor, torch.Tensor]:
        """x [B, T, D] -> k (k_norm, RoPE) and v, each [B, Hkv, T, hd]."""
        k = self.k_norm(self._heads(self.k_proj(x), self.num_kv_heads)).transpose(1, 2)
        v = self._heads(self.v_proj(x), self.num_kv_heads).transpose(1, 2)
        return apply_rotary(k, rope), v

    def context_key_value(self, ctx: torch.Tensor, rope: Rope) -> tuple[torch.Tensor, torch.Tensor]:
        """Context features [B, N, D] -> k, v [B, Hkv, N, hd]: DFlash projects them with the block's own
        ``k_proj`` / ``v_proj`` (DFlare overrides this with separate projections)."""
        return self.key_value(ctx, rope)

    def forward(
        self,
        x: torch.Tensor,  # [B, T, D] normed block states
        ctx: torch.Tensor,  # [B, N, D] fused context features of this round
        rope_x: Rope,  # [B, 1, T, hd]
        rope_ctx: Rope,  # [B, 1, N, hd]
        join: JoinKV,
        mask: Optional[torch.Tensor],  # bool [B, 1, T, S+N+T] or None
    ) -> tuple[torch.Tensor, tuple[torch.Tensor, torch.Tensor]]:
        """-> (output [B, T, D], the layer's context K/V [B, Hkv, S+N, hd] for the cache)."""
        q = self.q_norm(self._heads(self.q_proj(x), self.num_heads)).transpose(1, 2)  # [B, H, T, hd]
        q = apply_rotary(q, rope_x)
        k_ctx, v_ctx = join(*self.context_key_value(ctx, rope_ctx))  # [B, Hkv, S+N, hd]
        k_x, v_x = self.key_value(x, rope_x)  # [B, Hkv, T, hd]
        keys, values = torch.cat([k_ctx, k_x], dim=2), torch.cat([v_ctx, v_x], dim=2)
        out, _ = sdpa_attention(q, keys, values, mask)  # [B, H, T, hd]
        out = out.transpose(1, 2).reshape(*x.shape[:2], self.num_heads * self.head_dim)
        return self.o_proj(out), (k_ctx, v_ctx)


class DFlashMLP(nn.Module):
    """SwiGLU: down(act(gate(x)) * up(x)), no biases."""

    def __init__(self, cfg: DFlashConfig) -> None:
        super().__init__()
        if cfg.hidden_act not in _ACTIVATIONS:
            raise ValueError(f"hidden_act {cfg.hidden_act!r} is not supported; valid: {sorted(_ACTIVATIONS)}")
        self.act = _ACTIVATIONS[cfg.hidden_act]
        self.gate_proj = nn.Linear(cfg.hidden_size, cfg.intermediate_size, bias=False)
        self.up_proj = nn.Linear(cfg.hidden_size, cfg.intermediate_size, bias=False)
        self.down_proj = nn.Linear(cfg.intermediate_size, cfg.hidden_size, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # [B, T, D] -> [B, T, D]
        return self.down_proj(self.act(self.gate_proj(x)) * self.up_proj(x))


class DFlashLayer(nn.Module):
    def __init__(self, cfg: DFlashConfig) -> None:
        super().__init__()
        self.self_attn = DFlashAttention(cfg)
        self.mlp = DFlashMLP(cfg)
        self.input_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.post_attention_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)

    def forward(
        self, h: torch.Tensor, ctx: torch.Tensor, rope_x: Rope, rope_ctx: Rope, join: JoinKV,
        mask: Optional[torch.Tensor],
    ) -> tuple[torch.Tensor, tuple[torch.Tensor, torch.Tensor]]:
        """h [B, T, D] -> (h [B, T, D], context K/V); the context is not normed here (it skips the layer)."""
        a, kv = self.self_attn(self.input_layernorm(h), ctx, rope_x, rope_ctx, join, mask)
        h = h + a
        h = h + self.mlp(self.post_attention_layernorm(h))
        return h, kv


# ----------------------------------------------------------------------------------------------
# The drafter


class DFlashDrafter(nn.Module):
    """DFlash draft body: fc + hidden_norm fusion, ``num_layers`` KV-injection layers, final norm.

    ``hf_config`` keeps the ``config.json`` it was loaded from, so that ``save_dflash`` writes
    fields this class does not use (``auto_map``, token ids, ...) back unchanged.
    """

    FUSION = "fc"  # what reads the tapped states (named in errors)

    def __init__(self, config: DFlashConfig, hf_config: Optional[dict] = None) -> None:
        super().__init__()
        self.config = config
        self.hf_config = dict(hf_config) if hf_config is not None else None
        d = config.hidden_size
        self.layers = nn.ModuleList(DFlashLayer(config) for _ in range(config.num_layers))
        self.norm = RMSNorm(d, config.rms_norm_eps)
        self.fc = nn.Linear(config.num_taps * d, d, bias=False)
        self.hidden_norm = RMSNorm(d, config.rms_norm_eps)
        self._rope: dict[torch.device, tuple[torch.Tensor, float]] = {}  # per device, not a buffer

    @property
    def block_size(self) -> int:
        return self.config.block_size

    @property
    def mask_token_id(self) -> int:
        return self.config.mask_token_id

    @property
    def target_layer_ids(self) -> tuple[int, ...]:
        return self.config.target_layer_ids

    @property
    def dtype(self) -> torch.dtype:
        """The drafter's compute dtype (its final norm's; norms are never quantized)."""
        return self.norm.weight.dtype

    def init_weights(self, std: float = 0.02, generator: Optional[torch.Generator] = None) -> None:
        """Qwen3 initialisation: Linear weights ~ N(0, std), biases 0, norm weights 1."""
        with torch.no_grad():
            for module in self.modules():
                if isinstance(module, nn.Linear):
                    module.weight.normal_(0.0, std, generator=generator)
                    if module.bias is not None:
                        module.bias.zero_()
                elif isinstance(module, RMSNorm):
                    module.weight.fill_(1.0)

    def fuse(self, features: torch.Tensor) -> torch.Tensor:
        """Tapped target states [B, N, L*D] -> context features hidden_norm(fc(.)) [B, N, D]."""
        return self.hidden_norm(self.fc(features.to(self.fc.weight.dtype)))

    def layer_contexts(self, features: torch.Tensor) -> list[torch.Tensor]:
        """Tapped target states [B, N, L*D] -> the context features each draft layer attends to, one
        [B, N, D] per layer: DFlash gives every layer the same ``fuse(features)`` (DFlare: its own)."""
        ctx = self.fuse(features)
        return [ctx] * self.config.num_layers

    def _rope_tables(self, positions: torch.Tensor, dtype: torch.dtype) -> Rope:
        if positions.device not in self._rope:
            self._rope[positions.device] = rope_frequencies(self.config, positions.device)
        inv_freq, scale = self._rope[positions.device]
        return rope_tables(positions, inv_freq, scale, dtype)

    def forward(
        self,
        block_embeds: torch.Tensor,  # [B, T, D] the embedded block (anchor + masks)
        features: torch.Tensor,  # [B, N, L*D] tapped target states of newly committed tokens
        *,
        cache: Optional[DraftKVCache] = None,
        feature_mask: Optional[torch.Tensor] = None,  # [B, N] bool, True = real token
        feature_positions: Optional[torch.Tensor] = None,  # [B, N] long
        block_positions: Optional[torch.Tensor] = None,  # [B, T] long
        attn_mask: Optional[torch.Tensor] = None,  # bool [B, 1, T, S+N+T]: replaces the built masks
        block_valid: Optional[torch.Tensor] = None,  # [B, T] bool: block positions that exist per row
    ) -> torch.Tensor:
        """Final-norm block states [B, T, D]; appends this round's context K/V to ``cache``.

        Default positions continue each row's real tokens: the k-th real new feature of row b sits
        at ``cache.num_tokens[b] + k`` and the block right after them (the anchor's position is
        the number of context tokens, since the anchor has no target feature yet). Without a cache
        the context is attended once and dropped. ``attn_mask`` (True = attend; keys ordered
        cached context, new context, block) overrides the padding / causal / window masks of every
        layer, e.g. to train several blocks in one forward (each sees only the context before its
        anchor and itself). ``block_valid`` hides a row's block positions past its own length from
        every query (a row with a shorter block in a batch drafts as it would alone).
        """
        b, t, _ = block_embeds.shape
        if features.dim() != 3 or features.shape[0] != b:
            raise ValueError(f"features must be [B={b}, N, {self.config.num_taps}*D], got {tuple(features.shape)}")
        width = self.config.num_taps * self.config.hidden_size
        if features.shape[-1] != width:
            raise ValueError(f"features have width {features.shape[-1]}, but {self.FUSION} expects {width} "
                             f"= {self.config.num_taps} tapped layers x hidden size {self.config.hidden_size}")
        cache = cache if cache is not None else DraftKVCache(self.config.num_layers)
        if feature_mask is not None:
            feature_mask = feature_mask.to(device=block_embeds.device, dtype=torch.bool)
        before = cache.tokens_so_far(b, block_embeds.device)  # [B]
        added, default_ctx, default_blk = next_positions(before, features.shape[1], t, feature_mask)
        feature_positions = default_ctx if feature_positions is None else feature_positions
        block_positions = default_blk if block_positions is None else block_positions

        dtype = self.dtype
        h = block_embeds.to(dtype)
        contexts = self.layer_contexts(features)  # per layer [B, N, D]
        rope_x = self._rope_tables(block_positions, dtype)
        rope_ctx = self._rope_tables(feature_positions, dtype)
        ctx_pos, ctx_valid = cache.slot_meta(feature_positions, feature_mask)  # [B, S+N]
        key_pos = torch.cat([ctx_pos, block_positions], dim=1)  # [B, S+N+T]
        key_valid = None
        if ctx_valid is not None or block_valid is not None:
            ctx_part = ctx_valid if ctx_valid is not None else torch.ones_like(ctx_pos, dtype=torch.bool)
            blk_part = (block_valid.to(device=block_positions.device, dtype=torch.bool) if block_valid is not None
                        else torch.ones_like(block_positions, dtype=torch.bool))
            key_valid = torch.cat([ctx_part, blk_part], dim=1)  # [B, S+N+T]
        masks: dict[tuple[bool, Optional[int]], Optional[torch.Tensor]] = {}
        keys: list[torch.Tensor] = []
        values: list[torch.Tensor] = []
        for i, layer in enumerate(self.layers):
            kind = (self.config.layer_causal(i), self.config.layer_window(i))
            if attn_mask is not None:
                masks[kind] = attn_mask
            elif kind not in masks:
                masks[kind] = attention_mask(block_positions, key_pos, key_valid, causal=kind[0], window=kind[1])
            h, (k, v) = layer(h, contexts[i], rope_x, rope_ctx, functools.partial(cache.joined, i), masks[kind])
            keys.append(k)
            values.append(v)
        cache.commit(keys, values, ctx_pos, ctx_valid, added)
        return self.norm(h)

    def compute_logits(self, hidden: torch.Tensor, lm_head: Union[nn.Module, torch.Tensor]) -> torch.Tensor:
        """Draft logits [.., V] from final-norm states through the target's LM head (module or [V, D]
        weight), times ``output_multiplier``, soft-capped when ``final_logit_softcapping`` > 0."""
        logits = F.linear(hidden, lm_head) if isinstance(lm_head, torch.Tensor) else lm_head(hidden)
        if self.config.output_multiplier != 1.0:
            logits = logits * self.config.output_multiplier
        cap = self.config.final_logit_softcapping
        if cap is not None and cap > 0:
            logits = torch.tanh(logits / cap) * cap
        return logits


# ----------------------------------------------------------------------------------------------
# One draft round


@dataclass
class DraftBlock:
    """One drafted block: outputs for block positions 1..T-1 (the anchor's row is dropped)."""

    tokens: torch.Tensor  # [B, T-1] long, per-position arg-max
    logits: torch.Tensor  # [B, T-1, V]
    hidden: torch.Tensor  # [B, T-1, D] final-norm states the LM head read


def target_embedding(target: nn.Module) -> torch.Tensor:
    """The target's input embedding matrix [V, D] (used raw: no embedding scale of the target's;
    whole, when transformers' tensor-parallel plan split it: ``dllm.drafters.target.whole_weight``)."""
    from dllm.drafters.target import whole_weight

    return whole_weight(target.get_input_embeddings())


def target_head(target: nn.Module) -> nn.Module:
    """The target's LM head module (``lm_head``, else its output embeddings; a whole copy of a split one)."""
    from dllm.drafters.target import whole_linear

    head = getattr(target, "lm_head", None)
    return whole_linear(head if head is not None else target.get_output_embeddings())


def make_block(anchor: torch.Tensor, size: int, mask_token_id: int) -> torch.Tensor:
    """Anchors [B] -> block ids [B, size] = [anchor, MASK x (size-1)]."""
    block = torch.full((anchor.shape[0], size), mask_token_id, dtype=torch.long, device=anchor.device)
    block[:, 0] = anchor
    return block


@torch.no_grad()
def draft_block(
    drafter: DFlashDrafter,
    cache: Union[DraftKVCache, "StaticDraft"],
    features: torch.Tensor,
    block_ids: torch.Tensor,
    *,
    embed_tokens: Union[nn.Module, torch.Tensor],
    lm_head: Union[nn.Module, torch.Tensor],
    feature_mask: Optional[torch.Tensor] = None,
    feature_positions: Optional[torch.Tensor] = None,
    block_positions: Optional[torch.Tensor] = None,
    block_valid: Optional[torch.Tensor] = None,
) -> DraftBlock:
    """Draft one block: logits and arg-max tokens for block positions 1..T-1.

    features: [B, N, L*D] tapped target states (``extract_context_feature``) of the tokens
    committed since the last call (the whole prompt on the first call); appended to ``cache``.
    block_ids: [B, T] ``[anchor, MASK, ...]``, T >= 2 (T may be below the trained block size).
    embed_tokens / lm_head: the target's embedding (module with ``.weight`` or [V, D] matrix,
    read raw) and LM head (module or [V, D] matrix). feature_mask / positions / block_valid: see
    ``DFlashDrafter.forward`` (defaults: right after each row's cached tokens; every block position).
    ``cache`` may be a ``StaticDraft`` (one row on a preallocated buffer, ``static_draft.py``): it then
    drafts, with the positions it keeps itself (masks and positions must be None).
    """
    weight = embed_tokens if isinstance(embed_tokens, torch.Tensor) else embed_tokens.weight
    cfg = drafter.config
    if cfg.mask_token_id >= weight.shape[0] or weight.shape[1] != cfg.hidden_size:
        raise ValueError(f"the target embedding is {tuple(weight.shape)}, but the drafter needs hidden size "
                         f"{cfg.hidden_size} and a row for mask_token_id {cfg.mask_token_id}")
    if block_ids.dim() != 2 or block_ids.shape[1] < 2:
        raise ValueError(f"block_ids must be [B, T] with T >= 2 (anchor + drafted positions), "
                         f"got {tuple(block_ids.shape)}")
    if not isinstance(cache, DraftKVCache):  # a StaticDraft
        if any(a is not None for a in (feature_mask, feature_positions, block_positions, block_valid)):
            raise ValueError("a StaticDraft keeps its own positions and drafts one unmasked row; pass no "
                             "feature_mask / positions / block_valid")
        return cache.draft(features, block_ids, weight, lm_head)
    embeds = F.embedding(block_ids, weight)  # [B, T, D]
    if cfg.input_embedding_scale != 1.0:
        embeds = embeds * cfg.input_embedding_scale
    hidden = drafter(embeds, features, cache=cache, feature_mask=feature_mask,
                     feature_positions=feature_positions, block_positions=block_positions,
                     block_valid=block_valid)[:, 1:]
    logits = drafter.compute_logits(hidden, lm_head)  # [B, T-1, V]
    return DraftBlock(tokens=logits.argmax(dim=-1), logits=logits, hidden=hidden)


__all__ = ["DFlashConfig", "DFlashDrafter", "DraftBlock", "DraftKVCache", "draft_block",
           "extract_context_feature", "make_block", "tap_layer_ids", "target_embedding",
           "target_head"]
