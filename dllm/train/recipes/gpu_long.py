"""``tiny-llada-long-gpu`` / ``tiny-dream-long-gpu``: the shipped long models continued on a GPU (an
experiment, not shipped; replaces the shell script ``gpu-train-long.sh`` of ``benchmarks/``).

One stage from the embedded model (``dllm.load("tiny-llada-long")``) at full length with 64 examples
per step (the CPU chains ran batch 8), bf16 autocast, 8 threads, a cosine horizon of 3,000 steps at lr
3e-4: ``tiny-llada-long`` on the full-length count mixture, ``tiny-dream-long`` on it plus the
narrow-key lookups. For a session lent a GPU, bounded by wall time::

    python -m dllm.train --recipe tiny-llada-long-gpu --time-limit 150 --out runs/gpu-llada
    dllm eval-tasks --model runs/gpu-llada/export/tiny-llada-long-gpu --tasks lookup_long lookup_any \\
        span_copy_far count_long --per-size 8 --device cuda

The export is ``OUT/export/<recipe>`` (``dllm/train/runner.py``; never the package's copy): replace
the shipped model only if it scores better, then re-run tests/models/test_embedded_trained.py. On a
CPU: ``--device cpu --time-limit 10``.
"""

from __future__ import annotations

from dataclasses import replace

from dllm.train.recipes.base import recipes
from dllm.train.recipes.long_prompt import long_model
from dllm.train.recipes.stages import Curriculum, curricula, key_stage, with_rope_theta

FULL = ("count_c16:1:16:2040", "count_c8:0.25:8:2040", "lookup_long:0.5:4:339", "lookup_any:0.25:4:339",
        "span_copy_far:0.5:16:2039")
NARROW_KEYS = ("lookup_k1:0.25:4:16", "lookup_k2:0.25:4:48")


def gpu_curriculum(model: str, base: str, *specs: str) -> Curriculum:
    """One stage from the embedded ``model`` (family of ``base``) on ``specs``, batch 64, bf16, CUDA."""
    name = model + "-gpu"
    stage = key_stage(name, "gpu", with_rope_theta(long_model(recipes.get(base)), 1e6), recipes.get(base).family,
                      3000, 3e-4, 64, *specs, threads=8)
    stage = replace(stage, recipe=replace(stage.recipe, init_from=model,
                                          train=replace(stage.recipe.train, device="cuda", bf16=True)))
    return Curriculum(name, (stage,), f"{model} continued on a GPU (batch 64, bf16)", replaces=("gpu-train-long.sh",),
                      shipped=False)


curricula.add("tiny-llada-long-gpu", gpu_curriculum("tiny-llada-long", "tiny-llada", *FULL),
              description="experiment: tiny-llada-long continued on a GPU (batch 64, bf16; not shipped)")
curricula.add("tiny-dream-long-gpu", gpu_curriculum("tiny-dream-long", "tiny-dream", *FULL, *NARROW_KEYS),
              description="experiment: tiny-dream-long continued on a GPU (batch 64, bf16; not shipped)")

__all__ = ["FULL", "NARROW_KEYS", "gpu_curriculum"]
