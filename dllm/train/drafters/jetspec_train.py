"""Train a JetSpec causal draft head for an AR target: ``dllm train --recipe tiny-ar-jetspec``.

JetSpec (Hu et al., arXiv 2606.18394) trains a DFlash-architecture head whose block attention is
causal (``dllm/drafters/jetspec/io.py``). At toy scale this is DFlash's recipe (``dflash_train.py``:
target-regenerated data, random anchors, every block of a batch in one forward, the
position-decayed cross-entropy on block positions 1..B-1) with one change, the mask: block j sees
the context before its anchor and ITS OWN block positions 0..i only (causal), so position i is
trained on what it will see at decode time. The head is warm-started from a bidirectional DFlash
drafter of the same target (``init_from``; the shipped ``tiny-ar-dflash``), which turns a 10-minute
run into a few minutes; ``init_from=None`` starts from random weights. Saved in the authors' layout
(``save_jetspec``: ``dflash_config.causal_head: true``) with ``training.json`` beside it.

Evaluation: teacher-forced chain acceptance on held-out regenerated examples (tau = 1 + mean
accepted prefix of a block, what greedy chain verification accepts on the target's own outputs).
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Optional, Union

import torch
import torch.nn.functional as F

from dllm.drafters.dflash.model import DFlashDrafter, extract_context_feature, target_embedding, target_head
from dllm.drafters.jetspec.io import causal_copy, random_jetspec, save_jetspec
from dllm.options import Overridable
from dllm.registry import Registry
from dllm.tasks.vocab import MASK, word_id
from dllm.train.ar import LONG_MIXTURE
from dllm.train.data import MixtureConfig
from dllm.train.drafters.dflash_train import block_layout, pad_rows, sample_anchors
from dllm.train.drafters.steps import check_stop, draft_data, start_run, train_steps, write_record


@dataclass(frozen=True)
class JetSpecRecipe(Overridable):
    name: str
    target: str = "tiny-ar"  # embedded name or directory of the AR target
    init_from: Optional[str] = "tiny-ar-dflash"  # a DFlash drafter of the target to warm-start from (None: random)
    num_layers: int = 2  # used when init_from is None
    target_layer_ids: tuple[int, ...] = (1, 3)
    block_size: int = 16
    steps: int = 1200
    batch_size: int = 16
    anchors: int = 8
    gamma: float = 7.0  # loss weight exp(-(k-1)/gamma) at block position k
    lr: float = 1e-3
    warmup: int = 30
    min_lr_ratio: float = 0.1
    clip: float = 1.0
    pool: int = 1024  # target-regenerated training sequences
    eval_examples: int = 4
    log_every: int = 25
    seed: int = 0
    mixture: MixtureConfig = field(default_factory=lambda: LONG_MIXTURE)
    description: str = ""


jetspec_recipes: Registry[JetSpecRecipe] = Registry("recipe")
jetspec_recipes.add("tiny-ar-jetspec", JetSpecRecipe("tiny-ar-jetspec", description=(
    "2-layer JetSpec causal draft head (block 16, taps after target layers 1 and 3) for tiny-ar, warm-started "
    "from tiny-ar-dflash, target-regenerated long-answer data")),
    description="JetSpec causal draft head (2 layers, block 16) for tiny-ar")


def causal_layout(anchors: torch.Tensor, context: int, block: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(block positions [B, A*block], mask [B, 1, A*block, context + A*block]): DFlash's training layout
    (``block_layout``) with each block causal inside (position i sees its block's positions 0..i)."""
    positions, mask = block_layout(anchors, context, block)
    n = positions.shape[1]
    idx = torch.arange(n)
    inner = idx[None, :] <= idx[:, None]  # [A*block, A*block]: key index <= query index
    mask = mask.clone()
    mask[..., context:] &= inner
    return positions, mask


