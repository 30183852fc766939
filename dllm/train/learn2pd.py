"""The Learn2PD filter (``dllm.samplers.learn2pd``): ``dllm train --recipe learn2pd-tiny``.

The authors' procedure (ims-kdks/Learning-to-Parallel-Decoding: ``generate_training_data.py``,
``train.ipynb``), on the tiny models' own training tasks:

1. Prompts: ``prompts_per_task`` training instances of every PB-mini task (round-robin over its
   default sizes, test-split prompts redrawn), decoded as ``dllm.generate`` decodes them by
   default: one block of the answer length (``block_lengths``: None), or blocks of the given lengths.
2. The reference answer of each prompt: the model's own greedy decode at one token per step
   (``low_confidence``, the authors' ``generate`` with ``steps = gen_length``).
3. Labels, by the *Extremely Greedy Parallel* oracle: decode again; at every step read, over the
   block's positions (committed ones included), the arg-max ``x0`` and its probability ``c`` (the
   filter's input, as ``dllm.samplers.learn2pd`` reads it), label a position 1 when ``x0`` equals the
   reference token there, and commit every mask so labelled. A step whose block arg-max equals the
   last step's (the authors' guard against an oracle that never finishes) writes the reference
   into the block and ends it (its record kept).
4. The filter (``Learn2PDFilter``, width 32, hidden 32) is fitted full-batch with AdamW (lr 3e-3)
   on the binary cross-entropy of its logits against the labels (the block's positions only, a
   narrower block zero-padded), records shuffled and split 80 / 10 / 10 (train / validation /
   test); the validation loss is logged, the test split is reported (accuracy, precision, share
   of positive predictions, at the authors' 0.9 and the sampler's 0.96).

The output directory (``--out``, default ``runs/<recipe>``) holds ``log.jsonl`` and ``final/``
(``filter.json`` with the recipe, the data counts and the evaluation; ``filter.safetensors``);
``dllm train export --run runs/learn2pd-tiny --name learn2pd-tiny`` copies ``final/`` into the
package. Deterministic for a given thread count (``--threads``; the shipped filter: 1).
"""

from __future__ import annotations

import json
import random
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Optional, Sequence, Union

import torch
import torch.nn.functional as F

from dllm import tasks as T
from dllm.options import Overridable, check_choice, check_int, check_number
from dllm.registry import Registry
from dllm.samplers.learn2pd import INPUTS, Learn2PDFilter, block_confidence
from dllm.train.data import is_held_out


@dataclass(frozen=True)
class FilterRecipe(Overridable):
    """Which models' traces, how many prompts, and how the filter is fitted."""

    name: str
    models: tuple[str, ...] = ("tiny-llada", "tiny-dream")  # the traces of each (one filter for all)
    tasks: tuple[str, ...] = ()  # empty: the PB-mini suite
    prompts_per_task: int = 48  # training instances per task and model
    block_lengths: tuple[Optional[int], ...] = (None,)  # decode layouts; None: one block of the answer length
    width: int = 32  # the filter's input width (the widest block it reads)
    hidden: int = 32
    input: str = "confidence"  # what the filter reads: c (the authors') or -log(1 - c) ("surprisal", ours)
    epochs: int = 40000  # full-batch AdamW steps (the authors' notebook: 40,000)
    lr: float = 3e-3
    weight_decay: float = 0.01  # AdamW's default, as the notebook
    seed: int = 0
    log_every: int = 500
    description: str = ""

    def __post_init__(self) -> None:
        for name in ("prompts_per_task", "width", "hidden", "epochs", "log_every"):
            check_int(name, getattr(self, name), 1)
        check_number("lr", self.lr, low=0.0, low_open=True)
        check_choice("input", self.input, INPUTS)
        for bl in self.block_lengths:
            if bl is not None:
                check_int("block_lengths", bl, 1)


filter_recipes: Registry[FilterRecipe] = Registry("recipe")
filter_recipes.add("learn2pd-tiny", FilterRecipe(
    "learn2pd-tiny", description="Learn2PD filter on tiny-llada's and tiny-dream's PB-mini traces"),
    description="Learn2PD filter (the authors' input: confidences) on the tiny models' traces")
filter_recipes.add("learn2pd-tiny-surprisal", FilterRecipe(
    "learn2pd-tiny-surprisal", input="surprisal",
    description="Learn2PD filter reading -log(1 - c) on tiny-llada's and tiny-dream's PB-mini traces"),
    description="Learn2PD filter reading -log(1 - c) (ours) on the tiny models' traces")


@dataclass
class Traces:
    """One record per (row, step): the filter's input and its labels, padded to the filter's width."""

    conf: torch.Tensor  # [N, width] float32, zeros right of the block
    label: torch.Tensor  # [N, width] float32, 1 where the arg-max equals the reference token
    valid: torch.Tensor  # [N, width] bool, the block's positions

    @staticmethod
    def cat(parts: Sequence["Traces"]) -> "Traces":
        return Traces(*(torch.cat([getattr(p, f) for p in parts]) for f in ("conf", "label", "valid")))

    def __len__(self) -> int:
        return self.conf.shape[0]


