"""Train a DSpark drafter for an AR target: ``dllm train --recipe tiny-ar-dspark [--out DIR]``.

The recipe of DSpark (arXiv 2607.05147; authors' trainer DeepSpec ``deepspec/modeling/dspark/
qwen3/modeling.py`` ``forward`` and ``deepspec/modeling/dspark/loss.py``), at toy scale:

1. Target-regenerated data and random anchors as the DFlash recipe (``dflash_train.py``): prompts
   from the stress-task mixture, answers the target's greedy continuations.
2. Blocks ``[x_a, MASK x (K-1)]`` at positions ``a + 0..K-1``; slot k is labelled ``x_{a+k+1}`` (the
   anchor's slot predicts the next token). Block j sees the target's tapped states of positions < a
   and its own block, all blocks in one forward.
3. Logits = base logits + the Markov head's teacher-forced bias (previous token: the anchor, then
   the true tokens).
4. Loss per position, weighted by ``exp(-k / gamma)`` on the valid prefix: ``ce_alpha`` x cross-entropy
   + ``l1_alpha`` x ||softmax(draft) - softmax(target)||_1 + ``confidence_alpha`` x BCE(confidence
   logit, 1 - TV(draft, target)) (the authors' defaults 0.1 / 0.9 / 1.0, gamma 4 at K = 7).

The embedding and LM head are frozen copies of the target's (stored in the checkpoint, as the
authors do). To fit a few CPU minutes the backbone starts from a trained DFlash drafter of the same
target (``init``; its block convention is shifted by one slot, so it is a warm start, not a drafter
that already works). Evaluation: teacher-forced tau on held-out regenerated examples (greedy: the
accepted prefix of the Markov head's picks equals the teacher-forced one).
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Optional, Union

import torch
import torch.nn.functional as F

from dllm.drafters.dspark.io import random_dspark, save_dspark
from dllm.drafters.dspark.model import DSparkHeads, DSparkModel
from dllm.options import Overridable
from dllm.registry import Registry
from dllm.tasks.vocab import MASK, word_id
from dllm.train.ar import LONG_MIXTURE
from dllm.train.data import MixtureConfig
from dllm.train.drafters.dflash_train import block_layout, pad_rows, sample_anchors
from dllm.train.drafters.steps import check_stop, draft_data, start_run, train_steps, write_record


@dataclass(frozen=True)
class DSparkRecipe(Overridable):
    name: str
    target: str = "tiny-ar"  # embedded name or directory of the AR target
    init: Optional[str] = "tiny-ar-dflash"  # a DFlash checkpoint of the same target to start the backbone from
    num_layers: int = 2
    target_layer_ids: tuple[int, ...] = (1, 3)
    block_size: int = 15  # K: drafts (and slots) per block (the authors: 7); the loop's B = K + 1, tiny-ar-dflash's 16
    markov_rank: int = 32
    markov_head_type: str = "vanilla"
    confidence_head_with_markov: bool = True
    steps: int = 1200
    batch_size: int = 16
    anchors: int = 8
    gamma: float = 7.0  # loss weight exp(-k / gamma) at slot k (the authors: 4 at K = 7; DFlash's 7 at B = 16)
    ce_alpha: float = 0.1
    l1_alpha: float = 0.9
    confidence_alpha: float = 1.0
    lr: float = 1e-3
    warmup: int = 50
    min_lr_ratio: float = 0.1
    clip: float = 1.0
    pool: int = 1024
    eval_examples: int = 4
    log_every: int = 25
    seed: int = 0
    mixture: MixtureConfig = field(default_factory=lambda: LONG_MIXTURE)
    description: str = ""


dspark_recipes: Registry[DSparkRecipe] = Registry("recipe")
dspark_recipes.add("tiny-ar-dspark", DSparkRecipe("tiny-ar-dspark", description=(
    "2-layer DSpark drafter (15 drafts per block, vanilla Markov head of rank 32, confidence head) for "
    "tiny-ar, backbone warm-started from tiny-ar-dflash, target-regenerated long-answer data")),
    description="DSpark drafter (2 layers, 15 drafts, Markov head + confidence head) for tiny-ar")


@dataclass
class DSparkPass:
    logits: torch.Tensor  # [B, A, K, V] corrected draft logits (float32)
    target_logits: torch.Tensor  # [B, A, K, V] the target's logits for the same tokens
    confidence: Optional[torch.Tensor]  # [B, A, K] confidence logits
    labels: torch.Tensor  # [B, A, K]
    valid: torch.Tensor  # [B, A, K] bool, a label inside the sequence (a prefix per block)


def dspark_pass(model: DSparkModel, target, ids: torch.Tensor, lengths: torch.Tensor,
                anchors: torch.Tensor) -> DSparkPass:
    """All blocks of a batch in one drafter forward; ids [B, L] right-padded, anchors [B, A]."""
    k = model.block_size
    b, length = ids.shape
    with torch.no_grad():
        real = torch.arange(length)[None] < lengths[:, None]  # [B, L]
        out = target(input_ids=ids, attention_mask=real.long(), output_hidden_states=True)
        features = torch.cat([out.hidden_states[i + 1] for i in model.target_layer_ids], dim=-1)  # [B, L, taps*D]
    positions, mask = block_layout(anchors, length, k)  # [B, A*K], [B, 1, A*K, L + A*K]
    block_ids = torch.full_like(positions, model.mask_token_id)
    block_ids[:, ::k] = ids.gather(1, anchors)
    hidden = model.block_states(block_ids, features, feature_positions=torch.arange(length)[None].expand(b, -1),
                                block_positions=positions, attn_mask=mask)  # [B, A*K, D]
    a = anchors.shape[1]
    hidden = hidden.reshape(b, a, k, -1)
    label_pos = anchors[:, :, None] + torch.arange(1, k + 1)  # [B, A, K]
    safe = label_pos.clamp_max(length - 1)
    labels = ids.gather(1, safe.reshape(b, -1)).reshape(safe.shape)
    prev = torch.cat([ids.gather(1, anchors)[:, :, None], labels[:, :, :-1]], dim=2)  # [B, A, K]
    logits = model.base_logits(hidden)
    if model.markov_head is not None:
        logits = logits + model.markov_head.block_bias(prev, hidden)
    tl = out.logits.float().gather(1, (safe - 1).reshape(b, -1, 1).expand(-1, -1, out.logits.shape[-1]))
    return DSparkPass(logits.float(), tl.reshape(b, a, k, -1), model.confidence_logits(hidden, prev), labels,
                      label_pos < lengths[:, None, None])


def dspark_loss(p: DSparkPass, recipe: DSparkRecipe) -> tuple[torch.Tensor, torch.Tensor]:
    """(weighted loss, greedy accepted prefix per block [B, A])."""
    k = p.logits.shape[2]
    w = torch.exp(-torch.arange(k, dtype=torch.float32) / recipe.gamma) * p.valid  # [B, A, K]
    den = w.sum().clamp_min(1e-12)
    nll = F.cross_entropy(p.logits.reshape(-1, p.logits.shape[-1]), p.labels.reshape(-1), reduction="none")
    tv = 0.5 * (p.logits.softmax(-1) - p.target_logits.softmax(-1)).abs().sum(-1)  # [B, A, K]
    loss = recipe.ce_alpha * (nll.reshape(w.shape) * w).sum() / den + recipe.l1_alpha * (2 * tv * w).sum() / den
    if p.confidence is not None:
        bce = F.binary_cross_entropy_with_logits(p.confidence, (1.0 - tv).detach().clamp(0, 1), reduction="none")
        loss = loss + recipe.confidence_alpha * (bce * w).sum() / den
    hit = ((p.logits.argmax(-1) == p.labels) & p.valid).long().cumprod(dim=-1)
    return loss, hit.sum(dim=-1)


def teacher_forced_tau(model: DSparkModel, target, rows: list[list[int]], prompt_lens: list[int],
                       recipe: DSparkRecipe) -> dict[str, float]:
    """Mean 1 + accepted prefix over blocks anchored at every answer position of held-out rows."""
    ids, lengths = pad_rows(rows)
    accepted, blocks = 0.0, 0
    with torch.no_grad():
        for j in range(len(rows)):
            n = int(lengths[j])
            anchors = torch.arange(prompt_lens[j], n - 1)[None]
            if anchors.numel() == 0:  # a one-token answer (the target's EOS at once): no block to draft
                continue
            _, acc = dspark_loss(dspark_pass(model, target, ids[j:j + 1, :n], lengths[j:j + 1], anchors), recipe)
            accepted += float(acc.float().sum())
            blocks += anchors.numel()
    return {"tau_teacher_forced": 1.0 + accepted / max(blocks, 1), "blocks": blocks}


def init_model(recipe: DSparkRecipe, target) -> DSparkModel:
    heads = DSparkHeads(markov_rank=recipe.markov_rank, markov_head_type=recipe.markov_head_type,
                        enable_confidence_head=True, confidence_head_with_markov=recipe.confidence_head_with_markov)
    model = random_dspark(target, recipe.num_layers, recipe.block_size, word_id(MASK), heads=heads, seed=recipe.seed,
                          target_layer_ids=recipe.target_layer_ids)
    if recipe.init is not None:
        from dllm.drafters.dflash.io import load_dflash

        body = load_dflash(recipe.init)
        if tuple(body.target_layer_ids) != tuple(recipe.target_layer_ids):
            raise ValueError(f"init {recipe.init!r} taps {list(body.target_layer_ids)}, the recipe "
                             f"{list(recipe.target_layer_ids)}")
        model.load_state_dict(body.state_dict(), strict=False)
    with torch.no_grad():  # the Markov head starts silent: the warm-started base logits lead
        if model.markov_head is not None:
            model.markov_head.markov_w2.weight.zero_()
    model.embed_tokens.requires_grad_(False)
    model.lm_head.requires_grad_(False)
    return model.train()


def train_dspark(recipe: DSparkRecipe, out: Union[str, Path], *, threads: int = 0, progress: bool = True,
                 target: Any = None, stop_at: Optional[int] = None, time_limit: Optional[float] = None
                 ) -> dict[str, Any]:
    """Train ``recipe`` into ``out`` (``log.jsonl``, ``final/`` in the authors' format); ``stop_at`` /
    ``time_limit`` end the training early (``train_steps``), the drafter reached is evaluated and saved."""
    check_stop(stop_at, time_limit)  # before the target is loaded and the data regenerated
    out, target = start_run(recipe, out, threads=threads, target=target)
    model = init_model(recipe, target)
    t0 = time.perf_counter()
    data = draft_data(target, recipe)
    log = (out / "log.jsonl").open("a")
    log.write(json.dumps({"event": "regenerated", "pool": len(data.rows),
                          "seconds": round(time.perf_counter() - t0, 1)}) + "\n")

    def step_loss(step: int, ids: torch.Tensor, lengths: torch.Tensor, prompt_lens: torch.Tensor,
                  gen: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
        anchors = sample_anchors(prompt_lens, lengths, recipe.anchors, gen)
        return dspark_loss(dspark_pass(model, target, ids, lengths, anchors), recipe)

    done = train_steps(recipe, [p for p in model.parameters() if p.requires_grad], step_loss, data, log, t0,
                       weight_decay=0.0, progress=progress, stop_at=stop_at, time_limit=time_limit)
    model.eval()
    result = {"step": done, **teacher_forced_tau(model, target, data.held_rows, data.held_lens, recipe)}
    log.write(json.dumps(result) + "\n")
    log.close()
    write_record(save_dspark(model, out / "final"), recipe, result, t0)
    return result
