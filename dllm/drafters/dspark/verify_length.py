"""Verify-length policies: how much of a draft the target verifies, from per-position confidences.

DSpark (Cheng et al., arXiv 2607.05147, "confidence-scheduled verification") sends the target only
the prefix of a draft that is likely to survive: a confidence c_k in [0, 1] per drafted position
(DSpark's confidence head predicts the acceptance probability of position k given that the earlier
ones were accepted) becomes a per-row verify length L in 0..K, and the round forwards
``[anchor, d_1..d_L]`` instead of all K drafts. Any L is lossless (the target still emits its own
token after the last accepted draft); a good L spends fewer verified tokens on drafts that would be
rejected anyway.

Policies (registered, ``make_verify_length("threshold:threshold=0.5")``); each maps confidences
[R, K] to lengths [R] with tensor ops only:

- ``full``: L = K (plain speculative decoding).
- ``threshold``: L = the position of the first c_k below ``threshold`` (K when none is): the rule of
  the authors' released evaluator (DeepSpec ``deepspec/eval/dspark/draft_ops.py``,
  ``_confident_prefix_length``; its CLI default ``--confidence-threshold 0.0`` verifies everything).
- ``survival``: L = the number of positions whose prefix survival probability prod_{j <= k} c_j is
  at least ``threshold`` (the paper's scheduler ranks tokens by this product; it is non-increasing
  in k, so the kept positions are a prefix).

``min_length`` (both) keeps at least that many drafts whatever the confidences say. The paper's
hardware-aware part (a profiled throughput curve deciding a batch-wide token budget) is not here.

``top_confidence`` gives drafters without a confidence head a confidence: the top probability of
each position's distribution (``Draft.probs`` when the draft was sampled, else the softmax of
``Draft.logits``; at T = 0 the drafted token's probability). ``schedule_draft`` cuts a ``Draft`` to the
lengths. The ``scheduled`` drafter (``scheduled.py``) applies a policy to any drafter that returns
probs or logits.

Exactness at T > 0: the verify length must be a stopping rule, i.e. whether position k is verified
may depend on the drafts before it but not on d_k itself. DSpark's confidence head reads h_k and
d_{k-1} (never d_k), and the top probability of q_k is known before d_k is drawn, so both are exact. A
rule on q_k(d_k) (the sampled token's own probability) is not: it verifies d_k more often when d_k is
a likely draw, which biases the output (total variation 0.15 in the end-to-end distribution test,
where the top probability passes it).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar, Mapping, Union

import torch

from dllm.drafters.base import Draft
from dllm.options import check_int, check_unit
from dllm.registry import Configurable, NoOptions, Registry


class VerifyLength(Configurable):
    """Base class: ``lengths(confidence [R, K]) -> [R]`` long in 0..K."""

    kind: ClassVar[str] = "verify length policy"
    Config: ClassVar[type] = NoOptions

    @property
    def cuts(self) -> bool:
        """False when the policy keeps every draft whatever the confidences (no need to score them)."""
        return True

    def lengths(self, confidence: torch.Tensor) -> torch.Tensor:
        raise NotImplementedError


verify_lengths: Registry[type[VerifyLength]] = Registry("verify length policy", base=VerifyLength)
register_verify_length = verify_lengths.register_class

VerifyLengthSpec = Union[str, VerifyLength, Mapping[str, Any]]


def make_verify_length(spec: VerifyLengthSpec, **options: Any) -> VerifyLength:
    """A policy from a name (``"full"``), a spec string (``"threshold:threshold=0.5"``), a mapping
    with a ``"name"`` key, or an instance (returned as is)."""
    return verify_lengths.make(spec, **options)


def leading_count(keep: torch.Tensor) -> torch.Tensor:
    """[R, K] bool -> [R] long: how many leading entries of each row are True."""
    return keep.long().cumprod(dim=-1).sum(dim=-1)


@register_verify_length("full")
class FullLength(VerifyLength):
    """Verify every draft (L = K)."""

    @property
    def cuts(self) -> bool:
        return False

    def lengths(self, confidence: torch.Tensor) -> torch.Tensor:
        return torch.full(confidence.shape[:1], confidence.shape[1], dtype=torch.long, device=confidence.device)


@dataclass(frozen=True)
class ThresholdConfig:
    threshold: float = 0.5  # stop at the first position whose confidence is below this (0: never)
    min_length: int = 0  # keep at least this many drafts

    def __post_init__(self) -> None:
        check_unit("threshold", self.threshold, hint=" (a confidence: 0 verifies every draft)")
        check_int("min_length", self.min_length, 0, hint=" (drafts always verified)")


@register_verify_length("threshold")
class ThresholdLength(VerifyLength):
    """Verify up to the first draft whose confidence is below ``threshold`` (DSpark's released rule)."""

    Config = ThresholdConfig

    @property
    def cuts(self) -> bool:
        return self.config.threshold > 0

    def lengths(self, confidence: torch.Tensor) -> torch.Tensor:  # [R, K] -> [R]
        n = leading_count(confidence >= self.config.threshold)
        return n.clamp(min=min(self.config.min_length, confidence.shape[1]))


@register_verify_length("survival")
class SurvivalLength(VerifyLength):
    """Verify the drafts whose prefix survival probability prod_{j<=k} c_j is >= ``threshold``."""

    Config = ThresholdConfig

    @property
    def cuts(self) -> bool:
        return self.config.threshold > 0

    def lengths(self, confidence: torch.Tensor) -> torch.Tensor:  # [R, K] -> [R]
        survival = confidence.float().clamp(0.0, 1.0).cumprod(dim=-1)  # [R, K], non-increasing
        n = leading_count(survival >= self.config.threshold)
        return n.clamp(min=min(self.config.min_length, confidence.shape[1]))


def top_confidence(draft: Draft) -> torch.Tensor:
    """[R, W] each drafted position's top probability: of ``probs`` (the distributions the tokens were
    drawn from) when given, else of the softmax of ``logits``. Known before the position's token is
    drawn, so a verify length computed from it keeps exact sampling exact."""
    source = draft.probs if draft.probs is not None else draft.logits
    if source is None:
        raise ValueError("a verify-length policy needs the drafter's per-position distributions, but this "
                         "drafter returns tokens only (Draft.probs and Draft.logits are None); use a drafter "
                         "that gives them (dflash, dspark, dlm:marginals=true)")
    dist = source[:, :draft.tokens.shape[1]].float()
    if draft.probs is None:
        dist = dist.softmax(dim=-1)
    return dist.amax(dim=-1)  # [R, W]


def schedule_draft(draft: Draft, lengths: torch.Tensor) -> Draft:
    """``draft`` cut to per-row ``lengths`` [R] (capped by the drafter's own ``Draft.lengths``): the
    tokens, probs and logits narrowed to the longest kept row, so the round forwards only that. The
    width stays >= 1 (the general loop's hidden-state bookkeeping needs a drafted slot; a row of length
    0 accepts none of it), so a round where every row keeps nothing forwards ``[anchor, d_1]``."""
    w = draft.tokens.shape[1]
    lengths = lengths.to(draft.tokens.device).clamp(0, w)
    if draft.lengths is not None:
        lengths = torch.minimum(lengths, draft.lengths.to(lengths.device))
    # host sync, on purpose: the verify width is a shape
    width = min(w, max(1, int(lengths.max()))) if lengths.numel() else w
    return Draft(tokens=draft.tokens[:, :width], lengths=lengths,
                 probs=None if draft.probs is None else draft.probs[:, :width],
                 logits=None if draft.logits is None else draft.logits[:, :width],
                 forwards=draft.forwards, paths=draft.paths)


__all__ = ["FullLength", "SurvivalLength", "ThresholdLength", "VerifyLength", "VerifyLengthSpec", "leading_count",
           "make_verify_length", "register_verify_length", "schedule_draft", "top_confidence", "verify_lengths"]
