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

import json
import time
from dataclasses import asdict
from pathlib import Path
from typing import Any, Union

import torch

from dllm import tasks as T
from dllm.drafters.dflash.dflare_io import random_dflare, save_dflare
from dllm.registry import Registry
from dllm.tasks.vocab import MASK, word_id
from dllm.train.ar import hf_tokenizer
from dllm.train.data import TaskMixture
from dllm.train.drafters.dflash_train import (DFlashRecipe, block_loss, pad_rows, regenerate, sample_anchors,
                                              teacher_forced_tau)
from dllm.train.schedule import lr_factor

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
                 target: Any = None) -> dict[str, Any]:
    """Train ``recipe`` into ``out`` (``log.jsonl``, ``final/`` in the authors' DFlare layout)."""
    from tqdm.auto import tqdm

    from dllm.models.targets import load_target

    if threads > 0:
        torch.set_num_threads(threads)
    if recipe.block_sizes or recipe.fill_prob > 0:
        raise ValueError("the DFlare recipe trains one block size without filled slots (as the authors')")
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    if target is None:
        target, _ = load_target(recipe.target)
    target = target.float().eval().requires_grad_(False)
    drafter = random_dflare(target, recipe.num_layers, recipe.block_size, word_id(MASK), seed=recipe.seed,
                            target_layer_ids=recipe.target_layer_ids).train()
    vocab = hf_tokenizer().get_vocab()
    mix = TaskMixture(recipe.mixture, seed=recipe.seed, tokenizer=hf_tokenizer())
    rng = mix.rng(-1)
    examples = [mix.sample(rng) for _ in range(recipe.pool)]
    prompts = [[vocab[w] for w in T.prompt_words(ex)] for ex in examples]
    longest = max(T.answer_length(ex.task, ex.size) for ex in examples)
    t0 = time.perf_counter()
    rows = regenerate(target, prompts, longest)
    held = [ex for n in recipe.mixture.task_names() for ex in T.test_split(n, None, n=recipe.eval_examples)]
    held_prompts = [[vocab[w] for w in T.prompt_words(ex)] for ex in held]
    held_rows = regenerate(target, held_prompts, longest)
    log = (out / "log.jsonl").open("a")
    log.write(json.dumps({"event": "regenerated", "pool": len(rows), "seconds": round(time.perf_counter() - t0, 1)}) + "\n")
    params = [p for p in drafter.parameters() if p.requires_grad]
    opt = torch.optim.AdamW(params, lr=recipe.lr, betas=(0.9, 0.95), weight_decay=recipe.weight_decay)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: lr_factor(
        s, warmup=recipe.warmup, total=recipe.steps, min_ratio=recipe.min_lr_ratio))
    gen = torch.Generator().manual_seed(recipe.seed)
    order = torch.randperm(len(rows), generator=gen).tolist()
    losses: list[float] = []
    accepted: list[float] = []
    for step in tqdm(range(recipe.steps), disable=not progress, desc=recipe.name):
        start = (step * recipe.batch_size) % len(order)
        pick = [order[(start + i) % len(order)] for i in range(recipe.batch_size)]
        ids, lengths = pad_rows([rows[i] for i in pick])
        lp = torch.tensor([len(prompts[i]) for i in pick])
        anchors = sample_anchors(lp, lengths, recipe.anchors, gen)
        loss, acc = block_loss(drafter, target, ids, lengths, anchors, recipe.gamma)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(params, recipe.clip)
        opt.step()
        sched.step()
        losses.append(float(loss.detach()))
        accepted.append(float(acc.float().mean()))
        if (step + 1) % recipe.log_every == 0:
            log.write(json.dumps({"step": step + 1, "loss": sum(losses) / len(losses),
                                  "train_tau": 1 + sum(accepted) / len(accepted), "lr": sched.get_last_lr()[0],
                                  "elapsed_s": round(time.perf_counter() - t0, 1)}) + "\n")
            log.flush()
            losses.clear()
            accepted.clear()
    drafter.eval()
    result = {"step": recipe.steps, **teacher_forced_tau(drafter, target, held_rows, [len(p) for p in held_prompts])}
    log.write(json.dumps(result) + "\n")
    log.close()
    final = save_dflare(drafter, out / "final")
    (final / "training.json").write_text(json.dumps({"recipe": asdict(recipe), "evaluation": result,
                                                     "train_seconds": round(time.perf_counter() - t0, 1)},
                                                    indent=2, sort_keys=True, default=str) + "\n")
    return result


__all__ = ["dflare_recipes", "train_dflare"]