def training_examples(task: str, n: int, seed: int) -> list[T.Example]:
    """``n`` training instances of ``task``, round-robin over its default sizes, test prompts redrawn."""
    rng = random.Random(f"learn2pd|{seed}|{task}")
    sizes = list(T.get_task(task).default_sizes)
    out: list[T.Example] = []
    while len(out) < n:
        ex = T.generate(task, rng, sizes[len(out) % len(sizes)])
        if not is_held_out(ex):
            out.append(ex)
    return out


@torch.no_grad()
def egp_traces(model, prompts: Sequence[Sequence[int]], reference: torch.Tensor, block_length: int,
               width: int) -> tuple[Traces, torch.Tensor]:
    """The Extremely Greedy Parallel oracle's records for prompts of one length: ``reference`` [B, G]
    the model's own one-token-per-step answers; blocks of ``block_length`` (the last may be shorter).
    Rows decode together (no padding: equal prompt lengths), each with the authors' batch-1 rules.
    Returns the records and the oracle's answers [B, G] (the reference's, by construction)."""
    mask = model.mask_id
    b, g = reference.shape
    lp = len(prompts[0])
    x = torch.cat([torch.tensor([list(p) for p in prompts]), torch.full((b, g), mask)], dim=1)  # [B, L]
    parts = []
    for s in range(lp, lp + g, block_length):
        e = min(s + block_length, lp + g)
        w = e - s
        if w > width:
            raise ValueError(f"a block of {w} positions is wider than the filter ({width})")
        ref = reference[:, s - lp:e - lp]  # [B, W]
        prev: Optional[torch.Tensor] = None
        while True:
            live = (x[:, s:e] == mask).any(dim=1)  # [B] rows still decoding this block
            if not bool(live.any()):
                break
            logits = model(x).logits[:, s:e]  # [B, W, V]
            x0 = logits.argmax(dim=-1)  # [B, W]: the arg-max, as the sampler's filter input reads it
            conf = block_confidence(logits, x0)
            correct = x0 == ref
            pad = (0, width - w)
            parts.append(Traces(F.pad(conf.float()[live], pad), F.pad(correct.float()[live], pad),
                                F.pad(torch.ones_like(correct)[live], pad)))
            stuck = live & (prev == x0).all(dim=1) if prev is not None else torch.zeros_like(live)
            block = x[:, s:e]
            block.copy_(torch.where(stuck[:, None], ref, torch.where(correct & (block == mask), x0, block)))
            prev = x0
    empty = Traces(torch.zeros(0, width), torch.zeros(0, width), torch.zeros(0, width, dtype=torch.bool))
    return (Traces.cat(parts) if parts else empty), x[:, lp:]


def collect(recipe: FilterRecipe, log=print, progress: bool = False) -> Traces:
    """Every model's EGP records on the recipe's prompts and layouts (``progress``: a tqdm bar over the
    models' tasks)."""
    from tqdm.auto import tqdm

    from dllm.engine import generate
    from dllm.models import load

    parts = []
    names = recipe.tasks or T.suite_task_names()
    for model_name in recipe.models:
        model = load(model_name, dtype=torch.float32)
        n0 = sum(len(p) for p in parts)
        for task in tqdm(names, disable=not progress, desc=f"{model_name} traces", leave=False):
            for ex_group in _by_size(training_examples(task, recipe.prompts_per_task, recipe.seed)):
                g = T.answer_length(task, ex_group[0].size)
                prompts = [model.generation_prompt(" ".join(T.prompt_words(ex))) for ex in ex_group]
                for bl in recipe.block_lengths:
                    block = g if bl is None else min(bl, g)
                    ref = generate(model, prompts, sampler="low_confidence", gen_length=g,
                                        block_length=block).generated  # [B, G], one token per step
                    for idx in _by_length(prompts):
                        parts.append(egp_traces(model, [prompts[i] for i in idx], ref[idx], block, recipe.width)[0])
        log(f"{model_name}: {sum(len(p) for p in parts) - n0} records")
    return Traces.cat(parts)


def _by_size(examples: Sequence[T.Example]) -> list[list[T.Example]]:
    groups: dict[int, list[T.Example]] = {}
    for ex in examples:
        groups.setdefault(ex.size, []).append(ex)
    return [groups[k] for k in sorted(groups)]


def _by_length(prompts: Sequence[Sequence[int]]) -> list[list[int]]:
    groups: dict[int, list[int]] = {}
    for i, p in enumerate(prompts):
        groups.setdefault(len(p), []).append(i)
    return [groups[k] for k in sorted(groups)]


def masked_bce(logits: torch.Tensor, label: torch.Tensor, valid: torch.Tensor) -> torch.Tensor:
    """Mean binary cross-entropy with logits over the valid positions."""
    loss = F.binary_cross_entropy_with_logits(logits, label, reduction="none")
    return (loss * valid).sum() / valid.sum().clamp_min(1)


