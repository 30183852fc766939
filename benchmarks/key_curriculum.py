"""Curricula for the long-prompt models (README "Measured"; the chains as run: benchmarks/long-keys.sh
(tiny-llada-long's keys), benchmarks/long-keys-dream.sh, benchmarks/long-count.sh (counting),
benchmarks/long-rope.sh and benchmarks/long-rope-dream.sh (RoPE base 10^6), benchmarks/long-count-dream.sh
(tiny-dream-long's count at base 10^6; the shipped models: long-rope.sh rt-8, long-count-dream.sh rdc-6); notes:
benchmarks/training-notes-2026-12-01.md)

    python benchmarks/key_curriculum.py stage INIT OUT STEPS LR BATCH TASK:WEIGHT:LO:HI ...   # one stage
    [N=16] [THREADS=1] python benchmarks/key_curriculum.py eval MODEL [TASK:SIZE ...]   # exact match

1,500 more steps on 3-item-key lookups alone left the first ``tiny-llada-long`` at chance even on
4-row tables (``benchmarks/lookup_focus.py``), and it was at chance with ONE-item keys too: the
match-and-copy step itself was missing. Here it is learned on 1-item keys (16 keys, 4-16 rows)
first, then 2-item keys, then the suite's 3-item keys, then at length. The narrow-key tables are
``lookup_long`` prompts (same task word, same value format, only the rows are narrower), so nothing
new enters the vocabulary; likewise ``count_cM`` are ``count_long`` prompts with 1..M occurrences,
in lists of >= M items (the suite: >= 24; counting forms only on short lists). Both are registered
under their own names (own size ranges) with the suite task's word (``Task.word``). A stage continues
the long recipe of its init's family (``tiny-llada-long`` or ``tiny-dream-long``).

``eval``: exact match (one token per step) on ``TASK:SIZE`` cases (``lookup_kW`` / ``count_cM``
allowed), by default 1-item keys at 8 / 16 rows, 2-item keys at 8 / 32 rows, and ``lookup_long``
(its test split) at 4 / 8 / 16 / 42 / 85 rows.
"""

from __future__ import annotations

import json
import os
import random
import sys
from pathlib import Path

import torch

from dllm import tasks as T
from dllm.tasks.base import register, tasks
from dllm.tasks.long_prompt import CountTask, LookupTask
from dllm.train import long_recipes
from dllm.train.data import MixtureConfig
from dllm.train.recipes import Recipe, TrainConfig, recipes
from dllm.train.trainer import Trainer

WIDTH_SIZES = {1: (4, 16), 2: (4, 48)}  # rows per table for the narrow keys


class NarrowLookup(LookupTask):
    """``lookup_long`` with narrower keys (registered as ``lookup_kW``, prompts carry ``lookup_long``)."""


def narrow_task(width: int) -> str:
    name = f"lookup_k{width}"
    if name not in tasks:
        lo, hi = WIDTH_SIZES[width]
        register(NarrowLookup(name=name, description=f"lookup_long with {width}-item keys (training only)",
                              min_size=lo, max_size=hi, default_sizes=(lo,), size_meaning="table rows n",
                              repeats=(1, 1), key_width=width, suite="curriculum", holdout=False,
                              word="lookup_long"))
    return name


class NarrowCount(CountTask):
    """``count_long`` with 1..M occurrences, in lists of >= M items (the suite: >= 24); registered as
    ``count_cM``, prompts carry ``count_long``."""


def narrow_count(max_count: int) -> str:
    name = f"count_c{max_count}"
    if name not in tasks:
        register(NarrowCount(name=name, description=f"count_long with 1-{max_count} occurrences (training only)",
                             min_size=max_count, max_size=2040, default_sizes=(max(24, max_count),),
                             size_meaning="list length n", max_count=max_count, suite="curriculum",
                             holdout=False, word="count_long"))
    return name


def curriculum_task(name: str) -> str:
    """``lookup_kW`` / ``count_cM``: the narrow variants (registered on first use); else ``name``."""
    if name.startswith("lookup_k"):
        return narrow_task(int(name[len("lookup_k"):]))
    if name.startswith("count_c"):
        return narrow_count(int(name[len("count_c"):]))
    return name


def fields(spec: str, form: str, example: str, types: tuple[type, ...]) -> list:
    """``spec`` split on ':' into ``types``; a spec of another shape is refused by name."""
    parts = spec.split(":")
    try:
        if len(parts) != len(types):
            raise ValueError
        return [t(p) for t, p in zip(types, parts)]
    except ValueError:
        raise SystemExit(f"{spec!r}: expected {form}, e.g. {example}") from None


def base_recipe(init: str) -> Recipe:
    """The long recipe a stage continues: ``init``'s own (a long model's name), or the long recipe of
    the family in a checkpoint's ``../recipe.json`` or an exported model's ``training.json``
    (``tiny-llada-long`` / ``tiny-dream-long``)."""
    if init in long_recipes.LONG_RECIPES:  # (importing long_recipes registers them)
        return recipes.get(init)
    meta, exported = Path(init).parent / "recipe.json", Path(init) / "training.json"
    if meta.is_file():
        family = json.loads(meta.read_text())["family"]
    elif exported.is_file():  # an exported model directory (dllm.train.export), e.g. a shipped model of an older commit
        family = json.loads(exported.read_text())["recipe"]["family"]
    else:
        raise SystemExit(f"init {init!r}: neither a long model ({', '.join(long_recipes.LONG_RECIPES)}), "
                         f"a checkpoint beside a recipe.json nor an exported model with a training.json")
    long = {recipes.get(n).family: recipes.get(n) for n in long_recipes.LONG_RECIPES}
    if family not in long:
        raise SystemExit(f"init {init!r}: family {family!r} has no long recipe (valid: {', '.join(long)})")
    return long[family]


