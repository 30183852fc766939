"""dInfer's parallel decoders: ``hierarchy`` and ``credit``
(inclusionAI/dInfer ``python/dinfer/decoding/parallel_strategy.py``: ``HierarchyDecoder`` and
``CreditThresholdParallelDecoder``; arXiv 2510.08666; CreditDecoding arXiv 2510.06133).

Both are adaptive: the engine loops until the block has no masks, so ``steps`` is ignored.
Proposals are the arg-max (T = 0) or LLaDA's float64 Gumbel-max sample (T > 0), never the mask id
(dInfer drops positions whose proposal is the mask id; we take the runner-up instead, as every
sampler here). Confidence is ``p(x0)`` from a float64 softmax (dInfer uses the logits dtype or
float32; float64 keeps our threshold samplers on one footing).

- ``hierarchy`` (low_threshold 0.4, threshold 0.9): split the block's masked positions into maximal
  contiguous masked runs; in each run keep its most confident position if ``c > low_threshold``;
  add every position with ``c > threshold``; always add the row's most confident position.
  Effect: parallel commits are spread out, about one per masked run, which avoids the
  adjacent-duplicate failure ("the the"). Comparisons are strict, as dInfer's.
  Decisions: works at any batch size (the official decoder asserts batch 1); runs are found with a
  cumulative sum over run starts and the per-run arg-max with ``scatter_reduce``, no loops; a tie
  inside a run keeps only its leftmost position (dInfer keeps every tied position).
- ``credit`` (alpha 0.7, gamma 0.2, beta 0.8, threshold 0.9): a per-block credit tensor
  ``C`` [B, W, V] (W = block length), zero at each block start. Each step ``C <- beta * C``; at every
  masked position of the block add ``p_top1 ** gamma`` at its top-1 token; decode with the fused
  logits ``l + alpha * log(1 + C)`` under the threshold rule (commit ``c >= threshold``, always the
  most confident). ``p_top1`` comes from the RAW logits (``softmax(l)`` in float32, as dInfer's
  ``_apply_credit_fusion``), and the top-1 token is the raw arg-max excluding the mask id; the
  proposal and confidence that decide the commit come from the FUSED logits.
  Memory: B x W x V float32 (32 x 126464 x 4 bytes = 16 MB per row for LLaDA-8B).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from dllm.samplers._ops import propose_with_confidence, argmax_excluding, expand_window, gather_prob, propose
from dllm.samplers.base import Sampler, register_sampler
from dllm.state import DecodeState, StepInput, StepOutput


def _check_unit(name: str, value, *, low_open: bool = False) -> None:
    ok = isinstance(value, (int, float)) and not isinstance(value, bool) and value == value
    ok = ok and (0.0 < value <= 1.0 if low_open else 0.0 <= value <= 1.0)
    if not ok:
        interval = "(0, 1]" if low_open else "[0, 1]"
        raise ValueError(f"{name} must be in {interval}, got {value!r}")


def top1_onehot(score: torch.Tensor, eligible: torch.Tensor) -> torch.Tensor:
    """Per row, the eligible position with the largest score (none for a row with no eligible one).

    score: [B, Q] float; eligible: [B, Q] bool -> [B, Q] bool.
    """
    best = score.masked_fill(~eligible, float("-inf")).argmax(dim=1)  # [B]
    onehot = torch.zeros_like(eligible)
    onehot.scatter_(1, best[:, None], True)
    return onehot & eligible


def run_argmax(score: torch.Tensor, active: torch.Tensor) -> torch.Tensor:
    """In each maximal run of consecutive active positions, its highest-scoring position
    (leftmost on ties), as a bool map. score: [B, Q] float; active: [B, Q] bool -> [B, Q] bool."""
    bsz, q = active.shape
    prev = torch.zeros_like(active)
    prev[:, 1:] = active[:, :-1]
    starts = active & ~prev  # [B, Q] first position of each run
    run = starts.long().cumsum(dim=1) - 1  # [B, Q] run index (valid on active positions)
    run = torch.where(active, run, torch.full_like(run, q))  # inactive -> scratch slot q
    score = score.masked_fill(~active, float("-inf"))
    run_max = torch.full((bsz, q + 1), float("-inf"), dtype=score.dtype, device=score.device)
    run_max.scatter_reduce_(1, run, score, reduce="amax", include_self=True)  # [B, Q + 1]
    is_max = active & (score == run_max.gather(1, run))
    idx = torch.arange(q, device=score.device).expand(bsz, q)
    first = torch.full((bsz, q + 1), q, dtype=torch.long, device=score.device)
    first.scatter_reduce_(1, run, torch.where(is_max, idx, torch.full_like(idx, q)), reduce="amin",
                          include_self=True)
    return is_max & (idx == first.gather(1, run))


# ---- hierarchy -------------------------------------------------------------------------------------
@dataclass(frozen=True)
class HierarchyConfig:
    low_threshold: float = 0.4  # a run's best position is kept if c > this, in [0, 1]
    threshold: float = 0.9  # any masked position with c > this is kept, in [0, 1]

    def __post_init__(self) -> None:
        _check_unit("low_threshold", self.low_threshold)
        _check_unit("threshold", self.threshold)


@register_sampler("hierarchy")
class Hierarchy(Sampler):
    """dInfer hierarchy: the best of each masked run, every confident mask, and always the top-1."""

    Config = HierarchyConfig
    fixed_steps = False

    def step(self, inp: StepInput, state: DecodeState) -> StepOutput:
        tokens, conf = propose_with_confidence(inp)  # [B, Q], [B, Q] float64 (-inf off the window)
        active = inp.active
        per_run = run_argmax(conf, active) & (conf > self.config.low_threshold)
        commit = per_run | (active & (conf > self.config.threshold)) | top1_onehot(conf, active)
        return StepOutput(commit=commit, tokens=tokens, score=conf)


# ---- credit ----------------------------------------------------------------------------------------
@dataclass(frozen=True)
class CreditConfig:
    alpha: float = 0.7  # weight of log(1 + C) added to the logits, >= 0
    gamma: float = 0.2  # credit added per step is p_top1 ** gamma, >= 0
    beta: float = 0.8  # per-step decay of the credit, in [0, 1]
    threshold: float = 0.9  # commit fused confidence >= this (always the top-1), in (0, 1]

    def __post_init__(self) -> None:
        for name in ("alpha", "gamma"):
            value = getattr(self, name)
            if not isinstance(value, (int, float)) or isinstance(value, bool) or not value >= 0 \
                    or value == float("inf"):
                raise ValueError(f"{name} must be a finite number >= 0, got {value!r}")
        _check_unit("beta", self.beta)
        _check_unit("threshold", self.threshold, low_open=True)


@register_sampler("credit")
class Credit(Sampler):
    """dInfer CreditDecoding: threshold rule on logits fused with decayed per-block top-1 credit."""

    Config = CreditConfig
    fixed_steps = False

    def begin_block(self, state: DecodeState) -> None:
        state.extras["credit"] = None  # allocated at the block's first step (needs V)

    def step(self, inp: StepInput, state: DecodeState) -> StepOutput:
        cfg = self.config
        ws, we = inp.window
        logits = inp.logits[:, ws:we]  # [B, W, V] raw logits of the block
        active = inp.active[:, ws:we]  # [B, W]
        credit = state.extras.get("credit")
        if credit is None or credit.shape != logits.shape:
            credit = torch.zeros(logits.shape, dtype=torch.float32, device=logits.device)  # [B, W, V]
            state.extras["credit"] = credit
        else:
            credit.mul_(cfg.beta)
        # credit: raw top-1 token (never the mask id) gets p_top1 ** gamma, masked positions only
        raw_probs = torch.softmax(logits.float(), dim=-1)  # [B, W, V]
        top1 = argmax_excluding(logits, inp.mask_id)  # [B, W]
        boost = gather_prob(raw_probs, top1).pow(cfg.gamma) * active  # [B, W]
        credit.scatter_add_(2, top1[..., None], boost[..., None])
        fused = logits.float() + cfg.alpha * torch.log1p(credit)  # [B, W, V]

        x0 = propose(fused, inp.temperature, inp.generator, inp.mask_id)  # [B, W]
        conf_w = gather_prob(torch.softmax(fused.to(torch.float64), dim=-1), x0)  # [B, W]
        width = inp.logits.shape[1]
        tokens = expand_window(x0, inp.window, width, inp.mask_id)  # [B, Q]
        conf = expand_window(conf_w, inp.window, width, float("-inf"))  # [B, Q]
        commit = (inp.active & (conf >= cfg.threshold)) | top1_onehot(conf, inp.active)
        return StepOutput(commit=commit, tokens=tokens, score=conf)
