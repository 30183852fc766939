"""COVER, Cache Override Verification for Efficient Revision: revocable decoding that re-checks a
few committed tokens leave-one-out per step and revokes only those the check would really change
(Xiang et al., "Stop the Flip-Flop: Context-Preserving Verification for Fast Revocable Diffusion
Decoding", arXiv 2602.06161; no code released that we could find, so the rules below are our
restatement of the paper's abstract, and every constant that the abstract does not give is ours).

The flip-flop COVER stops: a revocable sampler such as ``wino`` re-masks a committed token whose
leave-one-out probability is low, and a later draft restores it unchanged (on tiny-llada, 125 of
wino's 130 re-masks over 40 PB-mini prompts), a step spent for nothing. Each step is
ONE forward of the canvas plus a leave-one-out view of the block (``StepInput.shadow_logits``):

- Draft (stable drafting): the ordinary rows see every committed token, seeds included. Commit
  the active masks with confidence ``c > threshold`` (float64 ``p(x0)``), at most
  ``min(max(floor(accept_ratio * #masks), min_accept), max_accept)`` (the most confident), else the
  top-1: the drafting rule of the revocable baseline the paper builds on (WINO's wide-in).
- Seeds: tokens this sampler committed at earlier steps of the block, scored for risk by
  ``(1 - p) + influence_weight * n_after / W + drift_weight * n_new / W``: ``p`` the token's latest
  probability evidence (its draft confidence, or its leave-one-out probability once verified;
  uncertainty), ``n_after`` the tokens committed at later steps with it in view (downstream
  influence), ``n_new`` the other committed tokens that entered the context since it was last
  judged (its context drift, the cache drift of the paper's in-place view), W the block length.
  The ``ceil(seed_ratio * a)`` (at most ``max_seeds``) highest scores ``>= seed_threshold`` are
  verified, ``a`` the tokens the previous step accepted (the adaptive budget: more tokens accepted
  at once, more checks). Seeds depend only on what earlier steps recorded, never on this step's
  logits, so an in-place forward could mask them before it runs.
- Verify: a seed passes when its leave-one-out probability is ``>= verify_threshold`` or, with
  ``same_argmax_passes`` (the flip-flop guard), when the leave-one-out arg-max is its own token
  (the view that doubts it would draft it again). A seed that passes takes its
  leave-one-out probability as new evidence and has no drift until the context changes again.
- Revoke: failing seeds are re-masked, the least likely first, at most ``accepted - 1`` per step,
  so every step leaves at least one mask fewer and a block ends within ``block_length`` steps.

What differs from the paper, and why: the leave-one-out view is the engine's shadow block (+W
query rows per forward, ``dllm.models.core.shadow``), not COVER's in-place KV override (the seeds
masked in the input, their cached K/V injected for every other query, a diagonal correction at
their own key: no extra rows, one stale K/V). The engine has no forward with a per-row K/V override
yet; see the docs entry (docs/guides/samplers.md) for what it would need. Batched and ragged (per-row
tensors, no host read); every cache policy that serves a shadow block (``none``, ``prefix``,
``dual``, ``auto``, ``window``; ``drift`` refuses it, as it refuses ``wino``).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

import torch

from dllm.options import check_bool, check_int, check_number, check_unit
from dllm.samplers._ops import propose_with_prob, ranks_of, window_of, window_output
from dllm.samplers.base import Sampler, register_sampler
from dllm.samplers.chunked import argmax_excluding, constant, neg_inf, softmax_prob
from dllm.samplers.wino import as_column, draft_caps, wide_in_count
from dllm.state import DecodeState, StepInput, StepOutput

KEY = "cover"  # state.extras key of the block's per-position records (``CoverRecords``)


@dataclass(frozen=True)
class CoverConfig:
    threshold: float = 0.6  # draft: commit masks with confidence > this, in (0, 1)
    accept_ratio: float = 0.7  # draft cap = min(max(floor(ratio * #masks), min_accept), max_accept)
    min_accept: int = 5
    max_accept: int = 20
    verify_threshold: float = 0.9  # a seed passes with leave-one-out probability >= this, in (0, 1]
    same_argmax_passes: bool = True  # ... or when the leave-one-out arg-max is its own token
    seed_ratio: float = 1.0  # seeds per step = ceil(seed_ratio * tokens the last step accepted), <= max_seeds
    max_seeds: int = 8
    seed_threshold: float = 0.05  # only tokens whose stability score is >= this are verified
    influence_weight: float = 0.5  # weight of the downstream-influence term of the score
    drift_weight: float = 0.5  # weight of the context-drift term of the score

    def __post_init__(self) -> None:
        check_unit("threshold", self.threshold, low_open=True, high_open=True)
        check_unit("accept_ratio", self.accept_ratio, low_open=True)
        check_int("min_accept", self.min_accept, 1)
        check_int("max_accept", self.max_accept, 1)
        if self.min_accept > self.max_accept:
            raise ValueError(f"min_accept ({self.min_accept}) must be <= max_accept ({self.max_accept})")
        check_unit("verify_threshold", self.verify_threshold, low_open=True)
        check_bool("same_argmax_passes", self.same_argmax_passes)
        check_number("seed_ratio", self.seed_ratio, low=0.0, finite=True, hint=" (0: verify nothing)")
        check_int("max_seeds", self.max_seeds, 0)
        check_number("seed_threshold", self.seed_threshold, low=0.0, finite=True)
        check_number("influence_weight", self.influence_weight, low=0.0, finite=True)
        check_number("drift_weight", self.drift_weight, low=0.0, finite=True)


@dataclass
class CoverRecords:
    """Per block position, [B, W]: what the last judgement of its committed token saw; per row
    [B, 1] (or [B]): the tokens the last step accepted."""

    p: torch.Tensor  # float64: the token's latest probability (draft confidence, or leave-one-out)
    seen: torch.Tensor  # long: other committed block tokens in view when it was last judged
    order: torch.Tensor  # long: block step at which it was committed (-1: not committed by cover)
    last_accept: torch.Tensor  # [B, 1] long: tokens the previous step of the block accepted (0 at its start)


def draft_count(conf: torch.Tensor, tau: float, cap: torch.Tensor, n_masks: torch.Tensor) -> torch.Tensor:
    """How many masks ``draft`` commits: wino's wide-in ``min(#(conf > tau), cap)``, at least one
    where the row has masks; they are the first of the stable descending confidence order.
    conf [B, W] float64, -inf off active; cap, n_masks [B, 1] long -> [B, 1] long."""
    return wide_in_count(conf, tau, cap).clamp(min=1).minimum(n_masks)


def draft(conf: torch.Tensor, active: torch.Tensor, tau: float, cap: torch.Tensor) -> torch.Tensor:
    """Masks to commit: ``conf > tau`` (the ``cap`` most confident when more qualify), else the top-1.
    conf [B, W] float64, active [B, W] bool, cap [B] or [B, 1] long -> [B, W] bool."""
    conf = torch.where(active, conf, neg_inf(conf.device))
    rank = ranks_of(conf.argsort(dim=1, descending=True, stable=True))  # [B, W] the active masks first
    return rank < draft_count(conf, tau, as_column(cap), active.sum(dim=1, keepdim=True))


def stability_score(rec: CoverRecords, committed: torch.Tensor, influence_weight: float,
                    drift_weight: float, others: Optional[torch.Tensor] = None) -> torch.Tensor:
    """``(1 - p) + w_i * n_after / W + w_d * n_new / W`` per committed position, [B, W] float64.

    committed: the positions with ``rec.order >= 0``. n_after: committed tokens of a later block
    step; n_new: the row's other committed tokens now (``others`` [B, 1], default counted), less
    those in view at the last judgement (>= 0)."""
    width = committed.shape[1]
    if others is None:
        others = committed.sum(dim=1, keepdim=True) - 1  # [B, 1]
    # a later step's token is committed: order[i] > order[j] >= 0
    n_after = (rec.order[:, None, :] > rec.order[:, :, None]).sum(dim=2, dtype=torch.float64)  # [B, W]
    n_new = (others - rec.seen).clamp(min=0).double()  # [B, W]
    return (1 - rec.p) + influence_weight * (n_after / width) + drift_weight * (n_new / width)


def seed_budgets(width: int, ratio: float, most: int, device: torch.device) -> torch.Tensor:
    """``min(ceil(ratio * a), most)`` for every accepted count a in 0..W [W + 1] long (index it by
    the counts), made once per block width and options (``chunked.constant``)."""
    return constant(("cover seed budgets", width, ratio, most, device),
                    lambda: (torch.arange(width + 1, device=device).double() * ratio).ceil().long().clamp(max=most))


def choose_seeds(rec: CoverRecords, committed: torch.Tensor, cfg: CoverConfig,
                 others: Optional[torch.Tensor] = None) -> torch.Tensor:
    """The committed tokens to verify this step, from the records only. [B, W] bool: the budget's
    highest scores among those ``>= seed_threshold`` (ties: the leftmost), which are the first of
    the committed tokens' stable descending order."""
    score = torch.where(committed, stability_score(rec, committed, cfg.influence_weight, cfg.drift_weight, others),
                        float("-inf"))  # [B, W]
    budget = seed_budgets(committed.shape[1], cfg.seed_ratio, cfg.max_seeds, committed.device)[rec.last_accept]
    rank = ranks_of(score.argsort(dim=1, descending=True, stable=True))  # [B, W]
    return (rank < as_column(budget)) & (score >= cfg.seed_threshold)


