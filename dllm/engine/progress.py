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
    of equal scores, a -inf score counting as the lowest finite one, so a row whose active scores are
    all -inf commits its first active mask; the first active mask without a score);
    ``guarantee_progress_reference`` is the rule as written, this its form in 8 ATen calls.
    """
    if last:
        return active  # never written to: the engine only reads a commit map
    commit = decision.commit if decision.active_only else decision.commit & active
    if adaptive:
        score = 1.0 if decision.score is None else finite_below(decision.score)  # above the -inf off the masks
        best = torch.where(active, score, neg_inf(active.device)).argmax(dim=1, keepdim=True)  # [B, 1]
        # the best active mask of each row that committed none: active and no commit in its row
        # (bool > bool: True > False only); a row without an active mask has none to take
        fallback = (column_ids(active.shape[1], active.device) == best) & (active > commit.any(dim=1, keepdim=True))
        commit = commit | fallback  # [B, W]
    return commit


def finite_below(score: torch.Tensor) -> torch.Tensor:
    """``score`` with -inf raised to its dtype's lowest finite value (NaN and the rest unchanged), so that
    an active mask scored -inf still ranks above the inactive columns' -inf."""
    if not score.is_floating_point():
        return score
    return score.clamp_min(torch.finfo(score.dtype).min)


def guarantee_progress_reference(decision: StepOutput, active: torch.Tensor, *, last: bool,
                                  adaptive: bool) -> torch.Tensor:
    """``guarantee_progress`` step by step (the tests compare the two)."""
    if last:
        return active
    commit = decision.commit & active
    if adaptive:
        need = active.any(dim=1) & ~commit.any(dim=1)  # [B]
        score = decision.score if decision.score is not None else active.float()
        best = torch.zeros(active.shape[0], dtype=torch.long)  # [B]
        for r in range(active.shape[0]):  # the first active mask of the highest score (-inf: lowest finite)
            cols = active[r].nonzero().flatten().tolist()
            if cols:
                values = [finite_below(score[r, c]).item() for c in cols]
                nan = [c for c, v in zip(cols, values) if v != v]  # NaN: the arg-max's maximum
                best[r] = nan[0] if nan else cols[max(range(len(cols)), key=lambda k: (values[k], -k))]
        best = best.to(active.device)
        fallback = torch.zeros_like(commit)
        fallback.scatter_(1, best[:, None], need[:, None])
        commit = commit | (fallback & active)
    return commit


__all__ = ["finite_below", "guarantee_progress", "guarantee_progress_reference"]
