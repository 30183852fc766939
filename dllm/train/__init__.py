"""Training tiny LLaDA / Dream models on the PB-mini stress tasks with the LLaDA SFT objective.

- ``objective``: ``mask_answer``, ``sft_loss``, ``diffusion_loss`` (masked-diffusion SFT loss);
- ``data``: ``MixtureConfig``, ``TaskMixture`` (deterministic multi-task batches), ``Batch``;
- evaluation during training: ``dllm.scoring.exact_match.evaluate`` (exact match on the test split);
- ``recipes``: ``Recipe`` (model + ``TrainConfig``), ``build_model``, and ``curricula``: every shipped
  diffusion model's training as a chain of stages (``Curriculum`` / ``Stage``);
- ``runner``: runs a curriculum end to end (resumable), then exports it;
- ``trainer``: ``Trainer`` (AdamW, warm-up + cosine, clipping, JSONL log, checkpoints, resume).

Command line: ``python -m dllm.train --recipe tiny-llada-long [--out DIR] [--resume] [--dry-run] ...``
(``main(argv)`` in ``dllm/train/__main__.py``).
"""

from dllm.train.data import Batch, MixtureConfig, TaskMixture, collate
from dllm.train.objective import MASK_EPS, diffusion_loss, mask_answer, sft_loss
from dllm.train.recipes import Curriculum, Recipe, Stage, TrainConfig, build_model, get_recipe, recipes

__all__ = [
    "MASK_EPS", "Batch", "Curriculum", "MixtureConfig", "Recipe", "Stage", "TaskMixture", "TrainConfig",
    "build_model", "collate", "curricula", "diffusion_loss", "get_recipe", "mask_answer", "recipes", "sft_loss",
]


def __getattr__(name: str):  # Trainer pulls in the engine and tqdm: import it on first use
    if name == "curricula":  # the long chains register training-only tasks: load them on first use
        from dllm.train.recipes import curricula

        return curricula
    if name == "Trainer":
        from dllm.train.trainer import Trainer

        return Trainer
    raise AttributeError(f"module 'dllm.train' has no attribute {name!r}")
