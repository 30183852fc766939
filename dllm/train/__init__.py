"""Training tiny LLaDA / Dream models on the PB-mini stress tasks with the LLaDA SFT objective.

- ``objective``: ``mask_answer``, ``sft_loss``, ``diffusion_loss`` (masked-diffusion SFT loss);
- ``data``: ``MixtureConfig``, ``TaskMixture`` (deterministic multi-task batches), ``Batch``;
- evaluation during training: ``dllm.eval.exact_match.evaluate`` (exact match on the test split);
- ``recipes``: ``tiny-llada`` / ``tiny-dream`` (model + ``TrainConfig``), ``build_model``;
- ``trainer``: ``Trainer`` (AdamW, warm-up + cosine, clipping, JSONL log, checkpoints, resume).

Command line: ``python -m dllm.train --recipe tiny-llada [--out DIR] [--resume] ...``.
"""

from dllm.train.data import Batch, MixtureConfig, TaskMixture, collate
from dllm.train.objective import MASK_EPS, diffusion_loss, mask_answer, sft_loss
from dllm.train.recipes import Recipe, TrainConfig, build_model, get_recipe, recipes

__all__ = [
    "MASK_EPS", "Batch", "MixtureConfig", "Recipe", "TaskMixture", "TrainConfig", "build_model",
    "collate", "diffusion_loss", "get_recipe", "mask_answer", "recipes", "sft_loss",
]


def __getattr__(name: str):  # Trainer pulls in the engine and tqdm: import it on first use
    if name == "Trainer":
        from dllm.train.trainer import Trainer

        return Trainer
    raise AttributeError(f"module 'dllm.train' has no attribute {name!r}")
