"""dInfer's hierarchical parallel decoder (``hierarchy``; inclusionAI/dInfer
``python/dinfer/decoding/parallel_strategy.py`` ``HierarchyDecoder``; arXiv 2510.08666).

Rule (one step, per row; defaults low_threshold 0.4, threshold 0.9): split the block's masked
positions into maximal contiguous masked runs; in each run keep its most confident position if
``c > low_threshold``; add every position with ``c > threshold``; always add the row's most
confident position. Effect: parallel commits are spread out, about one per masked run, which
avoids the adjacent-duplicate failure ("the the"). Comparisons are strict, as dInfer's.

Adaptive: the engine loops until the block has no masks, so ``steps`` is ignored. Proposals are
the arg-max (T = 0) or LLaDA's float64 Gumbel-max sample (T > 0), never the mask id (dInfer drops
positions whose proposal is the mask id; we take the runner-up instead, as every sampler here).
Confidence is ``p(x0)`` from a float64 softmax (dInfer uses the logits dtype or float32; float64
keeps our threshold samplers on one footing).

Decisions: works at any batch size (the official decoder asserts batch 1); runs are found with a
cumulative sum over run starts and the per-run arg-max with ``scatter_reduce``, no loops; a tie
inside a run keeps only its leftmost position (dInfer keeps every tied position).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from dllm.options import check_unit
from dllm.samplers._ops import propose_with_confidence, top1
from dllm.samplers.base import Sampler, register_sampler
from dllm.state import DecodeState, StepInput, StepOutput


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
    is_max = active & (score == run_max.gather(1, run))  # [B, Q]
    idx = torch.arange(q, device=score.device).expand(bsz, q)  # [B, Q]
    first = torch.full((bsz, q + 1), q, dtype=torch.long, device=score.device)
    first.scatter_reduce_(1, run, torch.where(is_max, idx, torch.full_like(idx, q)), reduce="amin",
                          include_self=True)  # [B, Q + 1] leftmost maximum of each run
    return is_max & (idx == first.gather(1, run))


@dataclass(frozen=True)
class HierarchyConfig:
    low_threshold: float = 0.4  # a run's best position is kept if c > this, in [0, 1]
    threshold: float = 0.9  # any masked position with c > this is kept, in [0, 1]

    def __post_init__(self) -> None:
        check_unit("low_threshold", self.low_threshold)
        check_unit("threshold", self.threshold)


@register_sampler("hierarchy")
class Hierarchy(Sampler):
    """dInfer hierarchy: the best of each masked run, every confident mask, and always the top-1."""

    Config = HierarchyConfig
    fixed_steps = False

    def step(self, inp: StepInput, state: DecodeState) -> StepOutput:
        tokens, conf = propose_with_confidence(inp)  # [B, Q], [B, Q] float64 (-inf off the window)
        active = inp.active  # [B, Q]
        per_run = run_argmax(conf, active) & (conf > self.config.low_threshold)
        commit = per_run | (active & (conf > self.config.threshold)) | top1(conf, active)
        return StepOutput(commit=commit, tokens=tokens, score=conf)
