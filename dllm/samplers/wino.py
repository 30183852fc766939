"""WINO, Wide-In Narrow-Out: revocable parallel decoding (Feng-Hong/WINO-DLLM ``decoding_wino``;
arXiv 2507.18578).

Each step is ONE forward of the canvas plus a *shadow block* (``StepInput.shadow_logits``, see
``dllm.models.core.shadow``): the ordinary logits draft, the shadow's leave-one-out logits verify.

- Wide in: commit the active masks with confidence ``c > tau1`` (``p(x0)``, float64 softmax of the
  un-noised logits, proposals as Fast-dLLM / LLaDA draw them), at most ``max_accept = min(max(
  floor(0.7 * #masks), 5), 20)`` of them (the most confident when more qualify); none qualifying
  commits the top-1 (the engine's progress rule, scored by the same confidence).
- Narrow out: a token committed at an EARLIER step of the block whose shadow probability is
  ``< tau2`` is re-masked, only on steps that accepted more than one token, and when ``last_accept``
  or more qualify (``last_accept`` = tokens accepted at the previous step, 30 at a block start),
  only the ``last_accept - 1`` least confident.

Per row rather than over the flattened batch (the release runs batch 1), so a batch decodes every
row as it decodes alone. One deliberate addition for the engine's progress guarantee: no re-masking
after ``block_length`` steps of a block, so a block ends within ``2 * block_length`` steps (the
release's loop has no bound; an oscillating row would never finish). Defaults are the release's:
tau1 0.6, tau2 0.9. Not lossless; it can repair early mistakes.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from dllm.options import check_int, check_unit
from dllm.samplers._ops import gather_prob, propose_with_prob, ranks_of, window_of, window_output
from dllm.samplers.base import Sampler, register_sampler
from dllm.samplers.chunked import constant, neg_inf
from dllm.state import DecodeState, StepInput, StepOutput

START_LAST_ACCEPT = 30  # the release's ``last_accept`` at the start of every block


@dataclass(frozen=True)
class WinoConfig:
    threshold: float = 0.6  # tau1: commit masks with confidence > this, in (0, 1)
    threshold_back: float = 0.9  # tau2: re-mask committed tokens whose shadow probability is < this, in (0, 1]
    accept_ratio: float = 0.7  # max_accept = min(max(floor(ratio * #masks), min_accept), max_accept)
    min_accept: int = 5
    max_accept: int = 20

    def __post_init__(self) -> None:
        check_unit("threshold", self.threshold, low_open=True, high_open=True)
        check_unit("threshold_back", self.threshold_back, low_open=True)
        check_unit("accept_ratio", self.accept_ratio, low_open=True)
        check_int("min_accept", self.min_accept, 1)
        check_int("max_accept", self.max_accept, 1)
        if self.min_accept > self.max_accept:
            raise ValueError(f"min_accept ({self.min_accept}) must be <= max_accept ({self.max_accept})")


def as_column(counts: torch.Tensor) -> torch.Tensor:
    """Per-row counts [B] or [B, 1] -> [B, 1] (no call when already a column)."""
    return counts if counts.dim() == 2 else counts.reshape(-1, 1)


def draft_cap(n_masks: torch.Tensor, ratio: float, low: int, high: int) -> torch.Tensor:
    """The most masks a step commits: ``min(max(floor(ratio * #masks), low), high)``; n_masks [B] -> [B] long."""
    return (n_masks.double() * ratio).floor().long().clamp(min=low, max=high)


def draft_caps(width: int, ratio: float, low: int, high: int, device: torch.device) -> torch.Tensor:
    """``draft_cap`` of every mask count 0..W [W + 1] long (index it by the counts), made once per
    block width and options (``chunked.constant``)."""
    return constant(("draft caps", width, ratio, low, high, device),
                    lambda: draft_cap(torch.arange(width + 1, device=device), ratio, low, high))


def wide_in_count(conf: torch.Tensor, tau1: float, cap: torch.Tensor) -> torch.Tensor:
    """How many masks wide-in commits: ``min(#(conf > tau1), cap)``. The positions over ``tau1`` are
    the first of the stable descending confidence order, so the rule commits that many first ones
    (the ``cap`` most confident when more qualify). conf [B, W] float64, -inf off active; cap [B, 1]
    -> [B, 1] long."""
    return torch.minimum((conf > tau1).sum(dim=1, keepdim=True), cap)


def wide_in(conf: torch.Tensor, active: torch.Tensor, tau1: float, cap: torch.Tensor) -> torch.Tensor:
    """Masks to commit: ``conf > tau1``, or the ``cap`` most confident when more qualify.

    conf [B, W] float64 (any value off ``active``), active [B, W] bool, cap [B] or [B, 1] long -> [B, W] bool.
    """
    conf = torch.where(active, conf, neg_inf(conf.device))
    rank = ranks_of(conf.argsort(dim=1, descending=True, stable=True))  # [B, W]
    return rank < wide_in_count(conf, tau1, as_column(cap))


def narrow_out_of(back: torch.Tensor, tau2: float, accepted: torch.Tensor, last_accept: torch.Tensor) -> torch.Tensor:
    """``narrow_out`` on ``back`` = the shadow probabilities of the committed tokens, +inf elsewhere.

    The tokens under ``tau2`` are the first of the stable ascending order of ``back`` (the least
    confident first), so the rule re-masks its first ``min(#(back < tau2), last_accept - 1)``, none
    on a row that accepted at most one. accepted / last_accept [B, 1] long -> [B, W] bool."""
    rank = ranks_of(back.argsort(dim=1, stable=True))  # [B, W]
    low = torch.where(accepted > 1, (back < tau2).sum(dim=1, keepdim=True), 0)  # [B, 1]
    return rank < torch.minimum(low, last_accept - 1)


def narrow_out(conf_back: torch.Tensor, committed: torch.Tensor, tau2: float, accepted: torch.Tensor,
               last_accept: torch.Tensor) -> torch.Tensor:
    """Committed tokens to re-mask: shadow probability ``< tau2`` on rows that accepted more than one
    token; when ``last_accept`` or more qualify, only the ``last_accept - 1`` least confident.

    conf_back [B, W] float64, committed [B, W] bool, accepted / last_accept [B] or [B, 1] long -> [B, W] bool.
    """
    return narrow_out_of(torch.where(committed, conf_back, float("inf")), tau2, as_column(accepted),
                         as_column(last_accept))


@register_sampler("wino", description="WINO: wide-in threshold commits, narrow-out re-masking via a shadow block")
class Wino(Sampler):
    """Wide-in (commit c > tau1, capped) / narrow-out (re-mask earlier commits whose leave-one-out
    probability is < tau2) from one forward with a shadow block."""

    Config = WinoConfig
    fixed_steps = False
    shadow_block = True
    revises = True

    def begin_block(self, state: DecodeState) -> None:
        state.extras["wino_last_accept"] = torch.full(
            (state.batch_size, 1), START_LAST_ACCEPT, dtype=torch.long, device=state.x.device)  # [B, 1]

    def max_block_steps(self, block_len: int) -> int:
        return 2 * block_len  # re-masking stops after block_len steps, then >= 1 commit per step

    def step(self, inp: StepInput, state: DecodeState) -> StepOutput:
        assert inp.shadow_logits is not None, "the engine must provide shadow_logits for wino"
        cfg = self.config
        logits = window_of(inp.logits, inp.window)  # [B, W, V]
        active = window_of(inp.active, inp.window)  # [B, W] (the block's masks: the rest is committed)
        current = window_of(inp.tokens, inp.window)  # [B, W]
        x0, conf = propose_with_prob(logits, inp.temperature, inp.generator, inp.mask_id)  # [B, W], float64
        conf = torch.where(active, conf, neg_inf(conf.device))  # [B, W] also the step's score
        n_masks = active.sum(dim=1, keepdim=True)  # [B, 1]
        cap = draft_caps(active.shape[1], cfg.accept_ratio, cfg.min_accept, cfg.max_accept, active.device)[n_masks]
        rank = ranks_of(conf.argsort(dim=1, descending=True, stable=True))  # [B, W]
        count = wide_in_count(conf, cfg.threshold, cap)  # [B, 1]
        commit = rank < count  # [B, W] the first ``count`` of the confidence order
        last_accept = state.extras["wino_last_accept"]  # [B, 1]
        remask = None  # progress guarantee (docstring): none after block_length steps
        if state.block_step < state.block_end - state.block_start:
            back = gather_prob(torch.softmax(inp.shadow_logits, dim=-1, dtype=torch.float64), current)  # [B, W]
            # count > 1 exactly where the step accepted more than one token (below)
            remask = narrow_out_of(torch.where(active, float("inf"), back), cfg.threshold_back, count, last_accept)
        # the engine commits the top-1 of a row with masks that chose none: it counts as one accepted token
        state.extras["wino_last_accept"] = torch.where(n_masks > 0, count.clamp(min=1), last_accept)
        out = window_output(inp, commit, x0, conf, remask)
        out.active_only = True  # the commit holds active masks only
        return out
