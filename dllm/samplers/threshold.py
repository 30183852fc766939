"""Fast-dLLM's confidence-aware parallel decoding: ``threshold`` and ``factor``
(NVlabs/Fast-dLLM ``llada/generate.py`` ``get_transfer_index`` / ``get_transfer_index_dynamic``;
arXiv 2505.22618).

Both are adaptive: the engine loops until the block has no masks, so ``generate``'s ``steps`` is
ignored. Proposals are the arg-max (T = 0) or LLaDA's float64 Gumbel-max sample (T > 0);
confidence is ``p(x0)`` from a float64 softmax, as Fast-dLLM computes it (``stats=torch``), or from
the fused Triton kernel (``stats=fused|auto``, ``dllm.samplers.stats``).

- ``threshold`` (tau, default 0.9): commit every active mask with ``c >= tau``, and always the
  most confident one. Theorem 1 of the paper: when n tokens each have ``p > 1 - eps`` and
  ``(n + 1) eps <= 1``, the product-of-marginals arg-max equals the joint arg-max.
  ``schedule_steps=S`` (default None: off) adds the cap of Fast-dLLM's Dream ``confidence_threshold``
  (``dream/model/generation_utils.py``): a block of m masks gets the step quotas of ``S`` steps,
  ``n_i = m // S + (i < m % S)`` (Fast-dLLM requires ``m % S == 0``: ``m / S`` each), and a step may
  commit at most its quota plus what earlier steps left (the threshold's rejects carry over), i.e.
  ``cap_i = masks left - (n_{i+1} + ... + n_{S-1})``: of the top ``cap_i`` masks by confidence, the
  ones with ``c >= tau``, and always the top-1. From step S - 1 on the cap is every remaining mask;
  Fast-dLLM then adds steps until the block is full, as the adaptive loop does. ``generate``'s
  ``steps`` does not reach an adaptive sampler, hence the option. How the capped set is picked
  (``ties``, read only with ``schedule_steps``):

  - ``reference`` (default): as Fast-dLLM's Dream does it -- the confidence is ``p(x0)`` from a
    softmax in the logits' dtype (Dream's ``sample_tokens``), and every step (capped or not) takes
    ``torch.topk`` of that confidence over the [B, L] canvas (-inf off the block's masks) with
    ``cap_i`` entries: rank 0 always, every later rank with ``c >= tau``. Where float32
    confidences saturate at exactly 1.0 (peaked logits) many masks tie at the cut, and which of
    them ``topk`` returns is the device's order (CUDA: lowest index first; the CPU kernel: its
    own); this option resolves them as the reference does on the same device (``ties=first``
    does not: saturated logits then differ from the transcription). It reads each row's cap on the
    host (one sync per step), and
    a row's ties depend on its canvas, so in a left-padded batch a saturated row may resolve them
    otherwise than alone (Fast-dLLM's Dream decodes batch 1).
  - ``first``: ``p(x0)`` as ``stats`` computes it (float64 with ``stats=torch``), equal
    confidences at the cap taken lowest index first (a stable sort), sync-free, batch-invariant.

  With one block (Fast-dLLM's Dream has no blocks; batch 1), no cache and T = 0, ``ties=reference``
  reproduces that decoder token for token and NFE for NFE.
- ``factor`` (f, default 1.0): sort active confidences ``c_(1) >= c_(2) >= ...``; commit the top
  ``n`` where ``n`` is the longest prefix with ``(k + 1)(1 - c_(k)) <= f`` for k = 2..n (top-1
  always). ``rule`` picks the form:

  - ``written`` (default): the rule as written above (the paper's; the d2Cache reimplementation's).
  - ``reference``: Fast-dLLM's code, ``get_transfer_index_dynamic``. Rank k passes when
    ``c_(k) >= 1 - f / (k + 1)`` (its thresholds, Python floats; within an ulp of the boundary the
    written product can round the other way, e.g. c = 0.95 at k = 19, f = 1), and the row's last
    rank N always passes: its walk adds one to ``top_i`` at ``N - 1`` whether it ran out there or
    broke there, so a first failure at k = N commits all N (with two masks left, both always go).

  Compared token for token with a transcription of Fast-dLLM's factor drivers (``generate``,
  ``generate_with_prefix_cache``, ``generate_with_dual_cache`` at f6b35ec with ``factor`` set:
  ``tests/reference/decoders/fastdllm_factor.py``, ``tests/samplers/test_factor_upstream.py``) on 16
  stress-suite prompts of tiny-llada, greedy, without a cache and with the prefix and dual caches, at
  f = 1.0 in blocks of 32 (Fast-dLLM's ``eval_gsm8k.sh``), 1.5 / 4 and 1.9 / 8: ``rule=reference``
  equals it in tokens and NFE on every prompt. ``written`` equals it with the last-rank quirk removed;
  against the original, at f = 1.0 / 32 it takes one forward more in 12-14 of the 16 blocks (the last
  masks of a block are committed one step apart) and ends in other tokens on 5-9 of the 16 prompts.
  Equal confidences at the cut are taken lowest index first here, in ``torch.topk``'s (device) order
  there (none on those prompts). Fast-dLLM's Dream driver (``dream/model/generation_utils*.py``) has
  no factor mode (its ``alg`` is ``confidence_threshold`` or Dream's own), so on Dream models
  ``factor`` has no upstream to match.

NFE: one forward per step; a block takes as many steps as its masks need (at most its length).
With ``cache="prefix"`` / ``"dual"`` a block's first step is the block-start full forward; when
that forward already commits every mask of the block we move on to the next block. Fast-dLLM's
drivers of June 2025 (``llada/generate.py`` at 24cc59e) run one more cached forward in that case
-- a no-op, nothing is left to commit -- before testing whether the block is full, and count it, so
their NFE exceeds ours by the number of blocks filled by their first forward (at T = 0 the tokens
are equal; at T > 0 that forward also draws Gumbel noise); the later drivers (f6b35ec) test first
and count as we do.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

import torch

from dllm.options import check_choice, check_number, check_optional_int, check_unit
from dllm.samplers._ops import (
    TIES,
    expand_window,
    propose_with_confidence,
    take_top_k,
    threshold_commit,
    transfer_schedule,
)
from dllm.samplers.chunked import column_ids, constant, neg_inf, softmax_prob
from dllm.samplers.base import Sampler, register_sampler
from dllm.samplers.stats import check_stats
from dllm.state import DecodeState, StepInput, StepOutput

RESERVE_KEY = "threshold_reserve"  # state.extras[RESERVE_KEY]: [B, S] masks kept for later steps


@dataclass(frozen=True)
class ThresholdConfig:
    threshold: float = 0.9  # commit masks whose confidence is >= this, in (0, 1]
    stats: str = "torch"  # torch | fused | auto: where p(x0) is computed (dllm.samplers.stats)
    schedule_steps: Optional[int] = None  # S: cap each step by the quotas of S steps per block
    #   (Fast-dLLM's Dream confidence_threshold with steps = S); None: no cap
    ties: str = "reference"  # with schedule_steps, how the capped set is picked: reference (Fast-dLLM's
    #   Dream: logits-dtype confidences, torch.topk over the canvas) | first (lowest index among equals)

    def __post_init__(self) -> None:
        check_unit("threshold", self.threshold, low_open=True)
        check_stats(self.stats)
        check_optional_int("schedule_steps", self.schedule_steps, 1)
        check_choice("ties", self.ties, TIES)


def later_quotas(masks_at_start: torch.Tensor, steps: int) -> torch.Tensor:
    """[B] masks at the block start, S steps -> [B, S]: ``sum_{j > i} n_j`` of the per-step quotas
    ``n_j = m // S + (j < m % S)``, the masks step i must leave for the steps after it."""
    quotas = transfer_schedule(masks_at_start, steps)  # [B, S]
    return quotas.flip(1).cumsum(1).flip(1) - quotas


