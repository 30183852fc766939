"""LocalLeap, anchor-relaxed confidence thresholding (``localleap``; arXiv 2510.07081).

Rule (one step, per row), with confidence ``c_i = p_i(x0_i)`` of the proposal at active mask i:
anchors are the active masks with ``c >= tau``; commit the most confident active mask, plus every
active i with

    c_i >= tau_relax   if some anchor j has |i - j| <= radius   (an anchor's neighbourhood)
    c_i >= tau         otherwise

Anchors themselves pass (``c >= tau >= tau_relax``), so with no anchor this is Fast-dLLM's
``threshold`` rule at ``tau``. Distances are in canvas positions (committed positions count).

Adaptive: the engine loops until the block has no masks, so ``steps`` is ignored. Proposals are
the arg-max (T = 0) or LLaDA's float64 Gumbel-max sample (T > 0), never the mask id; confidence
from the float64 softmax (``fast_dllm.propose_with_confidence``).

Source and defaults: the paper gives the idea; the rule and the defaults ``tau = 0.9``,
``tau_relax = 0.75``, ``radius = 4`` (block 32) follow DAWN's reimplementation
(lizhuo-luo/DAWN ``get_transfer_index_localleap``), whose comparisons are inclusive (``>=``) and
whose neighbourhood is the closed interval ``[j - radius, j + radius]``.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from dllm.samplers._ops import propose_with_confidence, take_top_k
from dllm.samplers.base import Sampler, register_sampler
from dllm.state import DecodeState, StepInput, StepOutput


def near_anchor(anchor: torch.Tensor, radius: int) -> torch.Tensor:
    """[B, N] bool: position i has an anchor j with |i - j| <= radius (window sums of a cumsum)."""
    n = anchor.shape[1]
    csum = torch.nn.functional.pad(anchor.long().cumsum(dim=1), (1, 0))  # [B, N + 1], csum[:, i] = sum_{<i}
    i = torch.arange(n, device=anchor.device)
    hi = (i + radius + 1).clamp(max=n)  # exclusive end
    lo = (i - radius).clamp(min=0)
    count = csum[:, hi] - csum[:, lo]  # [B, N] anchors in [i - r, i + r]
    return count > 0


@dataclass(frozen=True)
class LocalLeapConfig:
    threshold: float = 0.9  # tau: anchors, and the bar far from any anchor, in (0, 1]
    relaxed_threshold: float = 0.75  # tau_relax: the bar within radius of an anchor, in (0, tau]
    radius: int = 4  # neighbourhood half-width in positions, >= 0

    def __post_init__(self) -> None:
        t, r = self.threshold, self.relaxed_threshold
        if isinstance(t, bool) or not isinstance(t, (int, float)) or not (0.0 < t <= 1.0):
            raise ValueError(f"threshold must be in (0, 1], got {t!r}")
        if isinstance(r, bool) or not isinstance(r, (int, float)) or not (0.0 < r <= t):
            raise ValueError(f"relaxed_threshold must be in (0, threshold={t}], got {r!r}")
        if isinstance(self.radius, bool) or not isinstance(self.radius, int) or self.radius < 0:
            raise ValueError(f"radius must be an integer >= 0, got {self.radius!r}")


@register_sampler("localleap", aliases=("local_leap",))
class LocalLeap(Sampler):
    """LocalLeap: confidence threshold, relaxed near high-confidence anchors."""

    Config = LocalLeapConfig
    fixed_steps = False

    def step(self, inp: StepInput, state: DecodeState) -> StepOutput:
        cfg = self.config
        tokens, conf = propose_with_confidence(inp)  # [B, Q] long, [B, Q] float64 (-inf off the window)
        conf = conf.masked_fill(~inp.active, float("-inf"))
        anchor = conf >= cfg.threshold  # [B, Q], active only (others are -inf)
        near = near_anchor(anchor, cfg.radius)  # [B, Q]
        bar = torch.where(near, conf.new_tensor(cfg.relaxed_threshold), conf.new_tensor(cfg.threshold))
        top1 = take_top_k(conf, torch.ones((), dtype=torch.long, device=conf.device), inp.active)
        commit = inp.active & ((conf >= bar) | top1)
        return StepOutput(commit=commit, tokens=tokens, score=conf)
