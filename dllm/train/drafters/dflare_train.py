"""Train a DFlare drafter for an AR target: ``train_dflare(dflare_recipes.get("tiny-ar-dflare"), out)``.

DFlare (arXiv 2606.02091; Tencent/AngelSlim ``tools/train_dflash_online.py --draft_arch dflare``)
trains exactly as DFlash: the authors' trainer is the DFlash one (``OnlineDFlashTrainer``: random
anchors, one block-masked forward over all blocks of a batch, cross-entropy decayed by
``exp(-(k-1)/gamma)`` over block position k) with the DFlare model in place of DFlash's. So this
recipe reuses ``dflash_train.py``'s data (target-regenerated answers), anchors, block layout, loss and
teacher-forced evaluation, and changes the drafter: ``random_dflare`` (fusion logits initialised as
the reference's) tapping every layer of the target, saved with ``save_dflare`` in the authors' layout.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Optional, Union

from dllm.drafters.dflash.dflare.io import random_dflare, save_dflare
from dllm.registry import Registry
from dllm.train.drafters.dflash_train import DFlashRecipe, train_block_drafter

dflare_recipes: Registry[DFlashRecipe] = Registry("recipe")
# the budget of tiny-ar-dflash (DFlashRecipe's defaults: 4,000 steps over 8,192 regenerated sequences),
# so that the two shipped drafters differ in the architecture only
dflare_recipes.add("tiny-ar-dflare", DFlashRecipe(
    "tiny-ar-dflare", target_layer_ids=(0, 1, 2, 3), description=(
        "2-layer DFlare drafter (block 16) for tiny-ar: each draft layer fuses all 4 target layers with its "
        "own softmax weights; target-regenerated long-answer data, the DFlash loss")),
    description="DFlare drafter (2 layers fusing 4 target layers, block 16) for tiny-ar")
dflare_recipes.add("tiny-ar-dflare-short", DFlashRecipe(
    "tiny-ar-dflare-short", target_layer_ids=(0, 1, 2, 3), steps=1500, pool=2048, description=(
        "tiny-ar-dflare on a ~5-minute budget: 1,500 steps over 2,048 regenerated sequences")),
    description="DFlare drafter for tiny-ar, short budget (1,500 steps)")


def train_dflare(recipe: DFlashRecipe, out: Union[str, Path], *, threads: int = 0, progress: bool = True,
                 target: Any = None, stop_at: Optional[int] = None, time_limit: Optional[float] = None
                 ) -> dict[str, Any]:
    """Train ``recipe`` into ``out`` (``log.jsonl``, ``final/`` in the authors' DFlare layout): the DFlash
    run (``train_block_drafter``, ``stop_at`` / ``time_limit`` included) with a DFlare drafter."""
    if recipe.block_sizes or recipe.fill_prob > 0:
        raise ValueError("the DFlare recipe trains one block size without filled slots (as the authors')")
    return train_block_drafter(recipe, out, build=random_dflare, save=save_dflare, threads=threads,
                               progress=progress, target=target, stop_at=stop_at, time_limit=time_limit)


__all__ = ["dflare_recipes", "train_dflare"]
