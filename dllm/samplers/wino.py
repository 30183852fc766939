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
from dllm.samplers._ops import gather_prob, propose, take_top_k, window_output
from dllm.samplers.base import Sampler, register_sampler
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


def draft_cap(n_masks: torch.Tensor, ratio: float, low: int, high: int) -> torch.Tensor:
    """The most masks a step commits: ``min(max(floor(ratio * #masks), low), high)``; n_masks [B] -> [B] long."""
    return (n_masks.double() * ratio).floor().long().clamp(min=low, max=high)


def wide_in(conf: torch.Tensor, active: torch.Tensor, tau1: float, cap: torch.Tensor) -> torch.Tensor:
    """Masks to commit: ``conf > tau1``, or the ``cap`` most confident when more qualify.

    conf [B, W] float64 (any value off ``active``), active [B, W] bool, cap [B] long -> [B, W] bool.
    """
    want = active & (conf > tau1)
    over = want.sum(dim=1) > cap  # [B]
    return torch.where(over[:, None], take_top_k(conf, cap, active), want)


def narrow_out(conf_back: torch.Tensor, committed: torch.Tensor, tau2: float, accepted: torch.Tensor,
               last_accept: torch.Tensor) -> torch.Tensor:
    """Committed tokens to re-mask: shadow probability ``< tau2`` on rows that accepted more than one
    token; when ``last_accept`` or more qualify, only the ``last_accept - 1`` least confident.

    conf_back [B, W] float64, committed [B, W] bool, accepted / last_accept [B] long -> [B, W] bool.
    """
    low = committed & (conf_back < tau2) & (accepted > 1)[:, None]
    too_many = low.sum(dim=1) >= last_accept  # [B]
    lowest = low & take_top_k(-conf_back, last_accept - 1, committed)  # least confident first
    return torch.where(too_many[:, None], lowest, low)


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
            (state.batch_size,), START_LAST_ACCEPT, dtype=torch.long, device=state.x.device)

    def max_block_steps(self, block_len: int) -> int:
        return 2 * block_len  # re-masking stops after block_len steps, then >= 1 commit per step

    def step(self, inp: StepInput, state: DecodeState) -> StepOutput:
        assert inp.shadow_logits is not None, "the engine must provide shadow_logits for wino"
        cfg = self.config
        ws, we = inp.window
        logits = inp.logits[:, ws:we]  # [B, W, V]
        active = inp.active[:, ws:we]  # [B, W]
        current = inp.tokens[:, ws:we]  # [B, W]
        x0 = propose(logits, inp.temperature, inp.generator, inp.mask_id)  # [B, W]
        conf = gather_prob(torch.softmax(logits, dim=-1, dtype=torch.float64), x0)  # [B, W]
        n_masks = active.sum(dim=1)  # [B]
        cap = draft_cap(n_masks, cfg.accept_ratio, cfg.min_accept, cfg.max_accept)  # [B]
        commit = wide_in(conf, active, cfg.threshold, cap)  # [B, W]
        # the engine commits the top-1 of a row that chose none: it counts as one accepted token
        accepted = torch.where(n_masks > 0, commit.sum(dim=1).clamp(min=1), torch.zeros_like(n_masks))
        last_accept = state.extras["wino_last_accept"]
        committed = (current != inp.mask_id) & ~active  # earlier commits of the block
        back = gather_prob(torch.softmax(inp.shadow_logits, dim=-1, dtype=torch.float64), current)  # [B, W]
        remask = narrow_out(back, committed, cfg.threshold_back, accepted, last_accept)
        if state.block_step >= state.block_end - state.block_start:  # progress guarantee (docstring)
            remask = torch.zeros_like(remask)
        state.extras["wino_last_accept"] = torch.where(n_masks > 0, accepted, last_accept)
        return window_output(inp, commit, x0, conf.masked_fill(~active, float("-inf")), remask)
