"""Train a DFlash drafter for an AR target: ``python -m dllm.train --recipe tiny-ar-dflash``.

The recipe of DFlash (arXiv 2602.06036, section 4 and appendix A; the SpecForge trainer
``specforge/core/dflash.py`` follows it), at toy scale:

1. Target-regenerated data: prompts from the stress-task mixture (test split held out), answers
   the target's own greedy continuations (``greedy_answers``), so the drafter learns what the
   target will say, not what the data says.
2. Random anchors: per sequence, ``anchors`` positions drawn without replacement from the answer
   (positions >= the prompt length: the first anchor at decode time is the prefill's token), so
   the blocks ``[x_a, MASK x (B-1)]`` with labels ``x_{a+1..a+B-1}`` cover every offset.
3. One forward for all blocks of a batch: the target's tapped hidden states of the whole sequence
   are the context; block j sees context positions strictly before its anchor and its own block
   (bidirectionally), nothing of other blocks; block positions ``a + 0..B-1``.
4. Position-decayed loss: cross-entropy on block positions k = 1..B-1 weighted by
   ``exp(-(k-1)/gamma)`` (gamma 7 at B = 16), labels past the sequence end dropped; weighted mean.

The target is frozen (its embedding and LM head are the drafter's, read raw). The drafter is saved
in the official z-lab format (``save_dflash``). Evaluation: teacher-forced acceptance on held-out
regenerated examples, tau = 1 + the mean accepted prefix of a block (what greedy verification
accepts, since the held-out answers are the target's own greedy output).
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Optional, Union

import torch
import torch.nn.functional as F

from dllm.drafters.dflash.io import random_dflash, save_dflash
from dllm.drafters.dflash.model import DFlashDrafter, extract_context_feature, target_embedding, target_head
from dllm.options import Overridable, check_int, check_unit
from dllm.registry import Registry
from dllm.tasks.vocab import MASK, word_id
from dllm.train.ar import LONG_MIXTURE
from dllm.train.data import MixtureConfig
from dllm.train.drafters.steps import (check_stop, draft_data, pad_rows, regenerate, start_run,  # noqa: F401
                                      train_steps, write_record)


ANSWER_TOKENS = 66  # new tokens covering the longest long-answer answer (the heads' trainers regenerate to it)


@dataclass(frozen=True)
class DFlashRecipe(Overridable):
    name: str
    target: str = "tiny-ar"  # embedded name or directory of the (trained) AR target
    num_layers: int = 2  # draft layers (hidden sizes copy the target's)
    # tapped target layers: DFlash's spacing rule gives (1, 1) for 4 target layers and 2 draft layers
    # (it starts at layer 1 and ends 3 before the last); the middle and the last layer carry more
    target_layer_ids: Optional[tuple[int, ...]] = (1, 3)
    block_size: int = 16
    # mixed block sizes (BlockPilot-style per-request sizes need a drafter that works at each): the
    # training steps cycle through these (each <= block_size), with block_size * anchors / size
    # anchors so that every step trains the same number of positions; () = block_size only
    block_sizes: tuple[int, ...] = ()
    # filled slots (a path-conditioned second pass needs them): with this probability a training
    # block also holds its true tokens in the first 1..max_fill slots after the anchor, which are then
    # inputs, not labels; 0 = the anchor alone, as DFlash
    fill_prob: float = 0.0
    max_fill: int = 3
    steps: int = 4000
    batch_size: int = 16
    anchors: int = 8  # random anchors (blocks) per sequence
    gamma: float = 7.0  # loss weight exp(-(k-1)/gamma) at block position k
    lr: float = 1.5e-3
    warmup: int = 100
    min_lr_ratio: float = 0.1
    weight_decay: float = 0.0
    clip: float = 1.0
    pool: int = 8192  # target-regenerated training sequences (drawn once, then ~8 epochs over them)
    eval_examples: int = 4  # held-out test instances per default size of each task
    log_every: int = 25
    seed: int = 0
    mixture: MixtureConfig = field(default_factory=lambda: LONG_MIXTURE)
    description: str = ""

    def __post_init__(self) -> None:
        bad = [b for b in self.block_sizes if not isinstance(b, int) or not 2 <= b <= self.block_size]
        if bad:
            raise ValueError(f"block_sizes {list(self.block_sizes)}: every size must be an int in "
                             f"[2, block_size={self.block_size}], got {bad}")
        check_unit("fill_prob", self.fill_prob)
        check_int("max_fill", self.max_fill, 1, hint=" (filled slots after the anchor)")

    def step_block(self, step: int) -> tuple[int, int]:
        """(block size, anchors per sequence) of training step ``step``."""
        if not self.block_sizes:
            return self.block_size, self.anchors
        block = self.block_sizes[step % len(self.block_sizes)]
        return block, max(1, self.anchors * self.block_size // block)


dflash_recipes: Registry[DFlashRecipe] = Registry("recipe")
dflash_recipes.add("tiny-ar-dflash", DFlashRecipe("tiny-ar-dflash", description=(
    "2-layer DFlash drafter (block 16, taps after target layers 1 and 3) for tiny-ar, target-regenerated "
    "long-answer data")),
    description="DFlash drafter (2 layers, block 16) for tiny-ar")
dflash_recipes.add("tiny-ar-dflash-filled", DFlashRecipe(
    "tiny-ar-dflash-filled", fill_prob=0.5, description=(
        "tiny-ar-dflash trained with half of its blocks holding their true tokens in the first 1-3 "
        "slots after the anchor, so that a second pass conditioned on a drafted path is in distribution")),
    description="DFlash drafter for tiny-ar, trained with filled slots (path-conditioned passes)")
dflash_recipes.add("tiny-ar-dflash-mixed", DFlashRecipe(
    "tiny-ar-dflash-mixed", block_sizes=(4, 8, 12, 16), description=(
        "tiny-ar-dflash trained on blocks of 4, 8, 12 and 16 in turn (same positions per step), so "
        "that one checkpoint drafts at every block size up to 16")),
    description="DFlash drafter for tiny-ar, mixed block sizes 4-16")
dflash_recipes.add("tiny-ar-dflash-wide", DFlashRecipe(
    "tiny-ar-dflash-wide", block_size=32, block_sizes=(8, 16, 24, 32), anchors=4, gamma=10.0, description=(
        "tiny-ar-dflash trained on blocks of 8, 16, 24 and 32 in turn (same positions per step, a slower "
        "loss decay for the longer blocks), so that one checkpoint drafts past 16 tokens, where the "
        "16-token drafter's rounds are capped (a per-request block size needs sizes on both sides)")),
    description="DFlash drafter for tiny-ar, mixed block sizes 8-32")


def sample_anchors(prompt_lens: torch.Tensor, lengths: torch.Tensor, count: int, gen: torch.Generator) -> torch.Tensor:
    """[B, count] sorted anchor positions, without replacement, in [prompt_len, length - 2] per row
    (an anchor needs at least one label after it)."""
    rows = []
    for lp, n in zip(prompt_lens.tolist(), lengths.tolist()):
        span = max(n - 1 - lp, 1)
        pick = torch.randperm(span, generator=gen)[:count] + lp
        if pick.numel() < count:  # short answers: repeat anchors (their blocks are simply re-weighted)
            pick = pick[torch.arange(count) % pick.numel()]
        rows.append(pick.sort().values)
    return torch.stack(rows)


def block_layout(anchors: torch.Tensor, context: int, block: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(block positions [B, A*block], attention mask [B, 1, A*block, context + A*block]) of the
    training layout: block j sees context positions < anchor_j and its own block only."""
    b, a = anchors.shape
    offsets = torch.arange(block)
    positions = (anchors[:, :, None] + offsets).reshape(b, a * block)  # [B, A*block]
    owner = torch.arange(a * block) // block  # [A*block]
    q_anchor = anchors[:, owner]  # [B, A*block]
    sees_ctx = torch.arange(context)[None, None, :] < q_anchor[:, :, None]  # [B, A*block, context]
    sees_block = (owner[:, None] == owner[None, :]).expand(b, -1, -1)  # [B, A*block, A*block]
    return positions, torch.cat([sees_ctx, sees_block], dim=2)[:, None]


