"""The DSpark drafter model (arXiv 2607.05147; authors' code DeepSpec ``deepspec/modeling/dspark/qwen3/
modeling.py`` ``Qwen3DSparkModel``, inference in ``deepspec/eval/dspark/draft_ops.py``).

1. Parallel backbone: the DFlash body (``dflash.model.DFlashDrafter``: fused target taps injected as
   context K/V into a few non-causal layers). DSpark's block convention differs from DFlash's: the
   block of K slots ``[anchor, MASK x (K-1)]`` sits at positions ``anchor_pos + 0..K-1`` and slot k
   predicts the token at ``anchor_pos + k + 1``, so a block of K slots drafts K tokens (the anchor's
   slot drafts the next token; DFlash drops it). The checkpoint's ``block_size`` is K.
2. Base logits ``lm_head(h_k)`` with the drafter's own ``embed_tokens`` and ``lm_head`` (trained
   frozen copies of the target's, stored in the checkpoint).
3. Sequential head (``markov.py``): logits_k = base_k + bias(x_{k-1}, h_k), tokens picked left to right.
4. Confidence head (``confidence_head.proj``): c_k = sigmoid(w . [h_k ; W1[x_{k-1}]] + b) (without the
   Markov embedding when ``confidence_head_with_markov`` is false), trained to predict position k's
   acceptance probability 1 - TV(draft_k, target_k); the verify-length policy reads it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

import torch
import torch.nn as nn
import torch.nn.functional as F

from dllm.drafters.dflash.cache import DraftKVCache
from dllm.drafters.dflash.config import DFlashConfig
from dllm.drafters.dflash.model import DFlashDrafter, make_block
from dllm.drafters.dspark.markov import MARKOV_TYPES, MarkovHead
from dllm.drafters.verify import SamplingParams, sample_categorical, target_probs
from dllm.options import check_bool, check_choice, check_int


@dataclass(frozen=True)
class DSparkHeads:
    """DSpark's additions to the backbone (config.json fields of the same names)."""

    markov_rank: int = 0  # r of the sequential head; 0 = none (a plain parallel drafter)
    markov_head_type: str = "vanilla"  # vanilla | gated | rnn
    enable_confidence_head: bool = False
    confidence_head_with_markov: bool = False  # the confidence head also reads W1[x_{k-1}]

    def __post_init__(self) -> None:
        check_int("markov_rank", self.markov_rank, 0, hint=" (0: no sequential head)")
        check_choice("markov_head_type", self.markov_head_type, MARKOV_TYPES)
        check_bool("enable_confidence_head", self.enable_confidence_head)
        check_bool("confidence_head_with_markov", self.confidence_head_with_markov)
        if self.enable_confidence_head and self.confidence_head_with_markov and self.markov_rank == 0:
            raise ValueError("confidence_head_with_markov needs a Markov head (markov_rank > 0)")


@dataclass(frozen=True)
class DSparkConfig:
    backbone: DFlashConfig  # block_size = K, the slots (and drafts) of one block
    heads: DSparkHeads


class ConfidenceHead(nn.Module):
    """One linear unit: features [..., F] -> confidence logits [...] (``confidence_head.proj``)."""

    def __init__(self, width: int) -> None:
        super().__init__()
        self.proj = nn.Linear(width, 1)

    def forward(self, features: torch.Tensor) -> torch.Tensor:
        return self.proj(features).squeeze(-1)


class DSparkModel(DFlashDrafter):
    """DFlash backbone + own embedding / LM head + Markov head + confidence head (checkpoint names:
    ``embed_tokens``, ``lm_head``, ``markov_head.*``, ``confidence_head.proj``)."""

    def __init__(self, config: DSparkConfig, hf_config: Optional[dict] = None) -> None:
        super().__init__(config.backbone, hf_config)
        self.dspark = config
        b, h = config.backbone, config.heads
        self.embed_tokens = nn.Embedding(b.vocab_size, b.hidden_size)
        self.lm_head = nn.Linear(b.hidden_size, b.vocab_size, bias=False)
        self.markov_head = (MarkovHead(h.markov_head_type, b.vocab_size, h.markov_rank, b.hidden_size)
                            if h.markov_rank > 0 else None)
        self.confidence_head = None
        if h.enable_confidence_head:
            extra = h.markov_rank if h.confidence_head_with_markov else 0
            self.confidence_head = ConfidenceHead(b.hidden_size + extra)

    def base_logits(self, hidden: torch.Tensor) -> torch.Tensor:  # [..., D] -> [..., V]
        return self.compute_logits(hidden, self.lm_head)

    def confidence_logits(self, hidden: torch.Tensor, prev: torch.Tensor) -> Optional[torch.Tensor]:
        """Confidence logits [..., K] (float32) from block states [..., K, D] and previous tokens [..., K]."""
        if self.confidence_head is None:
            return None
        features = hidden
        if self.dspark.heads.confidence_head_with_markov:
            features = torch.cat([hidden, self.markov_head.prev_embedding(prev).to(hidden.dtype)], dim=-1)
        return self.confidence_head(features).float()

    def block_states(self, block_ids: torch.Tensor, features: torch.Tensor, **kw) -> torch.Tensor:
        """Backbone final-norm states [B, T, D] of block ids [B, T] (keywords: ``DFlashDrafter.forward``)."""
        return self(F.embedding(block_ids, self.embed_tokens.weight), features, **kw)


