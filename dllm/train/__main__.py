"""``python -m dllm.train --recipe tiny-llada``: train a recipe (``dllm/train/recipes.py``).

Examples::

    python -m dllm.train --recipe tiny-llada                      # the full reference run
    python -m dllm.train --recipe tiny-ar --threads 2             # the AR target (dllm/train/ar.py)
    python -m dllm.train --recipe tiny-ar --start-phase 1 --init-from runs/tiny-ar/phase-0   # its phase 2 alone
    python -m dllm.train --recipe tiny-ar-dflash --target runs/tiny-ar/final   # its DFlash drafter
    python -m dllm.train --recipe tiny-dream --threads 2 --resume  # continue from the newest checkpoint
    mkdir -p runs && nohup python -m dllm.train --recipe tiny-llada --threads 1 --resume \\
        --no-progress >> runs/tiny-llada.out 2>&1 &                # in the background

Every flag defaults to the recipe's value, so the plain command reproduces the recipe. ``--resume``
continues from the newest ``OUT/checkpoint-*`` (a fresh start when there is none) and is safe to
use on every (re)start. ``--stop-at N`` stops after step N without changing the schedule (whose
horizon is ``--steps``); changing ``--steps`` on resume changes the cosine horizon from then on.
A ``--steps`` at or below a phase's start (``dllm/train/schedule.py``) drops that phase, and
``--tasks`` drops every later phase (their mixtures would bring the other tasks back).
"""

from __future__ import annotations

import argparse
import json
import sys
from typing import Optional, Sequence

from dllm.train import long_recipes as _long_recipes  # noqa: F401  (registers tiny-llada-long)
from dllm.train.data import MixtureConfig


def build_parser() -> argparse.ArgumentParser:
    from dllm.train.ar import ar_recipes
    from dllm.train.dflash_train import dflash_recipes
    from dllm.train.recipes import recipes

    ap = argparse.ArgumentParser(prog="python -m dllm.train", description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    names = [*recipes.names(), *ar_recipes.names(), *dflash_recipes.names()]
    ap.add_argument("--recipe", required=True, choices=names, help="the recipe to train")
    ap.add_argument("--target", default=None, help="DFlash recipes: the AR target (embedded name or directory)")
    ap.add_argument("--start-phase", type=int, default=0, help="AR recipes: skip the phases before this one")
    ap.add_argument("--init-from", default=None, help="AR recipes: weights to start from (OUT/phase-N)")
    ap.add_argument("--out", default=None, help="output directory (default: runs/<recipe>)")
    ap.add_argument("--steps", type=int, default=None, help="total steps = schedule horizon")
    ap.add_argument("--stop-at", type=int, default=None, help="stop after this step (schedule unchanged)")
    ap.add_argument("--resume", action="store_true", help="continue from the newest checkpoint in --out")
    ap.add_argument("--eval-every", type=int, default=None, help="evaluate every N steps (0: never)")
    ap.add_argument("--save-every", type=int, default=None, help="checkpoint every N steps (0: at the end)")
    ap.add_argument("--log-every", type=int, default=None, help="JSONL training line every N steps")
    ap.add_argument("--device", default=None, help="cpu | cuda | cuda:0 ...")
    ap.add_argument("--seed", type=int, default=None)
    ap.add_argument("--threads", type=int, default=None, help="torch threads (0: torch default)")
    ap.add_argument("--bf16", action="store_true", default=None, help="bf16 autocast (weights stay fp32)")
    ap.add_argument("--compile", action="store_true", default=None, help="torch.compile the transformer")
    ap.add_argument("--no-progress", action="store_true", help="no tqdm bar")
    # Hidden overrides (tests, quick experiments): model sizes and data.
    for flag, kind in (("--d-model", int), ("--n-layers", int), ("--n-heads", int),
                       ("--n-kv-heads", int), ("--mlp-hidden", int), ("--batch-size", int),
                       ("--lr", float), ("--warmup", int), ("--eval-per-size", int)):
        ap.add_argument(flag, type=kind, default=None, help=argparse.SUPPRESS)
    ap.add_argument("--tasks", default=None, help=argparse.SUPPRESS)  # comma-separated task names
    ap.add_argument("--tiny", action="store_true", help=argparse.SUPPRESS)  # d32, 1 layer, batch 8
    return ap


def main(argv: Optional[Sequence[str]] = None) -> int:
    from dllm.train.recipes import get_recipe, recipes
    from dllm.train.trainer import Trainer

    args = build_parser().parse_args(argv)
    if args.recipe not in recipes:  # the AR / DFlash recipes of speculative decoding
        return _speculative_recipe(args)
    recipe = get_recipe(args.recipe)
    model = {"d_model": args.d_model, "n_layers": args.n_layers, "n_heads": args.n_heads,
             "n_kv_heads": args.n_kv_heads, "mlp_hidden": args.mlp_hidden}
    train = {"steps": args.steps, "eval_every": args.eval_every, "save_every": args.save_every,
             "log_every": args.log_every, "device": args.device, "seed": args.seed,
             "threads": args.threads, "bf16": args.bf16, "compile": args.compile,
             "batch_size": args.batch_size, "lr": args.lr, "warmup": args.warmup,
             "eval_per_size": args.eval_per_size}
    if args.tiny:  # a ~15k-parameter model and small batches, for tests; explicit flags still win
        kv = 2 if recipe.family == "llada" else 1
        model = {"d_model": 32, "n_layers": 1, "n_heads": 2, "n_kv_heads": kv, "mlp_hidden": 64,
                 **{k: v for k, v in model.items() if v is not None}}
        train = {"batch_size": 8, "eval_per_size": 1, "warmup": 2,
                 **{k: v for k, v in train.items() if v is not None}}
    if args.tasks:
        train["mixture"] = MixtureConfig(tasks=tuple(t.strip() for t in args.tasks.split(",") if t.strip()))
    # a shorter --steps drops the phases it never reaches; --tasks replaces every phase's mixture
    horizon = args.steps if args.steps is not None else recipe.train.steps
    train["phases"] = () if args.tasks else tuple(p for p in recipe.train.phases if p.start < horizon)
    recipe = recipe.with_overrides(model, **train)
    out = args.out or f"runs/{recipe.name}"
    trainer = Trainer(recipe, out, resume=args.resume, progress=not args.no_progress)
    last = trainer.train(stop_at=args.stop_at)
    print(json.dumps({"out": out, "step": trainer.step, "best_mean_c0": trainer.best, **last}))
    return 0


def _speculative_recipe(args: argparse.Namespace) -> int:
    """The AR target / AR draft / DFlash drafter recipes (``dllm/train/ar.py``, ``dflash_train.py``)."""
    from dllm.train.ar import ar_recipes, train_ar
    from dllm.train.dflash_train import dflash_recipes, train_dflash

    out = args.out or f"runs/{args.recipe}"
    common = {"steps": args.steps, "seed": args.seed, "batch_size": args.batch_size, "lr": args.lr,
              "warmup": args.warmup}
    if args.recipe in ar_recipes:
        recipe = ar_recipes.get(args.recipe).with_overrides(**common, eval_every=args.eval_every)
        last = train_ar(recipe, out, threads=args.threads or 0, progress=not args.no_progress, stop_at=args.stop_at,
                        start_phase=args.start_phase, init_from=args.init_from)
    else:
        recipe = dflash_recipes.get(args.recipe).with_overrides(**common, target=args.target)
        last = train_dflash(recipe, out, threads=args.threads or 0, progress=not args.no_progress)
    print(json.dumps({"out": out, **last}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