def capped_threshold_as_reference(conf: torch.Tensor, caps: torch.Tensor, host_caps: list[int],
                                  eligible: torch.Tensor, tau: float, width: int, start: int) -> torch.Tensor:
    """Fast-dLLM's Dream step rule, per row j: ``torch.topk`` of the confidence over the canvas
    with ``caps[j]`` entries, rank 0 always committed and every later rank with ``c >= tau``.

    conf, eligible: [B, Q] (query coordinates, canvas columns ``start..start + Q``); caps: [B] long
    (at most the row's eligible count; 0 commits nothing) and ``host_caps`` the same B values as
    host ints (``topk``'s k); width: the canvas length L. The [B, L] tensor handed to ``topk`` holds
    -inf off the eligible masks, as the reference's ``full_conf`` does, so that equal confidences
    resolve as there. One ``topk`` call over the batch per distinct cap, each row taking the call of
    its own cap (a row's ``topk`` result does not depend on the other rows). Returns [B, Q] bool.
    """
    q = conf.shape[1]
    full = conf.new_full((conf.shape[0], width), float("-inf"))  # [B, L]
    full[:, start:start + q] = conf.masked_fill(~eligible, float("-inf"))
    commit = torch.zeros(full.shape, dtype=torch.bool, device=conf.device)  # [B, L]
    for k in sorted(set(host_caps) - {0}):
        values, idx = torch.topk(full, k, dim=-1)  # [B, k]
        keep = values >= tau
        keep[:, 0] = True  # rank 0 always
        chosen = torch.zeros_like(commit).scatter_(1, idx, keep)  # [B, L]
        commit = torch.where((caps == k)[:, None], chosen, commit)
    return commit[:, start:start + q] & eligible