@dataclass
class BlockPass:
    """One drafter pass over training blocks (``block_pass``): outputs at block positions 1..block-1."""

    hidden: torch.Tensor  # [B, A, block-1, D] final-norm states
    logits: torch.Tensor  # [B, A, block-1, V] float32
    labels: torch.Tensor  # [B, A, block-1] the true tokens (clamped past the end; see valid)
    valid: torch.Tensor  # [B, A, block-1] bool, a label inside the sequence
    filled: Optional[torch.Tensor]  # [B, A, block] bool, slots that held their true token (inputs), or None


def block_pass(drafter: DFlashDrafter, target, ids: torch.Tensor, lengths: torch.Tensor, anchors: torch.Tensor,
               block: Optional[int] = None, fills: Optional[torch.Tensor] = None) -> BlockPass:
    """The drafter over blocks of ``block`` positions (default: its trained size) anchored at
    ``anchors`` [B, A] of right-padded ``ids`` [B, L], the target's tapped states as context, all
    blocks in one forward. ``fills`` [B, A] long: the first ``fills`` slots after each anchor hold
    their true tokens."""
    block = drafter.block_size if block is None else block
    b, length = ids.shape
    with torch.no_grad():
        real = torch.arange(length)[None] < lengths[:, None]  # [B, L]
        out = target(input_ids=ids, attention_mask=real.long(), output_hidden_states=True)
        features = extract_context_feature(out.hidden_states, drafter.target_layer_ids)  # [B, L, taps*D]
    positions, mask = block_layout(anchors, length, block)
    block_ids = torch.full_like(positions, drafter.mask_token_id)
    block_ids[:, ::block] = ids.gather(1, anchors)  # [B, A*block]: anchors at block position 0
    filled = None
    if fills is not None:  # slots 1..fills[b, a] hold the truth: [B, A, block] -> [B, A*block]
        filled = (torch.arange(block) >= 1) & (torch.arange(block) <= fills[:, :, None])  # [B, A, block]
        truth = ids.gather(1, positions.clamp_max(length - 1))  # [B, A*block]
        block_ids = torch.where(filled.reshape(b, -1), truth, block_ids)
    embeds = F.embedding(block_ids, target_embedding(target))
    hidden = drafter(embeds, features, feature_positions=torch.arange(length)[None].expand(b, -1),
                     block_positions=positions, attn_mask=mask)  # [B, A*block, D]
    a = anchors.shape[1]
    hidden = hidden.reshape(b, a, block, -1)[:, :, 1:]  # [B, A, block-1, D]
    logits = drafter.compute_logits(hidden, target_head(target)).float()  # [B, A, block-1, V]
    label_pos = anchors[:, :, None] + torch.arange(1, block)  # [B, A, block-1]
    labels = ids.gather(1, label_pos.clamp_max(length - 1).reshape(b, -1)).reshape(label_pos.shape)
    return BlockPass(hidden, logits, labels, label_pos < lengths[:, None, None], filled)