@dataclass
class DSparkBlock:
    """One drafted block of K tokens."""

    tokens: torch.Tensor  # [R, K] long
    logits: torch.Tensor  # [R, K, V] the corrected logits (base + Markov bias) each token was picked from
    probs: Optional[torch.Tensor]  # [R, K, V] the distributions sampled tokens were drawn from (None: arg-max)
    confidence: Optional[torch.Tensor]  # [R, K] sigmoid of the confidence head (None: no head)


def pick_tokens(model: DSparkModel, base: torch.Tensor, hidden: torch.Tensor, anchor: torch.Tensor,
                params: SamplingParams, generator: Optional[torch.Generator],
                sample: bool = True) -> tuple[torch.Tensor, torch.Tensor, Optional[torch.Tensor]]:
    """Left-to-right picking through the Markov head: (tokens [R, K], logits [R, K, V], probs or None).

    base [R, K, V], hidden [R, K, D], anchor [R] (x_0). Greedy (or ``sample`` False): arg-max of each
    corrected row; else a draw from it warped like the target's (temperature, top-k, top-p)."""
    greedy = params.greedy or not sample
    head = model.markov_head
    if head is None:  # a plain parallel drafter: every position at once
        if greedy:
            return base.argmax(dim=-1), base, None
        q = target_probs(base, params)
        return sample_categorical(q, generator), base, q
    prev, state = anchor, head.initial_state(hidden[:, 0])
    tokens, logits, probs = [], [], []
    for k in range(base.shape[1]):  # K tiny steps: an embedding row and an r x V product each
        bias, state = head.step(prev, hidden[:, k], state)
        row = base[:, k] + bias.to(base.dtype)  # [R, V]
        if greedy:
            prev = row.argmax(dim=-1)
        else:
            q = target_probs(row, params)
            prev = sample_categorical(q, generator)
            probs.append(q)
        tokens.append(prev)
        logits.append(row)
    return (torch.stack(tokens, dim=1), torch.stack(logits, dim=1),
            torch.stack(probs, dim=1) if probs else None)


@torch.no_grad()
def draft_dspark(
    model: DSparkModel,
    cache: DraftKVCache,
    features: torch.Tensor,
    anchor: torch.Tensor,
    anchor_position: torch.Tensor,
    num_draft: int,
    params: SamplingParams,
    *,
    generator: Optional[torch.Generator] = None,
    sample: bool = True,
    feature_mask: Optional[torch.Tensor] = None,
    feature_positions: Optional[torch.Tensor] = None,
    row_lengths: Optional[torch.Tensor] = None,
    with_confidence: bool = True,
) -> DSparkBlock:
    """One round: the block ``[anchor, MASK x (K-1)]`` at ``anchor_position + 0..K-1`` through the
    backbone (appending the new features [R, N, L*D] to ``cache``), then the heads.

    row_lengths [R]: drafts each row may use; block slots past a row's length are hidden from it (it
    drafts as it would alone). anchor, anchor_position [R] long. ``with_confidence`` False skips the
    confidence head (a policy that never cuts)."""
    k = num_draft
    block = make_block(anchor, k, model.mask_token_id)  # [R, K]
    positions = anchor_position[:, None] + torch.arange(k, device=anchor.device)  # [R, K]
    valid = None
    if row_lengths is not None:
        valid = torch.arange(k, device=anchor.device)[None, :] < row_lengths.to(anchor.device)[:, None]  # [R, K]
    hidden = model.block_states(block, features, cache=cache, feature_mask=feature_mask,
                                feature_positions=feature_positions, block_positions=positions,
                                block_valid=valid)  # [R, K, D]
    base = model.base_logits(hidden)  # [R, K, V]
    tokens, logits, probs = pick_tokens(model, base, hidden, anchor, params, generator, sample)
    prev = torch.cat([anchor[:, None], tokens[:, :-1]], dim=1)  # [R, K]: x_{k-1}
    conf = model.confidence_logits(hidden, prev) if with_confidence else None
    return DSparkBlock(tokens=tokens, logits=logits, probs=probs, confidence=None if conf is None else conf.sigmoid())


__all__ = ["ConfidenceHead", "DSparkBlock", "DSparkConfig", "DSparkHeads", "DSparkModel", "draft_dspark",
           "pick_tokens"]