@register_sampler("threshold")
class Threshold(Sampler):
    """Fast-dLLM: commit every mask with confidence >= threshold (always the most confident)."""

    Config = ThresholdConfig
    reads_block_only = True  # the engine computes the block's logits only
    fixed_steps = False

    @property
    def commits_every_step(self) -> bool:
        return self.config.schedule_steps is None  # threshold_commit always keeps the most confident mask

    @property
    def reads_block_masks(self) -> bool:
        return self.config.schedule_steps is not None  # the schedule's quotas (begin_block)

    def joins_mid_block(self, width: int, steps: Optional[int]) -> bool:
        return self.config.schedule_steps is None  # the threshold rule reads no step index

    def begin_block(self, state: DecodeState) -> None:
        if self.config.schedule_steps is not None:
            assert state.block_masks_at_start is not None
            # [B, S] for S <= the block's width: its most steps (one commit each), so more columns are never
            #   read, and with S >= the masks at the start the columns read are the same
            width = state.block_end - state.block_start
            state.extras[RESERVE_KEY] = later_quotas(state.block_masks_at_start, min(self.config.schedule_steps, width))

    def step(self, inp: StepInput, state: DecodeState) -> StepOutput:
        tokens, conf = propose_with_confidence(inp, self.config.stats)
        eligible = inp.active  # [B, Q]
        steps = self.config.schedule_steps
        if steps is None:
            return StepOutput(commit=threshold_commit(conf, eligible, self.config.threshold), tokens=tokens,
                              score=conf, active_only=True)
        cap = eligible.sum(dim=1)  # [B]; from step S - 1 on: every remaining mask
        if inp.step < steps - 1:
            cap = (cap - state.extras[RESERVE_KEY][:, inp.step]).clamp_min(0)  # >= 1 unless m < S
        # a row whose cap is 0 commits nothing here: the engine adds its most confident mask
        if self.config.ties == "reference":
            ws, we = inp.window
            x0 = tokens[:, ws:we]  # [B, W]
            logits = inp.logits[:, ws:we]  # [B, W, V]
            conf = expand_window(softmax_prob(logits, x0, dtype=logits.dtype), inp.window, conf.shape[1],
                                 float("-inf"))  # Dream's p(x0): the logits' dtype
            host_caps = cap.tolist()  # intentional host sync (ties=reference): topk's k per row
            commit = capped_threshold_as_reference(conf, cap, host_caps, eligible, self.config.threshold,
                                                   state.x.shape[1], inp.query_start)
        else:
            commit = threshold_commit(conf, take_top_k(conf, cap, eligible), self.config.threshold)
        return StepOutput(commit=commit, tokens=tokens, score=conf, active_only=True)  # within eligible


FACTOR_RULES = ("written", "reference")


@dataclass(frozen=True)
class FactorConfig:
    factor: float = 1.0  # slack f of (k + 1)(1 - c_(k)) <= f, > 0
    stats: str = "torch"  # torch | fused | auto: where p(x0) is computed (dllm.samplers.stats)
    rule: str = "written"  # written (the longest prefix, as stated) | reference (Fast-dLLM's
    #   get_transfer_index_dynamic: its thresholds 1 - f / (k + 1), and the row's last rank always passes)

    def __post_init__(self) -> None:
        check_number("factor", self.factor, low=0.0, low_open=True)
        check_stats(self.stats)
        check_choice("rule", self.rule, FACTOR_RULES)