def block_loss(drafter: DFlashDrafter, target, ids: torch.Tensor, lengths: torch.Tensor, anchors: torch.Tensor,
               gamma: float, block: Optional[int] = None,
               fills: Optional[torch.Tensor] = None) -> tuple[torch.Tensor, torch.Tensor]:
    """(weighted loss, per-block accepted prefix lengths [B, A]) for one batch of blocks of
    ``block`` positions (default: the drafter's trained block size). ``fills`` [B, A] long: the
    first ``fills`` slots after each anchor hold their true tokens (inputs, no loss there)."""
    out = block_pass(drafter, target, ids, lengths, anchors, block, fills)
    logits, labels, valid = out.logits, out.labels, out.valid
    weight = torch.exp(-torch.arange(logits.shape[2], dtype=torch.float32) / gamma) * valid  # [B, A, block-1]
    if out.filled is not None:
        weight = weight * ~out.filled[:, :, 1:]  # a filled slot is an input
    nll = F.cross_entropy(logits.reshape(-1, logits.shape[-1]), labels.reshape(-1), reduction="none")
    loss = (nll * weight.reshape(-1)).sum() / weight.sum().clamp_min(1e-12)
    hit = (((logits.argmax(-1) == labels) | (weight == 0)) & valid).long().cumprod(dim=-1)  # accepted prefix (greedy)
    return loss, hit.sum(dim=-1)