def causal_loss(drafter: DFlashDrafter, target, ids: torch.Tensor, lengths: torch.Tensor, anchors: torch.Tensor,
                gamma: float) -> tuple[torch.Tensor, torch.Tensor]:
    """(weighted loss, per-block accepted prefix lengths [B, A]) of the causal head on blocks at ``anchors``."""
    block = drafter.block_size
    b, length = ids.shape
    with torch.no_grad():
        real = torch.arange(length)[None] < lengths[:, None]  # [B, L]
        out = target(input_ids=ids, attention_mask=real.long(), output_hidden_states=True)
        features = extract_context_feature(out.hidden_states, drafter.target_layer_ids)  # [B, L, taps*D]
    positions, mask = causal_layout(anchors, length, block)
    block_ids = torch.full_like(positions, drafter.mask_token_id)
    block_ids[:, ::block] = ids.gather(1, anchors)  # anchors at block position 0
    hidden = drafter(F.embedding(block_ids, target_embedding(target)), features,
                     feature_positions=torch.arange(length)[None].expand(b, -1), block_positions=positions,
                     attn_mask=mask)  # [B, A*block, D]
    a = anchors.shape[1]
    logits = drafter.compute_logits(hidden.reshape(b, a, block, -1)[:, :, 1:], target_head(target)).float()
    label_pos = anchors[:, :, None] + torch.arange(1, block)  # [B, A, block-1]
    labels = ids.gather(1, label_pos.clamp_max(length - 1).reshape(b, -1)).reshape(label_pos.shape)
    valid = label_pos < lengths[:, None, None]
    weight = torch.exp(-torch.arange(block - 1, dtype=torch.float32) / gamma) * valid  # [B, A, block-1]
    nll = F.cross_entropy(logits.reshape(-1, logits.shape[-1]), labels.reshape(-1), reduction="none")
    loss = (nll * weight.reshape(-1)).sum() / weight.sum().clamp_min(1e-12)
    hit = ((logits.argmax(-1) == labels) & valid).long().cumprod(dim=-1)
    return loss, hit.sum(dim=-1)


def teacher_forced_tau(drafter: DFlashDrafter, target, rows: list[list[int]], prompt_lens: list[int]) -> dict[str, float]:
    """Mean 1 + accepted prefix over blocks anchored at every answer position of held-out rows."""
    ids, lengths = pad_rows(rows)
    accepted, blocks = 0.0, 0
    with torch.no_grad():
        for j in range(len(rows)):
            n = int(lengths[j])
            anchors = torch.arange(prompt_lens[j], n - 1)[None]
            if anchors.numel() == 0:  # a one-token answer (the target's EOS at once): no block to draft
                continue
            _, acc = causal_loss(drafter, target, ids[j:j + 1, :n], lengths[j:j + 1], anchors, 7.0)
            accepted += float(acc.float().sum())
            blocks += anchors.numel()
    return {"tau_teacher_forced": 1.0 + accepted / max(blocks, 1), "blocks": blocks}


def train_jetspec(recipe: JetSpecRecipe, out: Union[str, Path], *, threads: int = 0, progress: bool = True,
                  target: Any = None, stop_at: Optional[int] = None, time_limit: Optional[float] = None
                  ) -> dict[str, Any]:
    """Train ``recipe`` into ``out`` (``log.jsonl``, ``final/`` in the authors' layout); ``stop_at`` /
    ``time_limit`` end the training early (``train_steps``), the head reached is evaluated and saved."""
    from dllm.drafters.dflash.io import load_dflash

    check_stop(stop_at, time_limit)  # before the target is loaded and the data regenerated
    out, target = start_run(recipe, out, threads=threads, target=target)
    if recipe.init_from is not None:
        drafter = causal_copy(load_dflash(recipe.init_from, dtype=torch.float32))
    else:
        drafter = random_jetspec(target, recipe.num_layers, recipe.block_size, word_id(MASK), seed=recipe.seed,
                                 target_layer_ids=recipe.target_layer_ids)
    drafter.train()
    t0 = time.perf_counter()
    data = draft_data(target, recipe)
    held_rows, held_lens = data.held_rows, data.held_lens
    before = teacher_forced_tau(drafter.eval(), target, held_rows, held_lens)["tau_teacher_forced"]
    drafter.train()
    log = (out / "log.jsonl").open("a")
    log.write(json.dumps({"event": "regenerated", "pool": len(data.rows), "tau_at_init": before,
                          "seconds": round(time.perf_counter() - t0, 1)}) + "\n")

    def step_loss(step: int, ids: torch.Tensor, lengths: torch.Tensor, prompt_lens: torch.Tensor,
                  gen: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
        anchors = sample_anchors(prompt_lens, lengths, recipe.anchors, gen)
        return causal_loss(drafter, target, ids, lengths, anchors, recipe.gamma)

    done = train_steps(recipe, list(drafter.parameters()), step_loss, data, log, t0, weight_decay=0.0,
                       progress=progress, stop_at=stop_at, time_limit=time_limit)
    drafter.eval()
    result = {"step": done, "tau_teacher_forced_at_init": before,
              **teacher_forced_tau(drafter, target, held_rows, held_lens)}
    log.write(json.dumps(result) + "\n")
    log.close()
    write_record(save_jetspec(drafter, out / "final"), recipe, result, t0)
    return result


__all__ = ["JetSpecRecipe", "causal_layout", "causal_loss", "jetspec_recipes", "teacher_forced_tau", "train_jetspec"]
