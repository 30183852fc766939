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
reaches), ``--lr``, ``--batch-size``, ``--warmup`` (every phase of a stage, or of an AR run: the later phases' peak lr
and own batch sizes scale with the stage's, ``dllm.train.schedule.overridden_phases``), ``--seed``, ``--eval-every``,
``--save-every``, ``--log-every``, ``--bf16``, ``--compile``; ``--max-steps N`` stops every stage after N steps
(schedule unchanged). Counts are checked as the flags are parsed (``--steps`` / ``--log-every`` /
``--max-steps`` >= 1; ``--eval-every`` / ``--save-every`` / ``--threads`` >= 0, 0 meaning never / at the
end / torch's default; ``--batch-size`` >= 1, ``--warmup`` >= 0, ``--lr`` > 0), and so is ``--device`` (one this
machine has).

``--resume`` continues the same training: the flags that change what is trained (``TRAINING_FLAGS`` of
``dllm/train/plan_file.py``: ``--tiny``, the model sizes, ``--tasks``, ``--steps``, ``--lr``, ``--warmup``,
``--batch-size``, ``--seed``, ``--bf16``, ``--eval-per-size``) are recorded in ``OUT/plan.json`` by the first
run, and a resume that gives another value, or leaves one out or adds one, is refused naming the flag and
both values (exit status 2); so is another ``--max-steps``. ``--resume`` alone starts where the run started (its
``--from-stage`` / ``--init-from``, in ``plan.json`` too); another ``--from-stage`` starts elsewhere, another
``--init-from`` at the recorded start is refused naming both. Free to change on a resume: ``--threads``,
``--device``, ``--compile`` (other float sums), ``--eval-every``, ``--save-every``, ``--log-every``,
``--time-limit``, ``--no-export``, ``--no-progress``, ``--until-stage``. A run the time limit stopped exits
0 (its summary's ``stopped``), its last line (stderr) saying so and the command that continues it.

The single-run recipes take fewer flags (``RECIPE_FLAGS``), and any other flag given is an error naming
it, not a flag silently dropped: AR runs take ``--max-steps``, ``--init-from``, ``--start-phase``,
``--eval-every``, ``--log-every``; the DFlash / DFlare / JetSpec / DSpark drafter runs ``--target``,
``--max-steps``, ``--time-limit`` (seconds of training steps; the drafter reached is evaluated and
saved), ``--log-every`` and ``--tiny`` (a 16-row pool, for tests), JetSpec and DSpark ``--init-from`` (the
DFlash drafter they start from); the Learn2PD filters ``--steps`` (epochs), ``--seed``, ``--lr``. They
train on the CPU (``--device cpu`` only), and none has ``--resume``, ``--save-every`` or an export.
"""

from __future__ import annotations

import argparse
import json
import sys
from dataclasses import replace
from pathlib import Path
from typing import Optional, Sequence

from dllm.flags import above_zero, at_least, seconds
from dllm.train.data import restricted, task_list
from dllm.train.plan_file import flag_of, training_flags


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


def device(text: str) -> str:
    """An argparse type: a device this machine has (``dllm.models.loading.resolve_device``), returned as
    given; the error names the devices that exist."""
    from dllm.models.loading import resolve_device

    try:
        resolve_device(text)
    except ValueError as err:
        raise argparse.ArgumentTypeError(str(err)) from None
    return text


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
    ap.add_argument("--threads", type=at_least(0), default=None,
                    help="torch threads of every stage (0: torch default)")
    ap.add_argument("--device", type=device, default=None,
                    help="cpu | cuda | cuda:0 ... (the AR, drafter and filter recipes: cpu only)")
    ap.add_argument("--max-steps", "--stop-at", dest="max_steps", type=at_least(1), default=None,
                    help="stop every stage after this many steps (smoke runs; the schedule is unchanged)")
    ap.add_argument("--from-stage", default=None, help="skip the stages before this one")
    ap.add_argument("--until-stage", default=None, help="stop after this stage (it is exported)")
    ap.add_argument("--init-from", default=None,
                    help="weights the first trained stage starts from (a model name or a directory); AR "
                         "recipes: with --start-phase")
    ap.add_argument("--time-limit", type=seconds, default=None,
                    help="seconds per stage (then checkpoint and stop); drafter recipes: seconds of training "
                         "steps (then evaluate and save)")
    ap.add_argument("--no-export", action="store_true", help="do not export the last stage")
    ap.add_argument("--no-progress", action="store_true", help="no tqdm bar")
    ap.add_argument("--probe", nargs="+", default=None, metavar="MODEL [TASK:SIZE",
                    help="exact match of MODEL on TASK:SIZE cases, the curriculum variants lookup_kW / count_cM "
                         "included (dllm/train/probe.py), and exit")
    ap.add_argument("--n", type=int, default=16, help="--probe: examples per case")
    ap.add_argument("--target", default=None, help="drafter recipes: the AR target (embedded name or directory)")
    ap.add_argument("--start-phase", type=at_least(0), default=0,
                    help="AR recipes: skip the phases before this one")
    ap.add_argument("--steps", type=at_least(1), default=None, help="schedule horizon of every stage")
    ap.add_argument("--eval-every", type=at_least(0), default=None, help="evaluate every N steps (0: never)")
    ap.add_argument("--save-every", type=at_least(0), default=None,
                    help="checkpoint every N steps (0: at the end)")
    ap.add_argument("--log-every", type=at_least(1), default=None, help="JSONL training line every N steps")
    ap.add_argument("--seed", type=int, default=None)
    ap.add_argument("--bf16", action="store_true", default=None, help="bf16 autocast (weights stay fp32)")
    ap.add_argument("--compile", action="store_true", default=None, help="torch.compile the transformer")
    # Hidden overrides (tests, quick experiments): model sizes and data.
    for flag, kind in (("--d-model", at_least(1)), ("--n-layers", at_least(1)), ("--n-heads", at_least(1)),
                       ("--n-kv-heads", at_least(1)), ("--mlp-hidden", at_least(1)), ("--batch-size", at_least(1)),
                       ("--lr", above_zero("a number")), ("--warmup", at_least(0)), ("--eval-per-size", at_least(1))):
        ap.add_argument(flag, type=kind, default=None, help=argparse.SUPPRESS)
    ap.add_argument("--tasks", default=None, help=argparse.SUPPRESS)  # comma-separated task names
    ap.add_argument("--tiny", action="store_true", help=argparse.SUPPRESS)  # d32, 1 layer, batch 8
    return ap


# The flags each kind of recipe honours (argparse dests). Any other flag given is refused by name before
# anything is loaded or written, so that no flag is silently dropped.
_EVERY_RECIPE = frozenset({"recipe", "out", "dry_run", "threads", "device", "no_progress", "steps", "seed"})
_DRAFTER = _EVERY_RECIPE | {"target", "max_steps", "time_limit", "log_every", "batch_size", "lr", "warmup", "tiny"}
RECIPE_FLAGS: dict[str, frozenset[str]] = {
    "diffusion chain": _EVERY_RECIPE | {
        "resume", "max_steps", "from_stage", "until_stage", "init_from", "time_limit", "no_export", "eval_every",
        "save_every", "log_every", "bf16", "compile", "batch_size", "lr", "warmup", "eval_per_size", "tasks", "tiny",
        "d_model", "n_layers", "n_heads", "n_kv_heads", "mlp_hidden"},
    "AR run": _EVERY_RECIPE | {"max_steps", "init_from", "start_phase", "eval_every", "log_every", "batch_size", "lr",
                               "warmup", "eval_per_size"},
    "drafter run": _DRAFTER,
    "warm-started drafter run": _DRAFTER | {"init_from"},  # JetSpec, DSpark: the DFlash drafter they start from
    "filter fit": _EVERY_RECIPE | {"lr"},
}
CPU_ONLY = frozenset(RECIPE_FLAGS) - {"diffusion chain"}  # their trainers run on the CPU


def recipe_kind(name: str) -> str:
    """The kind of run recipe ``name`` is (a key of ``RECIPE_FLAGS``)."""
    from dllm.train.ar import ar_recipes
    from dllm.train.drafters.dspark_train import dspark_recipes
    from dllm.train.drafters.jetspec_train import jetspec_recipes
    from dllm.train.learn2pd import filter_recipes
    from dllm.train.recipes import curricula

    if name in curricula:
        return "diffusion chain"
    if name in ar_recipes:
        return "AR run"
    if name in filter_recipes:
        return "filter fit"
    return "warm-started drafter run" if name in jetspec_recipes or name in dspark_recipes else "drafter run"


def check_recipe_flags(ap: argparse.ArgumentParser, args: argparse.Namespace) -> None:
    """An argparse error (exit status 2) naming the flags given that ``args.recipe``'s kind of run does not
    honour, and the flags it takes; and one for a ``--device`` other than the CPU where the recipe's trainer
    runs on the CPU only."""
    kind = recipe_kind(args.recipe)
    taken = RECIPE_FLAGS[kind]
    given = [dest for dest, value in vars(args).items() if value != ap.get_default(dest)]
    refused = [flag_of(dest) for dest in given if dest not in taken]
    what = f"recipe {args.recipe!r} ({'an' if kind[0] in 'AEIOU' else 'a'} {kind})"
    if refused:
        ap.error(f"{', '.join(refused)}: not taken by {what}; it takes "
                 f"{', '.join(flag_of(d) for d in sorted(taken - {'recipe'}))}")
    if args.device is not None and kind in CPU_ONLY:
        import torch

        if torch.device(args.device).type != "cpu":
            ap.error(f"--device {args.device}: {what} trains on the CPU only; pass --device cpu or leave it out")


def overrides(args: argparse.Namespace):
    """The per-run overrides of the flags, as a function of a stage's recipe."""
    from dllm.train.recipes.base import Recipe
    from dllm.train.schedule import overridden_phases

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
        # a shorter --steps drops the phases it never reaches, --lr / --batch-size / --warmup reach the later ones
        # too; --tasks restricts every phase's mixture
        horizon = args.steps if args.steps is not None else recipe.train.steps
        phases = overridden_phases([p for p in recipe.train.phases if p.start < horizon], base_lr=recipe.train.lr,
                                   base_batch=recipe.train.batch_size, lr=train.get("lr"),
                                   batch_size=train.get("batch_size"), warmup=train.get("warmup"))
        if args.tasks:
            names = task_list(args.tasks)
            train["mixture"] = restricted(recipe.train.mixture, names, recipe.name)
            phases = tuple(replace(p, mixture=restricted(p.mixture, names, recipe.name, p.start)) for p in phases)
        train["phases"] = phases
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
    check_recipe_flags(ap, args)
    from dllm.train.learn2pd import filter_recipes

    if args.recipe in filter_recipes:  # the learn2pd sampler's filters (dllm/train/learn2pd.py)
        return _filter_recipe(args)
    if args.recipe not in curricula:  # the AR / DFlash recipes of speculative decoding
        return _speculative_recipe(args)
    from dllm.train.plan_file import time_limit_note
    from dllm.train.runner import RunOptions, StageInterrupted, plan, run

    cur = curricula.get(args.recipe)
    try:
        opts = RunOptions(out=Path(args.out or f"runs/{args.recipe}"), resume=args.resume,
                          progress=not args.no_progress, threads=args.threads, device=args.device,
                          max_steps=args.max_steps, from_stage=args.from_stage, until_stage=args.until_stage,
                          init_from=args.init_from, time_limit=args.time_limit, export=not args.no_export,
                          flags=training_flags(ap, args))
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
    note = time_limit_note(cur, opts, summary)  # a stop is not a failure: exit status 0, and this line
    if note:
        print(note, file=sys.stderr)
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
                               log=lambda line: print(line, file=sys.stderr, flush=True), progress=not args.no_progress)
    except KeyboardInterrupt:
        print(f"\ninterrupted: {args.recipe} (nothing is written before the fit ends)", file=sys.stderr)
        return 130
    print(json.dumps({"out": out, **summary}))
    return 0


# --tiny for a drafter run: a few regenerated rows and held-out examples (tests); explicit flags still win
TINY_DRAFTER = {"pool": 16, "batch_size": 4, "eval_examples": 1}


def _speculative_recipe(args: argparse.Namespace) -> int:
    """The AR target / AR draft / DFlash / DFlare / JetSpec / DSpark drafter recipes (``dllm/train/ar.py``,
    ``drafters/dflash_train.py``, ``dflare_train.py``, ``jetspec_train.py``, ``dspark_train.py``): one run
    each, with every flag of ``RECIPE_FLAGS`` for its kind applied (``_speculative_run``)."""
    from dataclasses import asdict

    recipe, module, train = _speculative_run(args)
    out = args.out or f"runs/{args.recipe}"
    if args.dry_run:
        stop = [f"{args.max_steps} steps" if args.max_steps else "",
                f"{args.time_limit:g} s of steps" if args.time_limit else ""]
        print(f"recipe {recipe.name}: one run of {module}"
              + (f", stopped after {' or '.join(s for s in stop if s)}" if any(stop) else ""))
        print(json.dumps(asdict(recipe), default=str))
        return 0
    try:
        last = train(recipe, out)
    except KeyboardInterrupt:
        print(f"\ninterrupted: {args.recipe} (its run directory {out} keeps what was written)", file=sys.stderr)
        return 130
    print(json.dumps({"out": out, **last}))
    return 0


def _speculative_run(args: argparse.Namespace):
    """(the recipe with the flags' overrides, its module, ``train(recipe, out)``) of an AR or drafter recipe.
    ``--max-steps`` stops the run after that many steps (the schedule unchanged), ``--time-limit`` (drafters)
    after that many seconds of training steps; the drafter reached is evaluated and saved as ``final/``.
    ``--init-from`` is the AR run's starting weights, JetSpec's and DSpark's DFlash warm start."""
    from functools import partial

    from dllm.train.ar import ar_recipes, check_start, overridden_ar_phases, train_ar
    from dllm.train.drafters.dflare_train import dflare_recipes, train_dflare
    from dllm.train.drafters.dflash_train import dflash_recipes, train_dflash
    from dllm.train.drafters.dspark_train import dspark_recipes, train_dspark
    from dllm.train.drafters.jetspec_train import jetspec_recipes, train_jetspec

    common = {"steps": args.steps, "seed": args.seed, "batch_size": args.batch_size, "lr": args.lr,
              "warmup": args.warmup, "log_every": args.log_every}
    run = {"threads": args.threads or 0, "progress": not args.no_progress, "stop_at": args.max_steps}
    if args.recipe in ar_recipes:
        base = ar_recipes.get(args.recipe)  # --lr / --warmup reach its later phases too
        recipe = base.with_overrides(**common, eval_every=args.eval_every, eval_per_size=args.eval_per_size,
                                     phases=overridden_ar_phases(base, lr=args.lr, warmup=args.warmup))
        check_start(recipe, args.start_phase, args.max_steps)  # the dry run refuses them too
        return recipe, "dllm/train/ar.py", partial(train_ar, **run, start_phase=args.start_phase,
                                                   init_from=args.init_from)
    drafter = {**common, "target": args.target}
    if args.tiny:
        drafter = {**drafter, **{k: v for k, v in TINY_DRAFTER.items() if drafter.get(k) is None}}
    for registry, train, module, warm_start in ((jetspec_recipes, train_jetspec, "jetspec_train.py", "init_from"),
                                                (dspark_recipes, train_dspark, "dspark_train.py", "init"),
                                                (dflare_recipes, train_dflare, "dflare_train.py", None),
                                                (dflash_recipes, train_dflash, "dflash_train.py", None)):
        if args.recipe in registry:
            recipe = registry.get(args.recipe).with_overrides(**drafter, **({warm_start: args.init_from}
                                                                            if warm_start else {}))
            return recipe, f"dllm/train/drafters/{module}", partial(train, **run, time_limit=args.time_limit)
    raise ValueError(f"recipe {args.recipe!r} is not an AR or drafter recipe")


if __name__ == "__main__":  # as `dllm train recipe`: bad input as one error line (exit status 2), Ctrl-C as one
    try:
        sys.exit(main())
    except (ValueError, TypeError, KeyError, OSError) as err:
        print(f"python -m dllm.train: error: {err}", file=sys.stderr)
        sys.exit(2)
    except KeyboardInterrupt:
        print("python -m dllm.train: interrupted", file=sys.stderr)
        sys.exit(130)
