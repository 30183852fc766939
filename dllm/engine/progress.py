"""The decode loop's progress rule: what a step commits beyond its sampler's choice, so every block
ends (``dllm.engine.loop``, ``dllm.engine.running``)."""

from __future__ import annotations

import torch

from dllm.samplers.chunked import column_ids, neg_inf
from dllm.state import StepOutput


def guarantee_progress(decision: StepOutput, active: torch.Tensor, *, last: bool, adaptive: bool) -> torch.Tensor:
    """The positions to commit: the sampler's choice among active masks, plus the progress rule.

    Fixed-step samplers: the block's last step commits every remaining mask.
    Adaptive samplers: a row with active masks that chose none commits its best-scoring one (the first
    of equal scores; the first active mask without a score); ``guarantee_progress_reference`` is the
    rule as written, this its form in 7 ATen calls.
    """
    if last:
        return active  # never written to: the engine only reads a commit map
    commit = decision.commit if decision.active_only else decision.commit & active
    if adaptive:
        score = decision.score if decision.score is not None else 1.0
        best = torch.where(active, score, neg_inf(active.device)).argmax(dim=1, keepdim=True)  # [B, 1]
        # the best active mask of each row that committed none: active and no commit in its row
        # (bool > bool: True > False only); a row without an active mask has none to take
        fallback = (column_ids(active.shape[1], active.device) == best) & (active > commit.any(dim=1, keepdim=True))
        commit = commit | fallback  # [B, W]
    return commit


def guarantee_progress_reference(decision: StepOutput, active: torch.Tensor, *, last: bool,
                                  adaptive: bool) -> torch.Tensor:
    """``guarantee_progress`` step by step (the tests compare the two)."""
    if last:
        return active
    commit = decision.commit & active
    if adaptive:
        need = active.any(dim=1) & ~commit.any(dim=1)  # [B]
        score = decision.score if decision.score is not None else active.float()
        best = score.masked_fill(~active, float("-inf")).argmax(dim=1)  # [B]
        fallback = torch.zeros_like(commit)
        fallback.scatter_(1, best[:, None], need[:, None])
        commit = commit | (fallback & active)
    return commit


__all__ = ["guarantee_progress", "guarantee_progress_reference"]
