"""Small recipes and batches shared by the training tests (one CPU thread: tests/conftest.py)."""

from __future__ import annotations

from dllm.train import MixtureConfig, TaskMixture, get_recipe
from dllm.train.recipes import Recipe

SMALL_MODEL = dict(d_model=32, n_layers=1, n_heads=2, mlp_hidden=64)
FEW_TASKS = MixtureConfig(tasks=("copy", "reverse", "sort", "add_lsb"))


def small_recipe(family: str = "llada", **train) -> Recipe:
    """The family's recipe shrunk to a ~20k-parameter model and an 8-row batch."""
    name = f"tiny-{family}"
    model = dict(SMALL_MODEL, n_kv_heads=2 if family == "llada" else 1)
    defaults = dict(batch_size=8, warmup=2, log_every=1, eval_every=0, save_every=0, eval_per_size=1,
                    mixture=FEW_TASKS, phases=())
    return get_recipe(name).with_overrides(model, **{**defaults, **train})


def small_batch(batch_size: int = 8, step: int = 0, seed: int = 0):
    return TaskMixture(FEW_TASKS, seed=seed).batch(step, batch_size)