def revoke_ranked(q: torch.Tensor, fail: torch.Tensor, limit: torch.Tensor) -> torch.Tensor:
    """``revoke`` where the failing seeds are the first of the stable ascending order of ``q``:
    q [B, W] float64, +inf off the checked seeds (a checked seed that passes is above every failing
    one); fail [B, W] bool; limit [B, 1] long -> [B, W] bool."""
    rank = ranks_of(q.argsort(dim=1, stable=True))  # [B, W] the least likely first
    return (rank < limit) & fail


def revoke(q: torch.Tensor, fail: torch.Tensor, limit: torch.Tensor) -> torch.Tensor:
    """The failing seeds to re-mask: the ``limit`` least likely (ties: the leftmost).
    q [B, W] float64 leave-one-out probabilities, fail [B, W] bool, limit [B] or [B, 1] long -> [B, W] bool."""
    return revoke_ranked(torch.where(fail, q, float("inf")), fail, as_column(limit))


@register_sampler("cover", description="COVER: drafts, then verifies the riskiest earlier commits "
                                       "leave-one-out and revokes only those the check would change")
class Cover(Sampler):
    """Revocable decoding with a stability-ranked, budgeted leave-one-out check per step."""

    Config = CoverConfig
    fixed_steps = False
    shadow_block = True
    revises = True

    @property
    def commits_every_step(self) -> bool:
        return True  # the draft's top-1, and at most accepted - 1 revoked

    def begin_block(self, state: DecodeState) -> None:
        shape = (state.batch_size, state.block_end - state.block_start)
        dev = state.x.device
        state.extras[KEY] = CoverRecords(p=torch.zeros(shape, dtype=torch.float64, device=dev),
                                         seen=torch.zeros(shape, dtype=torch.long, device=dev),
                                         order=torch.full(shape, -1, dtype=torch.long, device=dev),
                                         last_accept=torch.zeros((shape[0], 1), dtype=torch.long, device=dev))

    def step(self, inp: StepInput, state: DecodeState) -> StepOutput:
        assert inp.shadow_logits is not None, "the engine must provide shadow_logits for cover"
        cfg, rec = self.config, state.extras[KEY]
        logits = window_of(inp.logits, inp.window)  # [B, W, V]
        active = window_of(inp.active, inp.window)  # [B, W]
        current = window_of(inp.tokens, inp.window)  # [B, W]
        # earlier commits of the block: a token cover committed stays until cover revokes it
        committed = rec.order >= 0  # [B, W]
        in_view = committed.sum(dim=1, keepdim=True)  # [B, 1] committed tokens this forward sees
        others = in_view - 1  # [B, 1]
        seeds = choose_seeds(rec, committed, cfg, others)  # [B, W]

        x0, p0 = propose_with_prob(logits, inp.temperature, inp.generator, inp.mask_id)  # [B, W], float64
        conf = torch.where(active, p0, float("-inf"))  # [B, W] float64
        n_masks = active.sum(dim=1, keepdim=True)  # [B, 1]
        cap = draft_caps(active.shape[1], cfg.accept_ratio, cfg.min_accept, cfg.max_accept, active.device)[n_masks]
        rank = ranks_of(conf.argsort(dim=1, descending=True, stable=True))  # [B, W]
        accepted = draft_count(conf, cfg.threshold, cap, n_masks)  # [B, 1] >= 1 in every row with masks
        commit = rank < accepted  # [B, W] the first ``accepted`` of the confidence order: active masks

        checked = seeds  # [B, W] the seeds that can fail: all, or those the leave-one-out view would not redraft
        if cfg.same_argmax_passes:
            checked = seeds & (argmax_excluding(inp.shadow_logits, inp.mask_id) != current)
        q = softmax_prob(inp.shadow_logits, current)  # [B, W] float64 leave-one-out p(token)
        q_checked = torch.where(checked, q, float("inf"))  # [B, W]
        fail = q_checked < cfg.verify_threshold  # [B, W] checked seeds only
        remask = revoke_ranked(q_checked, fail, accepted - 1)  # [B, W]

        # a seed that passes takes its leave-one-out evidence (a revoked one too: its records are not
        # read until a later commit sets them anew)
        rec.p = torch.where(commit, conf, torch.where(seeds, q, rec.p))
        rec.seen = torch.where(commit, in_view, torch.where(seeds, others, rec.seen))
        rec.order = torch.where(commit, state.block_step, torch.where(remask, -1, rec.order))
        rec.last_accept = accepted
        out = window_output(inp, commit, x0, conf, remask)
        out.active_only = True  # the commit holds active masks only
        return out


__all__ = ["Cover", "CoverConfig", "CoverRecords", "choose_seeds", "draft", "revoke", "stability_score"]