def teacher_forced_tau(drafter, target, rows: list[list[int]], prompt_lens: list[int],
                       block: Optional[int] = None) -> dict[str, float]:
    """Mean 1 + accepted prefix over blocks (of ``block`` positions, default the trained size)
    anchored at every answer position of held-out rows."""
    ids, lengths = pad_rows(rows)
    lp = torch.tensor(prompt_lens)
    accepted, blocks = 0.0, 0
    with torch.no_grad():
        for j in range(len(rows)):
            n = int(lengths[j])
            anchors = torch.arange(int(lp[j]), n - 1)[None]
            if anchors.numel() == 0:  # a one-token answer (the target's EOS at once): no block to draft
                continue
            _, acc = block_loss(drafter, target, ids[j:j + 1, :n], lengths[j:j + 1], anchors, 7.0, block)
            accepted += float(acc.float().sum())
            blocks += anchors.numel()
    return {"tau_teacher_forced": 1.0 + accepted / max(blocks, 1), "blocks": blocks}


def train_dflash(recipe: DFlashRecipe, out: Union[str, Path], *, threads: int = 0, progress: bool = True,
                 target: Any = None, stop_at: Optional[int] = None, time_limit: Optional[float] = None
                 ) -> dict[str, Any]:
    """Train ``recipe`` into ``out`` (``log.jsonl``, ``final/`` in the z-lab format); ``stop_at`` /
    ``time_limit`` end the training early (``train_steps``), the drafter reached is evaluated and saved."""
    return train_block_drafter(recipe, out, build=random_dflash, save=save_dflash, threads=threads,
                               progress=progress, target=target, stop_at=stop_at, time_limit=time_limit)


def train_block_drafter(recipe: DFlashRecipe, out: Union[str, Path], *, build: Callable[..., Any],
                        save: Callable[[Any, Path], Path], threads: int = 0, progress: bool = True,
                        target: Any = None, stop_at: Optional[int] = None,
                        time_limit: Optional[float] = None) -> dict[str, Any]:
    """The DFlash training run with the drafter ``build(target, num_layers, block_size, mask_id, seed=,
    target_layer_ids=)`` makes, written by ``save(drafter, dir)`` (DFlash's, or DFlare's: its authors
    train it with the DFlash trainer). ``stop_at`` / ``time_limit``: as ``train_steps``; the result's
    ``step`` is the step reached."""
    check_stop(stop_at, time_limit)  # before the target is loaded and the data regenerated
    # not seeded here: the drafter is built from seed=recipe.seed
    out, target = start_run(recipe, out, threads=threads, target=target, seed=False)
    drafter = build(target, recipe.num_layers, recipe.block_size, word_id(MASK), seed=recipe.seed,
                    target_layer_ids=recipe.target_layer_ids).train()
    t0 = time.perf_counter()
    data = draft_data(target, recipe)
    log = (out / "log.jsonl").open("a")
    log.write(json.dumps({"event": "regenerated", "pool": len(data.rows), "seconds": round(time.perf_counter() - t0, 1)}) + "\n")

    def step_loss(step: int, ids: torch.Tensor, lengths: torch.Tensor, prompt_lens: torch.Tensor,
                  gen: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
        block, n_anchors = recipe.step_block(step)
        anchors = sample_anchors(prompt_lens, lengths, n_anchors, gen)
        fills = None
        if recipe.fill_prob > 0:  # per block: 0 filled slots, or 1..max_fill with probability fill_prob
            count = torch.randint(1, recipe.max_fill + 1, anchors.shape, generator=gen)
            fills = count * (torch.rand(anchors.shape, generator=gen) < recipe.fill_prob)
        return block_loss(drafter, target, ids, lengths, anchors, recipe.gamma, block, fills)

    done = train_steps(recipe, [p for p in drafter.parameters() if p.requires_grad], step_loss, data, log, t0,
                       weight_decay=recipe.weight_decay, progress=progress, stop_at=stop_at, time_limit=time_limit)
    drafter.eval()
    held_rows, held_lens = data.held_rows, data.held_lens
    result = {"step": done, **teacher_forced_tau(drafter, target, held_rows, held_lens)}
    for block in recipe.block_sizes:  # the trained size is measured above already
        result[f"tau_teacher_forced_block{block}"] = (result["tau_teacher_forced"] if block == drafter.block_size else
                                                      teacher_forced_tau(drafter, target, held_rows, held_lens,
                                                                         block)["tau_teacher_forced"])
    log.write(json.dumps(result) + "\n")
    log.close()
    write_record(save(drafter, out / "final"), recipe, result, t0)
    return result


__all__ = ["ANSWER_TOKENS", "BlockPass", "DFlashRecipe", "block_layout", "block_loss", "block_pass", "dflash_recipes",
           "regenerate", "sample_anchors", "teacher_forced_tau", "train_block_drafter", "train_dflash"]