def factor_prefix(conf_sorted: torch.Tensor, factor: float) -> torch.Tensor:
    """Length of the longest prefix with ``(k + 1)(1 - c_(k)) <= f`` for k = 2..n (>= 1), the rule as
    written (``factor_prefix_mask`` is the step's form).

    conf_sorted: [B, N] descending (-inf past the active count). Returns [B] long.
    """
    k = torch.arange(1, conf_sorted.shape[1] + 1, device=conf_sorted.device, dtype=conf_sorted.dtype)
    ok = (k + 1) * (1 - conf_sorted) <= factor  # [B, N]
    ok[:, 0] = True  # top-1 always
    return ok.long().cumprod(dim=1).sum(dim=1)  # first failure ends the prefix


def factor_prefix_mask(conf_sorted: torch.Tensor, factor: float) -> torch.Tensor:
    """The prefix of ``factor_prefix`` as a bool map of the sorted axis, in five calls: the factors
    ``k + 1`` and the first column's bool are constants made once per shape, and the first failure
    ends the prefix by a running minimum. conf_sorted: [B, N] descending -> [B, N] bool."""
    n, device, dtype = conf_sorted.shape[1], conf_sorted.device, conf_sorted.dtype
    k1 = constant(("factor k + 1", n, device, dtype),
                  lambda: torch.arange(2, n + 2, device=device, dtype=dtype))  # [N]: k + 1 for k = 1..N
    first = constant(("first column", n, device), lambda: column_ids(n, device) == 0)  # [N]
    ok = (k1 * (1 - conf_sorted) <= factor) | first  # [B, N] top-1 always
    return ok.cummin(dim=1).values  # first failure ends the prefix


def factor_thresholds(n: int, factor: float, device: torch.device) -> torch.Tensor:
    """Fast-dLLM's per-rank thresholds ``1 - f / (k + 1)`` for k = 1..n as Python floats (float64),
    the first replaced by -1 (top-1 always); made once per (n, f, device). Returns [n] float64."""
    def make() -> torch.Tensor:  # float64 ops are IEEE's, as Python's floats: the same values, no upload
        ranks = torch.arange(2, n + 2, dtype=torch.float64, device=device)  # [n]: k + 1 = 2..n+1
        out = 1 - torch.full_like(ranks, factor) / ranks  # tensor / tensor: IEEE division (a scalar / tensor
        #   multiplies by the reciprocal, another rounding)
        out[0] = -1.0
        return out
    return constant(("factor thresholds", n, factor, device), make)


def factor_prefix_mask_as_reference(conf_sorted: torch.Tensor, active_count: torch.Tensor,
                                    factor: float) -> torch.Tensor:
    """Fast-dLLM's ``get_transfer_index_dynamic`` on the sorted axis: rank k passes when
    ``c_(k) >= 1 - f / (k + 1)`` (``factor_thresholds``, compared in float64 as there), and the row's last
    active rank N always passes (the original's ``top_i == N - 1`` increment: a walk whose first failure
    is rank N commits all N); the first failure ends the prefix.

    conf_sorted: [B, N] descending (-inf past the active count); active_count: [B] long. Returns [B, N] bool.
    """
    n, device = conf_sorted.shape[1], conf_sorted.device
    last = column_ids(n, device) == (active_count - 1)[:, None]  # [B, N] the row's last active rank
    ok = (conf_sorted >= factor_thresholds(n, factor, device)) | last  # [B, N]
    return ok.cummin(dim=1).values  # first failure ends the prefix


@register_sampler("factor")
class Factor(Sampler):
    """Fast-dLLM: commit the longest confidence prefix with (k+1)(1-c_k) <= factor (``rule=reference``:
    as Fast-dLLM's code does, module docstring)."""

    Config = FactorConfig
    reads_block_only = True  # the engine computes the block's logits only
    fixed_steps = False

    @property
    def commits_every_step(self) -> bool:
        return True  # the prefix holds rank 0 always: the row's most confident active mask

    def step(self, inp: StepInput, state: DecodeState) -> StepOutput:
        tokens, conf = propose_with_confidence(inp, self.config.stats)
        conf = torch.where(inp.active, conf, neg_inf(conf.device))  # [B, Q]
        sorted_conf, order = conf.sort(dim=1, descending=True, stable=True)  # [B, Q]
        if self.config.rule == "reference":
            within = factor_prefix_mask_as_reference(sorted_conf, inp.active.sum(dim=1), self.config.factor)
        else:
            within = factor_prefix_mask(sorted_conf, self.config.factor)  # [B, Q] in sorted order
        commit = within.scatter(1, order, within) & inp.active  # back to positions (order: a permutation)
        return StepOutput(commit=commit, tokens=tokens, score=conf, active_only=True)
