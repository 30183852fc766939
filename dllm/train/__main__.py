"""``python -m dllm.train --recipe NAME``: train a recipe end to end (``dllm/train/recipes/``).

Examples::

    python -m dllm.train --list-recipes                            # every recipe, one line each
    python -m dllm.train --recipe tiny-llada-long --dry-run         # its 28 stages, nothing trained
    python -m dllm.train --recipe tiny-llada-long --out runs/tll    # the whole chain, then the export
    python -m dllm.train --recipe tiny-llada-long --out runs/tll --resume   # after an interruption
    python -m dllm.train --recipe tiny-llada-long --from-stage length --init-from tiny-llada
                                                     # skip the PB-mini stage: start from the shipped tiny-llada
    python -m dllm.train --recipe tiny-llada --max-steps 2 --out /tmp/smoke   # a smoke run (every stage <= 2 steps)
    python -m dllm.train --probe tiny-llada-long lookup_k1:8 count_c8:32   # exact match on curriculum cases
    python -m dllm.train --recipe tiny-ar --threads 2               # the AR target (dllm/train/ar.py)
    python -m dllm.train --recipe tiny-ar-dflash --target runs/tiny-ar/final   # its DFlash drafter

A shipped diffusion model's recipe is a chain of stages (``Curriculum``: tiny-llada, tiny-dream,
tiny-llada-long, tiny-dream-long); each stage is one trainer run from the previous stage's checkpoint,
and the last one is exported as ``OUT/export/<recipe>`` (loads with ``dllm.load(path)``; the package's
copy is never overwritten). ``--resume`` keeps the finished stages and continues the unfinished one
from its newest checkpoint (safe on every restart); Ctrl-C keeps the finished stages and prints one
line. ``--threads`` / ``--device`` apply to every stage (default: each stage's as run; another thread
count gives other float sums). The AR target / AR draft / DFlash drafters are single runs
(``dllm/train/ar.py``, ``dllm/train/drafters/dflash_train.py``); their path / block heads are trained by
``dllm train path-head`` / ``dllm train block-head`` (their ``*.json`` say how).

Per-run overrides (applied to every stage): ``--steps N`` (schedule horizon; drops the phases it never
reaches), ``--lr``, ``--batch-size``, ``--warmup``, ``--seed``, ``--eval-every``, ``--save-every``,
``--log-every``, ``--bf16``, ``--compile``; ``--max-steps N`` stops every stage after N steps
(schedule unchanged).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Optional, Sequence

from dllm.train.data import MixtureConfig


def recipe_table() -> list[tuple[str, str]]:
    """(name, description) of every recipe: the diffusion chains, then the AR and DFlash runs."""
    from dllm.train.ar import ar_recipes
    from dllm.train.drafters.dflash_train import dflash_recipes
    from dllm.train.drafters.dflare_train import dflare_recipes
    from dllm.train.drafters.dspark_train import dspark_recipes
    from dllm.train.drafters.jetspec_train import jetspec_recipes
    from dllm.train.learn2pd import filter_recipes
    from dllm.train.recipes import curricula

    rows = [(n, d) for n, d in curricula.describe()]
    rows += [(n, d) for reg in (ar_recipes, dflash_recipes, dflare_recipes, jetspec_recipes, dspark_recipes, filter_recipes)
             for n, d in reg.describe()]
    return rows


def build_parser() -> argparse.ArgumentParser:
    rows = recipe_table()
    epilog = "recipes:\n" + "\n".join(f"  {n:<22} {d}" for n, d in rows)
    ap = argparse.ArgumentParser(prog="dllm train", description=__doc__.split("\n\n")[0], epilog=epilog,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--recipe", choices=[n for n, _ in rows], metavar="NAME", help="the recipe to train (below)")
    ap.add_argument("--list-recipes", action="store_true", help="list the recipes and exit")
    ap.add_argument("--dry-run", action="store_true", help="print the stage plan and exit (nothing trained)")
    ap.add_argument("--out", default=None, help="output directory (default: runs/<recipe>)")
    ap.add_argument("--resume", action="store_true", help="keep finished stages, continue the unfinished one")
    ap.add_argument("--threads", type=int, default=None, help="torch threads of every stage (0: torch default)")
    ap.add_argument("--device", default=None, help="cpu | cuda | cuda:0 ...")
    ap.add_argument("--max-steps", "--stop-at", dest="max_steps", type=int, default=None,
                    help="stop every stage after this many steps (smoke runs; the schedule is unchanged)")
    ap.add_argument("--from-stage", default=None, help="skip the stages before this one")
    ap.add_argument("--until-stage", default=None, help="stop after this stage (it is exported)")
    ap.add_argument("--init-from", default=None,
                    help="weights the first trained stage starts from (a model name or a directory); AR "
                         "recipes: with --start-phase")
    ap.add_argument("--time-limit", type=float, default=None, help="seconds per stage (then checkpoint and stop)")
    ap.add_argument("--no-export", action="store_true", help="do not export the last stage")
    ap.add_argument("--no-progress", action="store_true", help="no tqdm bar")
    ap.add_argument("--probe", nargs="+", default=None, metavar="MODEL [TASK:SIZE",
                    help="exact match of MODEL on TASK:SIZE cases, the curriculum variants lookup_kW / count_cM "
                         "included (dllm/train/probe.py), and exit")
    ap.add_argument("--n", type=int, default=16, help="--probe: examples per case")
    ap.add_argument("--target", default=None, help="DFlash recipes: the AR target (embedded name or directory)")
    ap.add_argument("--start-phase", type=int, default=0, help="AR recipes: skip the phases before this one")
    ap.add_argument("--steps", type=int, default=None, help="schedule horizon of every stage")
    ap.add_argument("--eval-every", type=int, default=None, help="evaluate every N steps (0: never)")
    ap.add_argument("--save-every", type=int, default=None, help="checkpoint every N steps (0: at the end)")
    ap.add_argument("--log-every", type=int, default=None, help="JSONL training line every N steps")
    ap.add_argument("--seed", type=int, default=None)
    ap.add_argument("--bf16", action="store_true", default=None, help="bf16 autocast (weights stay fp32)")
    ap.add_argument("--compile", action="store_true", default=None, help="torch.compile the transformer")
    # Hidden overrides (tests, quick experiments): model sizes and data.
    for flag, kind in (("--d-model", int), ("--n-layers", int), ("--n-heads", int),
                       ("--n-kv-heads", int), ("--mlp-hidden", int), ("--batch-size", int),
                       ("--lr", float), ("--warmup", int), ("--eval-per-size", int)):
        ap.add_argument(flag, type=kind, default=None, help=argparse.SUPPRESS)
    ap.add_argument("--tasks", default=None, help=argparse.SUPPRESS)  # comma-separated task names
    ap.add_argument("--tiny", action="store_true", help=argparse.SUPPRESS)  # d32, 1 layer, batch 8
    return ap


def overrides(args: argparse.Namespace):
    """The per-run overrides of the flags, as a function of a stage's recipe."""
    from dllm.train.recipes.base import Recipe

    def apply(recipe: Recipe) -> Recipe:
        model = {"d_model": args.d_model, "n_layers": args.n_layers, "n_heads": args.n_heads,
                 "n_kv_heads": args.n_kv_heads, "mlp_hidden": args.mlp_hidden}
        train = {"steps": args.steps, "eval_every": args.eval_every, "save_every": args.save_every,
                 "log_every": args.log_every, "seed": args.seed, "bf16": args.bf16, "compile": args.compile,
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
        return recipe.with_overrides(model, **train)

    return apply


def main(argv: Optional[Sequence[str]] = None) -> int:
    """The command line (``dllm train`` calls this too). Returns the exit status."""
    from dllm.train.recipes import curricula

    ap = build_parser()
    args = ap.parse_args(argv)
    if args.list_recipes:
        for name, description in recipe_table():
            print(f"{name:<22} {description}")
        return 0
    if args.probe:
        from dllm.train.probe import DEFAULT_CASES, probe

        try:
            probe(args.probe[0], args.probe[1:] or DEFAULT_CASES, n=args.n, threads=args.threads or 1,
                  log=lambda line: print(line, flush=True))
        except (ValueError, KeyError) as err:
            ap.error(str(err))
        return 0
    if args.recipe is None:
        ap.error("--recipe NAME is required (or --list-recipes, --probe)")
    from dllm.train.learn2pd import filter_recipes

    if args.recipe in filter_recipes:  # the learn2pd sampler's filters (dllm/train/learn2pd.py)
        return _filter_recipe(args)
    if args.recipe not in curricula:  # the AR / DFlash recipes of speculative decoding
        return _speculative_recipe(args)
    from dllm.train.runner import RunOptions, StageInterrupted, plan, run

    cur = curricula.get(args.recipe)
    opts = RunOptions(out=Path(args.out or f"runs/{args.recipe}"), resume=args.resume, progress=not args.no_progress,
                      threads=args.threads, device=args.device, max_steps=args.max_steps, from_stage=args.from_stage,
                      until_stage=args.until_stage,
                      init_from=args.init_from, time_limit=args.time_limit, export=not args.no_export)
    try:
        if args.dry_run:
            print("\n".join(plan(cur, opts, overrides(args))))
            return 0
        summary = run(cur, opts, overrides(args), log=lambda line: print(line, file=sys.stderr, flush=True))
    except StageInterrupted as stop:
        kept = ", ".join(stop.finished) or "none"
        print(f"\ninterrupted in stage {stop.stage!r} at step {stop.step} (it continues from its newest checkpoint); "
              f"finished stages kept in {opts.out}: {kept}; continue with --resume", file=sys.stderr)
        return 130
    except ValueError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    print(json.dumps(summary))
    return 0


def _filter_recipe(args: argparse.Namespace) -> int:
    """A Learn2PD filter (``dllm/train/learn2pd.py``): ``--steps`` sets its full-batch epochs."""
    from dataclasses import asdict

    from dllm.train.learn2pd import filter_recipes, train_filter

    recipe = filter_recipes.get(args.recipe).with_overrides(epochs=args.steps, seed=args.seed, lr=args.lr)
    out = args.out or f"runs/{args.recipe}"
    if args.dry_run:
        print(f"recipe {recipe.name}: one run of dllm/train/learn2pd.py")
        print(json.dumps(asdict(recipe), default=str))
        return 0
    try:
        summary = train_filter(recipe, out, threads=1 if args.threads is None else args.threads,
                               log=lambda line: print(line, file=sys.stderr, flush=True))
    except KeyboardInterrupt:
        print(f"\ninterrupted: {args.recipe} (nothing is written before the fit ends)", file=sys.stderr)
        return 130
    print(json.dumps({"out": out, **summary}))
    return 0


def _speculative_recipe(args: argparse.Namespace) -> int:
    """The AR target / AR draft / DFlash / DFlare / JetSpec / DSpark drafter recipes (``dllm/train/ar.py``,
    ``drafters/dflash_train.py``, ``dflare_train.py``, ``jetspec_train.py``, ``dspark_train.py``)."""
    from dataclasses import asdict

    from dllm.train.ar import ar_recipes, train_ar
    from dllm.train.drafters.dflash_train import dflash_recipes, train_dflash
    from dllm.train.drafters.dflare_train import dflare_recipes, train_dflare
    from dllm.train.drafters.dspark_train import dspark_recipes, train_dspark
    from dllm.train.drafters.jetspec_train import jetspec_recipes, train_jetspec

    out = args.out or f"runs/{args.recipe}"
    common = {"steps": args.steps, "seed": args.seed, "batch_size": args.batch_size, "lr": args.lr,
              "warmup": args.warmup}
    if args.recipe in ar_recipes:
        recipe = ar_recipes.get(args.recipe).with_overrides(**common, eval_every=args.eval_every)
        module = "dllm/train/ar.py"
    elif args.recipe in jetspec_recipes:
        recipe = jetspec_recipes.get(args.recipe).with_overrides(**common, target=args.target)
        module = "dllm/train/drafters/jetspec_train.py"
    elif args.recipe in dspark_recipes:
        recipe = dspark_recipes.get(args.recipe).with_overrides(**common, target=args.target)
        module = "dllm/train/drafters/dspark_train.py"
    elif args.recipe in dflare_recipes:
        recipe = dflare_recipes.get(args.recipe).with_overrides(**common, target=args.target)
        module = "dllm/train/drafters/dflare_train.py"
    else:
        recipe = dflash_recipes.get(args.recipe).with_overrides(**common, target=args.target)
        module = "dllm/train/drafters/dflash_train.py"
    if args.dry_run:
        print(f"recipe {recipe.name}: one run of {module}")
        print(json.dumps(asdict(recipe), default=str))
        return 0
    try:
        if args.recipe in ar_recipes:
            last = train_ar(recipe, out, threads=args.threads or 0, progress=not args.no_progress,
                            stop_at=args.max_steps, start_phase=args.start_phase, init_from=args.init_from)
        elif args.recipe in jetspec_recipes:
            last = train_jetspec(recipe, out, threads=args.threads or 0, progress=not args.no_progress)
        elif args.recipe in dspark_recipes:
            last = train_dspark(recipe, out, threads=args.threads or 0, progress=not args.no_progress)
        elif args.recipe in dflare_recipes:
            last = train_dflare(recipe, out, threads=args.threads or 0, progress=not args.no_progress)
        else:
            last = train_dflash(recipe, out, threads=args.threads or 0, progress=not args.no_progress)
    except KeyboardInterrupt:
        print(f"\ninterrupted: {args.recipe} (its run directory {out} keeps what was written)", file=sys.stderr)
        return 130
    print(json.dumps({"out": out, **last}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