def split(data: Traces, seed: int) -> tuple[Traces, Traces, Traces]:
    """Shuffled 80 / 10 / 10 train / validation / test (the notebook's split)."""
    order = torch.randperm(len(data), generator=torch.Generator().manual_seed(seed))
    n1 = int(len(data) * 0.8)
    n2 = n1 + int(len(data) * 0.1)
    pick = lambda idx: Traces(data.conf[idx], data.label[idx], data.valid[idx])  # noqa: E731
    return pick(order[:n1]), pick(order[n1:n2]), pick(order[n2:])


@torch.no_grad()
def evaluate(f: Learn2PDFilter, data: Traces, thresholds: Sequence[float] = (0.9, 0.96)) -> dict[str, Any]:
    """Loss, and per threshold: accuracy, precision (a position accepted is final), the share of the
    positions accepted, over the valid positions. A split with no position (a small run's validation or
    test split may hold no record) has null numbers, not NaN (``filter.json`` stays valid JSON)."""
    if not bool(data.valid.any()):
        return {"loss": None, "positions": 0, "final_share": None,
                **{f"at_{t}": {"accuracy": None, "precision": None, "accepted": None} for t in thresholds}}
    logits = f(data.conf)
    out: dict[str, Any] = {"loss": round(float(masked_bce(logits, data.label, data.valid)), 5),
                           "positions": int(data.valid.sum()), "final_share": round(float(
                               data.label[data.valid].mean()), 4)}
    prob = torch.sigmoid(logits)[data.valid]
    truth = data.label[data.valid] > 0.5
    for t in thresholds:
        pred = prob > t
        out[f"at_{t}"] = {"accuracy": round(float((pred == truth).float().mean()), 4),
                          "precision": round(float(truth[pred].float().mean()), 4) if bool(pred.any()) else None,
                          "accepted": round(float(pred.float().mean()), 4)}
    return out


def fit(recipe: FilterRecipe, train: Traces, val: Traces, log=print,
        progress: bool = False) -> tuple[Learn2PDFilter, list[dict]]:
    """Full-batch AdamW on the masked BCE (the notebook's loop; ``progress``: a tqdm bar over the epochs)."""
    from tqdm.auto import tqdm

    torch.manual_seed(recipe.seed)
    f = Learn2PDFilter(recipe.width, recipe.hidden, input=recipe.input)
    opt = torch.optim.AdamW(f.parameters(), lr=recipe.lr, weight_decay=recipe.weight_decay)
    history = []
    for epoch in tqdm(range(recipe.epochs), disable=not progress, desc=f"{recipe.name} fit", leave=False):
        opt.zero_grad()
        loss = masked_bce(f(train.conf), train.label, train.valid)
        loss.backward()
        opt.step()
        if epoch % recipe.log_every == 0 or epoch == recipe.epochs - 1:
            with torch.no_grad():
                val_loss = float(masked_bce(f(val.conf), val.label, val.valid)) if len(val) else None
            row = {"epoch": epoch, "loss": round(float(loss.detach()), 6), "val_loss": None if val_loss is None else
                   round(val_loss, 6)}
            history.append(row)
            log(json.dumps(row))
    return f.eval(), history


def train_filter(recipe: FilterRecipe, out: Union[str, Path], *, threads: int = 1, log=print,
                 progress: bool = False) -> dict[str, Any]:
    """Collect, fit, evaluate and save ``out/final`` (``filter.json`` + ``filter.safetensors``; the json
    holds the recipe, the record counts, the first and last logged losses and the evaluation);
    ``progress``: tqdm bars over the collection's tasks and the fit's epochs (on stderr)."""
    if threads > 0:
        torch.set_num_threads(threads)
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    t0 = time.perf_counter()
    data = collect(recipe, log=log, progress=progress)
    t_collect = time.perf_counter() - t0
    train, val, test = split(data, recipe.seed)
    if not bool(train.valid.any()):
        raise ValueError(f"recipe {recipe.name!r}: {len(data)} records leave the training split (80%) empty; "
                         f"raise prompts_per_task (got {recipe.prompts_per_task}) or add tasks or models")
    with (out / "log.jsonl").open("w") as fh:
        f, history = fit(recipe, train, val, log=lambda line: (log(line), fh.write(line + "\n")), progress=progress)
    report = {"train": evaluate(f, train), "validation": evaluate(f, val), "test": evaluate(f, test)}
    log(json.dumps({"test": report["test"]}))
    f.meta = {"recipe": asdict(recipe), "records": {"train": len(train), "validation": len(val), "test": len(test)},
              "evaluation": report, "first": history[0], "last": history[-1],
              "seconds": {"collect": round(t_collect, 1), "total": round(time.perf_counter() - t0, 1)},
              "threads": threads, "command": f"dllm train --recipe {recipe.name} --threads {threads}"}
    f.save(out / "final")
    return {"records": len(data), "test": report["test"], "seconds": f.meta["seconds"]}


__all__ = ["FilterRecipe", "Traces", "collect", "egp_traces", "evaluate", "filter_recipes", "fit", "masked_bce",
           "split", "train_filter", "training_examples"]
