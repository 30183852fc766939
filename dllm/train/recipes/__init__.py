"""Named training recipes, so that ``python -m dllm.train --recipe NAME`` is the whole reproduction.

- ``base``: ``Recipe`` (a model in an official checkpoint format + its ``TrainConfig``), ``build_model``;
- ``stages``: ``Stage`` / ``Curriculum``: a shipped model's training as a chain of trainer runs, and
  the ``curricula`` registry (one per shipped diffusion model, plus experiments; loaded on first use);
- one file per model family: ``pb_mini`` (``tiny-llada``, ``tiny-dream``), ``block_diffusion``
  (``tiny-sdar``, converted from tiny-llada), ``long_prompt`` (the first
  long-prompt stage), ``llada_long`` (``tiny-llada-long``), ``dream_long`` (``tiny-dream-long``),
  ``gpu_long`` (GPU continuations, not shipped).

The AR target, AR draft and DFlash drafters are single runs of ``dllm/train/ar.py`` and
``dllm/train/drafters/dflash_train.py`` (``ar_recipes``, ``dflash_recipes``); the runner of a curriculum is
``dllm/train/runner.py``.
"""

from dllm.train.recipes.base import (Recipe, TrainConfig, build_model, count_parameters, get_recipe,
                                     init_for_training, recipes, task_special_ids, warm_start)
from dllm.train.recipes.pb_mini import (C0_TASKS, FOCUS_TASKS, PHASE1_STEPS, focus_mixture, reweighted,
                                        sort_num_mixture, weighted_mixture)
from dllm.train.recipes.stages import Curriculum, Stage, key_stage, mixture
from dllm.train.recipes import block_diffusion  # noqa: F401  (registers tiny-sdar, after pb_mini)


def __getattr__(name: str):
    """``curricula`` on first use: importing the long chains registers the training-only tasks
    (``lookup_kW`` / ``count_cM``, ``dllm/train/recipes/narrow_tasks.py``), which a plain ``import dllm.train``
    must not add to the task registry."""
    if name == "curricula":
        from dllm.train.recipes import dream_long, gpu_long, llada_long  # noqa: F401  (register the chains)
        from dllm.train.recipes.stages import curricula

        return curricula
    raise AttributeError(f"module 'dllm.train.recipes' has no attribute {name!r}")


__all__ = ["C0_TASKS", "FOCUS_TASKS", "PHASE1_STEPS", "Curriculum", "Recipe", "Stage", "TrainConfig", "build_model",
           "count_parameters", "curricula", "focus_mixture", "get_recipe", "init_for_training", "key_stage",
           "mixture", "recipes", "reweighted", "sort_num_mixture", "task_special_ids", "warm_start",
           "weighted_mixture"]
