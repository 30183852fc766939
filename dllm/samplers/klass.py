"""KLASS, KL-Adaptive Stability Sampling (``klass``; shkim0116/KLASS, arXiv 2511.05664).

Rule (one step, per row): for every active mask i of the block,
``KL_t(i) = KL(p_t(i) || p_{t-1}(i)) = sum_v p_t(v) (log p_t(v) - log p_{t-1}(v))`` between this
step's and the previous step's predicted distribution. Position i is *ready* when

    KL_s(i) < kappa for each of the last H steps s = t-H+1 .. t    AND    c_i = p_t(x0_i) > tau_conf

Commit every ready position (``unmask="all"``; the authors' other modes: ``"max_conf"`` commits the
most confident ready one, ``"min_kl"`` the one with the smallest current KL). A row with no ready
position commits its single most confident active mask.

Adaptive: the engine loops until the block has no masks, so ``steps`` is ignored.
Defaults (LLaDA, GSM8K, from the authors' scripts): ``tau_conf = 0.6``, ``kappa = 0.015``, ``H = 2``
(LLaDA HumanEval: tau_conf 0.9, MBPP 0.7, other tasks kappa 0.01; Dream: tau_conf 0.9,
kappa 0.001, H 2).

Decisions where we differ from the authors' code:
- Fallback when nothing is ready: the official code takes the LLaDA schedule's count for this
  step, ``m // S + (s < m % S)``. An adaptive sampler has no step budget, so we commit the top-1 by
  confidence, which is exactly that count in the authors' own configuration (``steps =
  gen_length``, one scheduled token per step).
- History is per block: the previous distributions are kept only for the current block window
  (``state.extras["klass"]``, reset in ``begin_block``; [B, W, V] float64) instead of the whole
  canvas. A KL needs a previous step, so the first step of a block has KL = inf and the earliest
  parallel commit is at block step H (0-based): the same as the official code in the first block;
  in later blocks the official code, which carries the canvas-wide history across blocks, can
  start one step earlier.
- At T > 0 the official code measures KL and confidence on the Gumbel-perturbed logits (a noisy
  distribution); we measure both on the model's softmax and only sample the proposal.
- The mask id is never proposed (runner-up instead). Comparisons are strict (``<`` kappa,
  ``>`` tau_conf), as in the official code.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from dllm.samplers._ops import propose_with_log_probs, gather_prob, take_top_k, window_output
from dllm.samplers.base import Sampler, register_sampler
from dllm.state import DecodeState, StepInput, StepOutput

UNMASK_MODES = ("all", "max_conf", "min_kl")
EXTRAS_KEY = "klass"  # state.extras[EXTRAS_KEY] = (logp [B, W, V] float64, kl_history [B, W, H]) or None


def kl_divergence(logp: torch.Tensor, logq: torch.Tensor) -> torch.Tensor:
    """``KL(p || q)`` over the last axis from log-probabilities. Terms with p = 0 count 0 (no
    0 * inf = nan); p > 0 where q = 0 gives inf. [..., V] -> [...]."""
    p = logp.exp()
    terms = torch.where(p > 0, p * (logp - logq), torch.zeros_like(p))
    return terms.sum(dim=-1)


@dataclass(frozen=True)
class KLASSConfig:
    conf_threshold: float = 0.6  # tau_conf: ready needs p(x0) > this, in [0, 1)
    kl_threshold: float = 0.015  # kappa: ready needs KL < this at each of the last H steps, > 0
    history: int = 2  # H: how many consecutive steps the KL must stay below kappa, >= 1
    unmask: str = "all"  # which ready positions to commit: all | max_conf | min_kl

    def __post_init__(self) -> None:
        c, k, h = self.conf_threshold, self.kl_threshold, self.history
        if isinstance(c, bool) or not isinstance(c, (int, float)) or not (0.0 <= c < 1.0):
            raise ValueError(f"conf_threshold must be in [0, 1), got {c!r}")
        if isinstance(k, bool) or not isinstance(k, (int, float)) or not (k > 0):
            raise ValueError(f"kl_threshold must be > 0, got {k!r}")
        if isinstance(h, bool) or not isinstance(h, int) or h < 1:
            raise ValueError(f"history must be an integer >= 1, got {h!r}")
        if self.unmask not in UNMASK_MODES:
            raise ValueError(f"unmask must be one of {', '.join(map(repr, UNMASK_MODES))}, got {self.unmask!r}")


@register_sampler("klass")
class KLASS(Sampler):
    """KLASS: commit masks whose distribution is stable (KL < kappa for H steps) and confident."""

    Config = KLASSConfig
    fixed_steps = False

    def begin_block(self, state: DecodeState) -> None:
        state.extras[EXTRAS_KEY] = None  # no previous distribution in a new block

    def step(self, inp: StepInput, state: DecodeState) -> StepOutput:
        cfg = self.config
        x0, logp = propose_with_log_probs(inp)  # [B, W], [B, W, V] float64
        ws, we = inp.window
        active = inp.active[:, ws:we]  # [B, W]
        conf = gather_prob(logp.exp(), x0)  # [B, W] float64
        prev = state.extras.get(EXTRAS_KEY)
        if prev is not None and prev[0].shape != logp.shape:  # another window: start afresh
            prev = None
        if prev is None:  # the block's first step: no KL yet
            kl = torch.full_like(conf, float("inf"))
            history = torch.full((*conf.shape, cfg.history), float("inf"), dtype=conf.dtype, device=conf.device)
        else:
            prev_logp, prev_history = prev
            kl = kl_divergence(logp, prev_logp)  # [B, W]
            history = torch.cat([prev_history[..., 1:], kl[..., None]], dim=-1)  # [B, W, H]
        state.extras[EXTRAS_KEY] = (logp, history)

        ready = active & (history < cfg.kl_threshold).all(dim=-1) & (conf > cfg.conf_threshold)  # [B, W]
        if cfg.unmask == "max_conf":
            ready = take_top_k(conf, torch.ones((), dtype=torch.long, device=conf.device), ready)
        elif cfg.unmask == "min_kl":
            ready = take_top_k(-kl, torch.ones((), dtype=torch.long, device=conf.device), ready)
        # no ready position: the most confident active mask (the schedule's count at steps = G)
        top1 = take_top_k(conf, torch.ones((), dtype=torch.long, device=conf.device), active)
        commit = ready | (top1 & ~ready.any(dim=1, keepdim=True))
        return window_output(inp, commit, x0, conf.masked_fill(~active, float("-inf")))
