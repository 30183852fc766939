"""``tiny-sdar``: the PB-mini block-diffusion model in the SDAR layout (``python -m dllm.train --recipe
tiny-sdar``).

SDAR (arXiv 2510.06303) makes a block-diffusion model by converting a trained model and continuing
with the block-diffusion objective; this recipe does the same on the embedded ``tiny-llada``:

- architecture: tiny-llada's sizes (d_model 128, 6 layers, 4 heads of 32, SwiGLU 344, the task
  vocabulary of 80 words) with SDAR's switches: block-causal attention with block 4, per-head q/k
  RMSNorm (new weights, starting at 1), RoPE in the activation dtype, no q/k/v bias;
- init: tiny-llada's weights (``warm_start``: a conversion may only add the q/k norms);
- objective: ``dllm.train.block_objective.block_diffusion_loss`` (one block per row noised, earlier
  blocks clean), chosen by the trainer for any block-causal model;
- schedule: every PB-mini task, the C(Y|X) = 0 tasks twice as often (tiny-llada's phase-1 mixture),
  batch 64, warm-up 100 to 5e-4, cosine to 5e-5 at ``SDAR_STEPS``;
- evaluation: exact match at one token per step on the model's own grid (``decode_and_score``
  groups prompts by length mod 4); the shipped checkpoint is the best C = 0 evaluation.
"""

from __future__ import annotations

from dataclasses import replace

from dllm.train.recipes.base import Recipe, TrainConfig, recipes
from dllm.train.recipes.pb_mini import _COMMON, weighted_mixture
from dllm.train.recipes.stages import Curriculum, Stage, curricula

SDAR_BLOCK = 4
SDAR_STEPS = 4000

SDAR_MODEL = dict(_COMMON, n_kv_heads=4, rms_eps=1e-5, qkv_bias=False, rope_fp32=False,
                  attention="block_causal", block_size=SDAR_BLOCK, qk_norm=True)

recipes.add("tiny-sdar", Recipe(
    "tiny-sdar", "sdar", SDAR_MODEL,
    TrainConfig(steps=SDAR_STEPS, lr=5e-4, warmup=100, eval_every=500, save_every=500,
                mixture=weighted_mixture()),
    f"SDAR-format 1.2M block-diffusion model (block {SDAR_BLOCK}) converted from tiny-llada, "
    f"{SDAR_STEPS:,} block-diffusion steps on all PB-mini tasks",
    init_from="tiny-llada",
), description=f"SDAR-format block-diffusion model (block {SDAR_BLOCK}) converted from tiny-llada")

_recipe = recipes.get("tiny-sdar")
curricula.add("tiny-sdar", Curriculum(
    "tiny-sdar",
    (Stage("tiny-sdar", replace(_recipe, train=replace(_recipe.train, threads=1)), take="best",
           note="warm start from the embedded tiny-llada; block-diffusion objective"),),
    _recipe.description,
), description=f"{recipes.entry('tiny-sdar').description} ({SDAR_STEPS:,} steps)")

__all__ = ["SDAR_BLOCK", "SDAR_MODEL", "SDAR_STEPS"]
