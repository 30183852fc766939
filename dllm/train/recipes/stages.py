"""A shipped model's training as data: a ``Curriculum`` is a chain of ``Stage``s, each one run of the
trainer (``dllm/train/trainer.py``) that starts from the checkpoint the previous stage ends at.

- ``Stage``: a :class:`~dllm.train.recipes.base.Recipe` (model fields, ``TrainConfig``: steps = the
  schedule's horizon, lr, batch, warm-up, task mixture with weights and size ranges, seed, threads as
  run), where it was stopped (``stop_at``: a stage stopped by hand keeps its cosine horizon), and which
  of its checkpoints the chain continues from (``take``: the stop step's checkpoint, or ``best``).
- ``Curriculum``: the stages in order and the export (``dllm.train.export``: the last stage's taken
  checkpoint written as an embedded-model directory, in ``export_dtype``).
- :func:`key_stage`: the continuation stages of the long models (a fresh AdamW per stage, warm-up 50,
  cosine to 10%, seed 0, no evaluation, a checkpoint every 200 steps), the task mixture given as the
  ``TASK:WEIGHT:LO:HI`` strings the chains were written in (:func:`mixture`).

The chains themselves: ``pb_mini.py`` (``tiny-llada``, ``tiny-dream``), ``llada_long.py``,
``dream_long.py``; the runner: ``dllm/train/runner.py``.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Optional

from dllm.registry import Registry
from dllm.train.data import MixtureConfig
from dllm.train.recipes.narrow_tasks import curriculum_task
from dllm.train.recipes.base import Recipe, TrainConfig

TAKES = ("last", "best")


@dataclass(frozen=True)
class Stage:
    """One trainer run. ``recipe.init_from`` is None for every stage after the first: the runner fills in
    the previous stage's taken checkpoint."""

    name: str  # its directory under the run's --out
    recipe: Recipe
    stop_at: Optional[int] = None  # stopped after this step (the schedule still spans recipe.train.steps)
    take: str = "last"  # what the chain continues from: "last" (the stop step's checkpoint) | "best"
    note: str = ""  # what this stage was for, or what it did, as run

    def __post_init__(self) -> None:
        if self.take not in TAKES:
            raise ValueError(f"stage {self.name!r}: take={self.take!r}; valid: {', '.join(TAKES)}")
        steps = self.recipe.train.steps
        if self.stop_at is not None and not (isinstance(self.stop_at, int) and 1 <= self.stop_at <= steps):
            raise ValueError(f"stage {self.name!r}: stop_at={self.stop_at!r}; valid: 1 .. steps={steps}")

    @property
    def end(self) -> int:
        """The last step this stage trains."""
        return self.recipe.train.steps if self.stop_at is None else self.stop_at

    def source(self, end: Optional[int] = None) -> str:
        """The checkpoint directory (under the stage's) the chain continues from."""
        return "best" if self.take == "best" else f"checkpoint-{self.end if end is None else end:07d}"


@dataclass(frozen=True)
class Curriculum:
    """A shipped model's whole training: ``stages`` in order, then the export of the last one."""

    name: str  # the model it produces (dllm.load(name) loads the shipped copy)
    stages: tuple[Stage, ...]
    description: str
    replaces: tuple[str, ...] = ()  # the shell scripts it replaces (by name; git keeps them)
    export_dtype: str = "float32"
    shipped: bool = True  # False: an experiment kept as a recipe (not an embedded model)

    def __post_init__(self) -> None:
        if not self.stages:
            raise ValueError(f"curriculum {self.name!r} has no stages")
        names = [s.name for s in self.stages]
        dupes = sorted({n for n in names if names.count(n) > 1})
        if dupes:
            raise ValueError(f"curriculum {self.name!r}: stage names repeat: {dupes}")
        if self.export_dtype not in ("float32", "bfloat16"):
            raise ValueError(f"curriculum {self.name!r}: export_dtype={self.export_dtype!r}; valid: float32, bfloat16")

    def stage(self, name: str) -> Stage:
        for s in self.stages:
            if s.name == name:
                return s
        valid = ", ".join(s.name for s in self.stages)
        raise ValueError(f"curriculum {self.name!r} has no stage {name!r}; valid: {valid}")

    def steps(self) -> int:
        """Optimiser steps over the whole chain."""
        return sum(s.end for s in self.stages)


curricula: Registry[Curriculum] = Registry("recipe")


def mixture(*specs: str) -> MixtureConfig:
    """``TASK:WEIGHT:LO:HI`` strings -> a mixture drawing sizes LO..HI (the task's own unit) of each task at
    its weight (``lookup_kW`` / ``count_cM``: the narrow variants of ``dllm/train/recipes/narrow_tasks.py``)."""
    names, weights, sizes = [], [], []
    for spec in specs:
        parts = spec.split(":")
        try:
            if len(parts) != 4:
                raise ValueError
            name, weight, lo, hi = parts[0], float(parts[1]), int(parts[2]), int(parts[3])
        except ValueError:
            raise ValueError(f"{spec!r}: expected TASK:WEIGHT:LO:HI, e.g. lookup_k1:1:4:8") from None
        if hi < lo:
            raise ValueError(f"{spec!r}: the size range {lo}..{hi} is empty")
        names.append(curriculum_task(name))
        weights.append(weight)
        sizes.append(tuple(range(lo, hi + 1)))
    return MixtureConfig(tasks=tuple(names), weights=tuple(weights), sizes=tuple(sizes))


def key_stage(chain: str, name: str, model: dict, family: str, steps: int, lr: float, batch: int,
              *specs: str, stop_at: Optional[int] = None, threads: int = 1, note: str = "") -> Stage:
    """A continuation stage as the shell-era ``key_curriculum.py stage`` ran it: ``steps`` = the cosine horizon,
    warm-up 50, cosine to 10% of ``lr``, a fresh AdamW, seed 0, no evaluation, a checkpoint every 200
    steps; ``threads``: as run (a different count changes the float sums, not the recipe)."""
    train = TrainConfig(steps=steps, batch_size=batch, lr=lr, warmup=50, eval_every=0, save_every=200,
                        threads=threads, mixture=mixture(*specs))
    return Stage(name, Recipe(f"{chain}/{name}", family, dict(model), train, note), stop_at=stop_at, note=note)


def with_rope_theta(model: dict, theta: float) -> dict:
    """``model`` at a RoPE base of ``theta`` (long-context continued training with a larger base, as
    Code Llama's 10^4 -> 10^6, arXiv:2308.12950: more rotary frequencies stay below one turn over 2,048
    positions, so more dimensions can match content at any distance)."""
    return dict(model, rope_theta=float(theta))


def renamed(stage: Stage, chain: str) -> Stage:
    """``stage`` as a stage of ``chain`` (a base model's stages at the head of a longer chain)."""
    return replace(stage, recipe=replace(stage.recipe, name=f"{chain}/{stage.name}"))


__all__ = ["Curriculum", "Stage", "TAKES", "curricula", "key_stage", "mixture", "renamed", "with_rope_theta"]
