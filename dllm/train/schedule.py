"""Training phases: from step ``start`` on, a new data mixture and a new warm-up + cosine schedule.

A recipe is a list of phases. Phase 0 is the recipe's own mixture and schedule (peak ``lr``,
``warmup``) with its cosine horizon at the first later phase's ``start`` (or at ``steps`` when
there is none), so adding a phase leaves every step before its ``start`` bit-identical: a run
resumed from the checkpoint at ``start`` of the shorter recipe is the same run as the longer recipe
from scratch. Each later phase restarts the schedule: linear warm-up to its own peak ``lr``, then
cosine down to ``lr * min_lr_ratio`` at the next phase's ``start`` (or ``steps``), or at its own
``horizon`` when set: a phase added later inside a running one keeps the earlier one's schedule
(and so its steps) unchanged.

Batches stay a pure function of ``(seed, step)``: each phase has its own
:class:`~dllm.train.data.TaskMixture` with the recipe's seed.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from typing import Optional, Sequence

from dllm.train.data import MixtureConfig


@dataclass(frozen=True)
class Phase:
    """From optimiser step ``start`` (0-based) on: ``mixture``, warm-up ``warmup`` steps to peak
    ``lr``, cosine to ``lr * min_lr_ratio`` at the end of the phase; ``batch_size`` examples per
    step (a length curriculum keeps the tokens per step level by shrinking it as prompts grow)."""

    start: int
    mixture: MixtureConfig
    lr: float
    warmup: int = 200
    horizon: Optional[int] = None  # step where the cosine reaches its floor (default: the phase's end)
    batch_size: Optional[int] = None  # examples per step in this phase (default: TrainConfig.batch_size)

    def __post_init__(self) -> None:
        if self.batch_size is not None and (not isinstance(self.batch_size, int) or self.batch_size < 1):
            raise ValueError(f"Phase.batch_size must be an int >= 1 (or None), got {self.batch_size!r}")
        if not isinstance(self.start, int) or self.start < 1:
            raise ValueError(f"Phase.start must be an int >= 1, got {self.start!r}")
        if not self.lr > 0:
            raise ValueError(f"Phase.lr must be > 0, got {self.lr!r}")
        if not isinstance(self.warmup, int) or self.warmup < 0:
            raise ValueError(f"Phase.warmup must be an int >= 0, got {self.warmup!r}")
        if self.horizon is not None and (not isinstance(self.horizon, int) or self.horizon <= self.start):
            raise ValueError(f"Phase.horizon must be an int > start={self.start} (or None), got {self.horizon!r}")


def lr_factor(step: int, *, warmup: int, total: int, min_ratio: float) -> float:
    """Multiplier of the peak lr for optimiser step ``step`` (0-based): linear warm-up
    ``(step + 1) / warmup``, then cosine from 1 down to ``min_ratio`` at ``total``."""
    if warmup > 0 and step < warmup:
        return (step + 1) / warmup
    span = max(total - warmup, 1)
    progress = min(max((step - warmup) / span, 0.0), 1.0)
    return min_ratio + (1.0 - min_ratio) * 0.5 * (1.0 + math.cos(math.pi * progress))


def check_phases(phases: Sequence[Phase], steps: int) -> None:
    """Starts strictly increasing and below ``steps`` (a phase must train at least one step)."""
    starts = [p.start for p in phases]
    if starts != sorted(set(starts)):
        raise ValueError(f"phase starts must be strictly increasing, got {starts}")
    if starts and starts[-1] >= steps:
        raise ValueError(f"phase start {starts[-1]} is not below steps={steps}; valid: 1 .. {steps - 1}")


def phase_index(step: int, phases: Sequence[Phase]) -> int:
    """0 for the recipe's own phase, i + 1 for ``phases[i]`` (the last one started by ``step``)."""
    index = 0
    for i, p in enumerate(phases):
        if step >= p.start:
            index = i + 1
    return index


def scheduled_lr_factor(step: int, *, base_lr: float, warmup: int, steps: int, min_ratio: float,
                        phases: Sequence[Phase] = ()) -> float:
    """Multiplier of ``base_lr`` at ``step`` under the phase schedule (for ``LambdaLR``)."""
    i = phase_index(step, phases)
    end = phases[i].start if i < len(phases) else steps  # the current phase ends where the next starts
    if i == 0:
        return lr_factor(step, warmup=warmup, total=end, min_ratio=min_ratio)
    p = phases[i - 1]
    end = end if p.horizon is None else p.horizon  # a later phase may cut this one's cosine short
    local = lr_factor(step - p.start, warmup=p.warmup, total=end - p.start, min_ratio=min_ratio)
    return p.lr / base_lr * local


def overridden_phases(phases: Sequence[Phase], *, base_lr: float, base_batch: int, lr: Optional[float] = None,
                      batch_size: Optional[int] = None, warmup: Optional[int] = None) -> tuple[Phase, ...]:
    """``phases`` under a run's ``--lr`` / ``--batch-size`` / ``--warmup`` (None: not given), which replace the
    stage's own ``base_lr`` / ``base_batch`` / warm-up: each phase's peak lr and own batch size scale by the same
    factor (a phase keeps its ratio to the stage's: the focus phases' 0.6 x lr, the length curriculum's batch
    halved as prompts double, rounded, at least 1), and each phase warms up ``warmup`` steps."""
    lr_scale = 1.0 if lr is None else lr / base_lr
    batch_scale = 1.0 if batch_size is None else batch_size / base_batch
    return tuple(replace(p, lr=p.lr * lr_scale, warmup=p.warmup if warmup is None else warmup,
                         batch_size=None if p.batch_size is None else max(1, round(p.batch_size * batch_scale)))
                 for p in phases)


__all__ = ["Phase", "check_phases", "lr_factor", "overridden_phases", "phase_index", "scheduled_lr_factor"]
