"""dInfer's hierarchical parallel decoder (``hierarchy``; inclusionAI/dInfer
``python/dinfer/decoding/parallel_strategy.py`` ``HierarchyDecoder``; arXiv 2510.08666).

Rule (one step, per row; defaults low_threshold 0.4, threshold 0.9): split the block's masked
positions into maximal contiguous masked runs; in each run keep its most confident position if
``c > low_threshold``; add every position with ``c > threshold``; always add the row's most
confident position. Effect: parallel commits are spread out, about one per masked run, which
avoids the adjacent-duplicate failure ("the the"). Comparisons are strict, as dInfer's. dInfer's
decoder defaults to no ``threshold`` (``threshold=1.0`` here); its scripts pass 0.3 / 0.9.

Adaptive: the engine loops until the block has no masks, so ``steps`` is ignored. Proposals are
the arg-max (T = 0) or LLaDA's float64 Gumbel-max sample (T > 0), never the mask id (dInfer's
decoder commits a mask-id proposal, so the position stays masked and is decoded again; we take the
runner-up instead, as every sampler here). Confidence is ``p(x0)`` from a float64 softmax (dInfer:
``exp(log_softmax)`` in the logits dtype, bfloat16 on its released models; float64 keeps our
threshold samplers on one footing).

Compared with the authors' code (tests/samplers/test_hierarchy_upstream.py against the transcription
tests/reference/decoders/hierarchy_generate.py of dInfer at fce4e32: ``HierarchyDecoder`` driven by
``generate_uniform.py``'s ``BlockWiseDiffusionLLM`` and ``BlockDiffusionLLMAttnmask``): with
``stop_at_eos=True`` (dInfer's loop always stops after the block holding EOS; its ``early_stop`` fills the
rest with EOS) the same tokens, and as many forwards as dInfer's that found a mask in their block (its
unrolled loop runs a few more on full blocks), on PB-mini prompts with the decoder's, the scripts', the
evaluation guide's and our thresholds: tiny-llada with no cache and dInfer's ``dual`` / ``prefix`` caches,
tiny-dream (dInfer's ``use_shift``), a tiny LLaDA 2 on its block grid (``none`` / ``block``), greedy and
sampled. Residual differences: the three decisions below, the confidence dtype and the mask id above
(runs that hit them are skipped there), and the layout of dInfer's LLaDA scripts
(``BlockIteratorFactory(start_block_align=True)``: blocks on the grid from column 0, so the first one is
shorter); ours start at the prompt's end, as the factory's default.

Decisions: works at any batch size (the official decoder asserts batch 1); a run is labelled by the
count of inactive positions before it (one cumulative sum) and its arg-max found with two
``scatter_reduce``, no loops; a tie inside a run keeps only its leftmost position (dInfer keeps every
tied position).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Optional

import torch

from dllm.options import check_unit
from dllm.samplers._ops import propose_with_confidence
from dllm.samplers.base import Sampler, register_sampler
from dllm.samplers.chunked import column_ids, constant, neg_inf
from dllm.state import DecodeState, StepInput, StepOutput


def _fixed(key: tuple, make: Callable[[], torch.Tensor]) -> torch.Tensor:
    """A constant tensor of this sampler, made once per key (``chunked.constant``; the key names the device)."""
    return constant(("hierarchy", *key), make)


def run_firsts(score: torch.Tensor, active: torch.Tensor) -> torch.Tensor:
    """``run_argmax`` before its ``& active``: True at each run's leftmost maximum, and at inactive
    positions whose label holds no active one (the caller keeps active positions). score [B, Q] with
    -inf off ``active`` [B, Q] bool -> [B, Q] bool.

    A position's run label is the number of inactive positions before it: one per run, and an inactive
    position shares the label of the run left of it (so it comes after that run's positions). Two
    ``scatter_reduce`` over the labels: the run's maximum (amax), then its leftmost holder (amin)."""
    bsz, q = score.shape
    dev = score.device
    idx = column_ids(q, dev)  # [Q]
    label = idx + active - active.cumsum(dim=1)  # [B, Q] in [0, Q)
    low = _fixed(("-inf", bsz, q, score.dtype, dev), lambda: torch.full((bsz, q), float("-inf"), dtype=score.dtype,
                                                                      device=dev))
    run_max = torch.scatter_reduce(low, 1, label, score, reduce="amax", include_self=True)  # [B, Q] by label
    is_max = score == run_max.gather(1, label)  # [B, Q]
    none = _fixed(("none", bsz, q, dev), lambda: torch.full((bsz, q), q, device=dev))
    first = torch.scatter_reduce(none, 1, label, torch.where(is_max, idx, q), reduce="amin", include_self=True)
    return idx == first.gather(1, label)  # [B, Q] the leftmost maximum of each label


def run_argmax(score: torch.Tensor, active: torch.Tensor) -> torch.Tensor:
    """In each maximal run of consecutive active positions, its highest-scoring position
    (leftmost on ties), as a bool map. score: [B, Q] float; active: [B, Q] bool -> [B, Q] bool."""
    return run_firsts(torch.where(active, score, neg_inf(score.device)), active) & active


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

    @property
    def commits_every_step(self) -> bool:
        return True  # the row's most confident mask is always committed

    def joins_mid_block(self, width: int, steps: Optional[int]) -> bool:
        return True  # runs, bars and the top-1 read each row's own masks only, no step index

    def step(self, inp: StepInput, state: DecodeState) -> StepOutput:
        cfg = self.config
        tokens, conf = propose_with_confidence(inp)  # [B, Q], [B, Q] float64 (-inf off the window)
        active = inp.active  # [B, Q]
        score = torch.where(active, conf, neg_inf(conf.device))  # [B, Q]
        dev = score.device
        # a run's best passes at c > low_threshold (or > threshold), any other mask at c > threshold, the
        # row's best at any c (-inf: off the masks nothing passes, so the commit holds masks only)
        low, high = (_fixed(("threshold", t, dev), lambda t=t: torch.full((), t, dtype=torch.float64, device=dev))
                     for t in (min(cfg.low_threshold, cfg.threshold), cfg.threshold))
        bar = torch.where(run_firsts(score, active), low, high)  # [B, Q] float64
        bar.scatter_(1, score.argmax(dim=1, keepdim=True), float("-inf"))
        return StepOutput(commit=score > bar, tokens=tokens, score=conf, active_only=True)