def stage_model(init: str, base: Recipe) -> dict:
    """The model fields of a stage: ``base``'s with the RoPE base of ``init`` itself (a checkpoint's or
    an embedded model's config: the shipped long models are at 10^6, their recipes at 10^4), or
    ``$ROPE_THETA`` when set (long-context continued training with a larger base, as Code Llama's
    10^4 -> 10^6: more rotary frequencies stay below one turn over 2,048 positions, so more
    dimensions can match content at any distance). Every other field must match: ``warm_start``
    checks the tensors' shapes."""
    from dllm.models import load

    theta = os.environ.get("ROPE_THETA")
    if not theta:
        return dict(base.model, rope_theta=float(load(init).config.rope_theta))
    try:
        value = float(theta)
    except ValueError:
        value = float("nan")
    if not value > 0 or value == float("inf"):
        raise SystemExit(f"ROPE_THETA={theta!r}: expected a finite RoPE base > 0, e.g. 1e6")
    return dict(base.model, rope_theta=value)


def stage(init: str, out: str, steps: int, lr: float, batch: int, specs: list[str]) -> None:
    """One stage from ``init`` (a model name or a checkpoint directory): the tasks
    ``name:weight:lo:hi`` (``lookup_kW``: keys of W items, ``count_cM``: 1..M occurrences; sizes
    lo..hi in the task's own unit), ``batch`` examples per step, warm-up 50, cosine to 10%, a fresh
    AdamW, ``$THREADS`` threads (default 1); ``$STOP_AT``: stop after that many steps (the schedule
    still spans ``steps``); ``$TIME_LIMIT``: stop (and checkpoint) after that many seconds;
    ``$DEVICE`` (default cpu) and ``$BF16=1`` (bf16 autocast) for a GPU (benchmarks/gpu-train-long.sh);
    ``$ROPE_THETA``: a new RoPE base (``stage_model``)."""
    torch.set_num_threads(int(os.environ.get("THREADS", "1")))
    base = base_recipe(init)
    names, weights, sizes = [], [], []
    for spec in specs:
        name, weight, lo, hi = fields(spec, "TASK:WEIGHT:LO:HI", "lookup_k1:1:4:8", (str, float, int, int))
        names.append(curriculum_task(name))
        weights.append(weight)
        sizes.append(tuple(range(lo, hi + 1)))
    mix = MixtureConfig(tasks=tuple(names), weights=tuple(weights), sizes=tuple(sizes))
    cfg = TrainConfig(steps=steps, batch_size=batch, lr=lr, warmup=50, eval_every=0, save_every=200, mixture=mix,
                      device=os.environ.get("DEVICE", "cpu"), bf16=os.environ.get("BF16", "0") == "1")
    recipe = Recipe("key-curriculum-stage", base.family, stage_model(init, base), cfg, f"stage from {init}",
                    init_from=init)
    stop, limit = os.environ.get("STOP_AT"), os.environ.get("TIME_LIMIT")
    print(Trainer(recipe, out, progress=False).train(stop_at=int(stop) if stop else None,
                                                    time_limit=float(limit) if limit else None), flush=True)


DEFAULT_EVAL = ("lookup_k1:8", "lookup_k1:16", "lookup_k2:8", "lookup_k2:32", "lookup_long:4", "lookup_long:8",
                "lookup_long:16", "lookup_long:42", "lookup_long:85")


def evaluate(name: str, cases: list[str]) -> None:
    """Exact match (one token per step) of ``name`` on ``task:size`` cases, ``$N`` examples each
    (default 16): the narrow variants drawn from ``random.Random(123)``, the suite's tasks from their
    test split; ``$THREADS`` threads (default 1)."""
    from dllm.scoring.exact_match import decode_and_score, load_model

    torch.set_num_threads(int(os.environ.get("THREADS", "1")))
    n = int(os.environ.get("N", "16"))
    model = load_model(name)
    for case in cases or DEFAULT_EVAL:
        task_name, size = fields(case, "TASK:SIZE", "lookup_long:42", (str, int))
        task = curriculum_task(task_name)
        t = T.get_task(task)
        if isinstance(t, (NarrowLookup, NarrowCount)):
            rng = random.Random(123)
            examples = [t.generate(rng, size) for _ in range(n)]
        else:
            examples = T.test_split(task, size, n=n)
        tally = decode_and_score(model, examples)
        print(f"{name} {case} ({t.args_length(size) + 3} words): "
              f"{100 * sum(tally.correct.values()) / tally.examples:.1f}% of {tally.examples}", flush=True)


if __name__ == "__main__":
    # the fewest arguments per command: eval MODEL; stage INIT OUT STEPS LR BATCH TASK:WEIGHT:LO:HI
    need = {"eval": 3, "stage": 8}
    if len(sys.argv) < 2 or sys.argv[1] not in need or len(sys.argv) < need[sys.argv[1]]:
        raise SystemExit(__doc__)
    if sys.argv[1] == "eval":
        evaluate(sys.argv[2], sys.argv[3:])
    else:
        stage(sys.argv[2], sys.argv[3], int(sys.argv[4]), float(sys.argv[5]), int(sys.argv[6]), sys.argv[7:])
