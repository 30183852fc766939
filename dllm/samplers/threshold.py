"""Fast-dLLM's confidence-aware parallel decoding: ``threshold`` and ``factor``
(NVlabs/Fast-dLLM ``get_transfer_index`` / ``get_transfer_index_dynamic``; arXiv 2505.22618).

Both are adaptive: the engine loops until the block has no masks, so ``steps`` is ignored.
Proposals are the arg-max (T = 0) or LLaDA's float64 Gumbel-max sample (T > 0); confidence is
``p(x0)`` from a float64 softmax, as Fast-dLLM computes it (``stats=torch``), or from the fused
Triton kernel (``stats=fused|auto``, ``dllm.samplers.stats``).

- ``threshold`` (tau, default 0.9): commit every active mask with ``c >= tau``, and always the
  most confident one. Theorem 1 of the paper: when n tokens each have ``p > 1 - eps`` and
  ``(n + 1) eps <= 1``, the product-of-marginals arg-max equals the joint arg-max.
- ``factor`` (f, default 1.0): sort active confidences ``c_(1) >= c_(2) >= ...``; commit the top
  ``n`` where ``n`` is the longest prefix with ``(k + 1)(1 - c_(k)) <= f`` for k = 2..n (top-1
  always). We do NOT reproduce the official quirk that commits all N when the first failure is at
  the last rank k = N (the d2Cache reimplementation does not have it either).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from dllm.samplers._ops import expand_window, gather_prob, gumbel_uniforms, propose, propose_with_confidence, ranks_of
from dllm.samplers.base import Sampler, register_sampler
from dllm.samplers.stats import check_stats, fused_propose, use_fused
from dllm.state import DecodeState, StepInput, StepOutput


@dataclass(frozen=True)
class ThresholdConfig:
    threshold: float = 0.9  # commit masks whose confidence is >= this, in (0, 1]
    stats: str = "torch"  # torch | fused | auto: where p(x0) is computed (dllm.samplers.stats)

    def __post_init__(self) -> None:
        if not isinstance(self.threshold, (int, float)) or not (0.0 < self.threshold <= 1.0):
            raise ValueError(f"threshold must be in (0, 1], got {self.threshold!r}")
        check_stats(self.stats)


@register_sampler("threshold", aliases=("fast_dllm",))
class Threshold(Sampler):
    """Fast-dLLM: commit every mask with confidence >= threshold (always the most confident)."""

    Config = ThresholdConfig
    fixed_steps = False

    def step(self, inp: StepInput, state: DecodeState) -> StepOutput:
        tokens, conf = propose_with_confidence(inp, self.config.stats)
        commit = inp.active & (conf >= self.config.threshold)
        # the engine adds the arg-max-confidence mask of any row that chose none
        return StepOutput(commit=commit, tokens=tokens, score=conf)


@dataclass(frozen=True)
class FactorConfig:
    factor: float = 1.0  # slack f of (k + 1)(1 - c_(k)) <= f, > 0
    stats: str = "torch"  # torch | fused | auto: where p(x0) is computed (dllm.samplers.stats)

    def __post_init__(self) -> None:
        if not isinstance(self.factor, (int, float)) or not (self.factor > 0):
            raise ValueError(f"factor must be > 0, got {self.factor!r}")
        check_stats(self.stats)


def factor_prefix(conf_sorted: torch.Tensor, factor: float) -> torch.Tensor:
    """Length of the longest prefix with ``(k + 1)(1 - c_(k)) <= f`` for k = 2..n (>= 1).

    conf_sorted: [B, N] descending (-inf past the active count). Returns [B] long.
    """
    k = torch.arange(1, conf_sorted.shape[1] + 1, device=conf_sorted.device, dtype=conf_sorted.dtype)
    ok = (k + 1) * (1 - conf_sorted) <= factor  # [B, N]
    ok[:, 0] = True  # top-1 always
    return ok.long().cumprod(dim=1).sum(dim=1)  # first failure ends the prefix


@register_sampler("factor")
class Factor(Sampler):
    """Fast-dLLM: commit the longest confidence prefix with (k+1)(1-c_k) <= factor."""

    Config = FactorConfig
    fixed_steps = False

    def step(self, inp: StepInput, state: DecodeState) -> StepOutput:
        tokens, conf = propose_with_confidence(inp, self.config.stats)
        conf = conf.masked_fill(~inp.active, float("-inf"))
        sorted_conf, order = conf.sort(dim=1, descending=True, stable=True)  # [B, Q]
        n = factor_prefix(sorted_conf, self.config.factor)  # [B]
        commit = inp.active & (ranks_of(order) < n[:, None])
        return StepOutput(commit=commit, tokens=tokens, score=conf)
