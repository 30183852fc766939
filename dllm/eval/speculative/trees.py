"""``dllm bench trees --trees chain,ddtree,taps --budgets 16,32,64,128``: draft trees vs their budget.

DFlash drafts K = B - 1 positions per round; a tree builder (``dllm.drafters.trees``) turns its
per-position distributions into a tree of ``budget`` nodes that the target verifies in one forward
(a Plan's ``tree``, ``speculative_generate(plan=...)``). A bigger tree accepts more per round and costs a wider
forward; this benchmark measures that trade-off at batch 1 and picks a budget per builder without
looking at the prompts it reports on:

1. two disjoint prompt splits of the tasks (default: the long-answer suite): *held-out* = test
   instances n..2n-1 of every task size, *reported* = instances 0..n-1 (what ``bench spec`` runs);
2. held-out, greedy: every builder x budget; per builder the budget with the most tokens/s is
   *chosen*;
3. reported, at every temperature: every builder x budget (the chosen budget marked), the no-tree
   DFlash chain (no tree) and plain ``target.generate``, the baseline of ``speedup``.

Within a split every configuration decodes prompt i in turn before prompt i + 1 (as ``bench spec``),
so a busy machine slows them alike. A ``TreeRow`` per (split, temperature, configuration): ``tau`` =
generated tokens / target forwards (prefill included), ``tau_round`` = mean tokens per verification
round, ``width`` = mean tokens per verification forward, measured (1 + the tree's nodes: 1 + budget
for ddtree / taps, 1 + min(budget, K) for chain, B without a tree, 1 for ``generate``), target
forwards, tokens/s, ``speedup`` over ``generate``, ``greedy_match`` (T = 0: token-identical to
``generate``; every configuration is lossless) and ``chosen``.

Also the *cost curve* of one target forward: batch 1, a warm cache holding ``--prefix`` tokens, T =
1 + N new tokens under a 4-D mask (as tree verification runs it), N in ``COST_SIZES``, the median of
``--cost-repeats`` calls; a least-squares line t(N) = a + b N, with ``b / a`` the relative cost of a
node. ``--png``: tau and tokens/s vs budget per builder (greedy, reported split).

Paired (``trees_report.paired``): every row keeps its per-prompt target forwards and generated
tokens (``prompt_forwards``, ``prompt_tokens``), so two builders at the same budget are compared on
the same reported prompts: tau a - tau b with a 95% bootstrap interval over the prompts and the
prompts where a's tau is higher / equal / lower (printed, and under ``"paired"`` in the JSON).
"""

from __future__ import annotations

import argparse
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Optional, Sequence

import torch

from dllm.flags import output_file, output_png
from dllm import tasks as T
from dllm.eval.interrupt import until_interrupted
from dllm.eval.speculative.flags import check_common_args, check_not_all_skipped, check_temperatures, split_list
from dllm.eval.speculative.report import format_table
from dllm.eval.speculative.runners import device_of
from dllm.eval.speculative.tree_cost import COST_SIZES, CostCurve, fit_line, forward_cost
from dllm.eval.speculative.tree_runs import (BASELINES, Config, TreeBench, TreeRow, configs_for, greedy_diffs,
                                             run_split, tree_runner, widths)
from dllm.eval.speculative.trees_report import (COLUMNS, MIN_PROMPTS, RESAMPLES, format_diffs, format_paired,
                                                format_selection, paired_rows, plot_trees)

DEFAULT_BUILDERS: tuple[str, ...] = ("chain", "ddtree", "taps")
DEFAULT_BUDGETS: tuple[int, ...] = (16, 32, 64, 128)


def tree_builder_names() -> list[str]:
    from dllm.drafters.trees.builders import load_builders

    return load_builders().names()


def check_builders(names: Sequence[str]) -> None:
    valid = tree_builder_names()
    bad = [b for b in names if b not in valid]
    if bad or not names:
        raise ValueError(f"unknown tree builder(s) {bad or list(names)!r}; valid builders: {', '.join(valid)}")
    if len(set(names)) != len(names):
        raise ValueError(f"each tree builder may appear once, got {list(names)}; valid builders: {', '.join(valid)}")


def check_budgets(budgets: Sequence[Any]) -> None:
    bad = [b for b in budgets if isinstance(b, bool) or not isinstance(b, int) or b < 1]
    if bad or not budgets:
        raise ValueError(f"budgets must be integers >= 1 (draft nodes per tree, e.g. 16,32,64,128), "
                         f"got {list(budgets)!r}")
    if len(set(budgets)) != len(budgets):
        raise ValueError(f"each budget may appear once, got {list(budgets)}")


# ---- the splits ----------------------------------------------------------------------------------
def reported_examples(tasks: Sequence[str], n: int) -> list[T.Example]:
    """Test instances 0..n-1 of every default size of every task (what ``bench spec`` reports on)."""
    return [ex for t in tasks for ex in T.test_split(t, None, n=n)]


def held_out_examples(tasks: Sequence[str], n: int) -> list[T.Example]:
    """Test instances n..2n-1 of every default size of every task: disjoint from ``reported_examples``
    (``test_split`` lists sizes one after another, so the slice is taken per size)."""
    return [ex for t in tasks for s in T.get_task(t).default_sizes for ex in T.test_split(t, s, n=2 * n)[n:]]


def choose_budgets(rows: Sequence[TreeRow]) -> dict[str, TreeRow]:
    """Per tree builder, its greedy row with the most tokens/s (ties: the smaller budget). Only
    held-out rows may choose: ValueError for any other."""
    best: dict[str, TreeRow] = {}
    for r in rows:
        if r.split != "held-out":
            raise ValueError(f"budgets are chosen on the held-out split only, got a {r.split!r} row ({r.method})")
        if r.budget is None or r.temperature != 0 or r.status != "ok" or r.tokens_per_s is None:
            continue
        cur = best.get(r.builder)
        if cur is None or (r.tokens_per_s, -r.budget) > (cur.tokens_per_s, -cur.budget):
            best[r.builder] = r
    return best


def run_trees(
    target,
    drafter,
    builders: Sequence[str],
    budgets: Sequence[int],
    held_out: Sequence[T.Example],
    reported: Sequence[T.Example],
    *,
    temperatures: Sequence[float] = (0.0, 1.0),
    seed: int = 0,
    max_new_tokens: Optional[int] = None,
    block_size: Optional[int] = None,
    progress: bool = True,
) -> TreeBench:
    """Choose each builder's budget on ``held_out`` (greedy, tokens/s), then run every builder x
    budget and the baselines on ``reported`` at every temperature, the chosen budgets marked.
    ``held_out`` and ``reported`` must not share a prompt."""
    check_builders(builders)
    check_budgets(budgets)
    check_temperatures(temperatures)
    overlap = {tuple(T.prompt_words(ex)) for ex in held_out} & {tuple(T.prompt_words(ex)) for ex in reported}
    if overlap:
        raise ValueError(f"the held-out and reported splits share {len(overlap)} prompt(s); they must be disjoint")
    configs = configs_for(builders, budgets)
    kw = dict(seed=seed, max_new_tokens=max_new_tokens, block_size=block_size, progress=progress)
    held = run_split(target, drafter, configs, held_out, split="held-out", temperatures=(0.0,), **kw)
    chosen = choose_budgets(held)
    rep = run_split(target, drafter, configs, reported, split="reported", temperatures=temperatures, **kw)
    for r in held + rep:
        r.chosen = r.builder in chosen and r.budget == chosen[r.builder].budget
    return TreeBench(held, rep, chosen)


# ---- command line --------------------------------------------------------------------------------
def parse_args(argv: Optional[Sequence[str]] = None) -> argparse.Namespace:
    """The flags of ``dllm bench trees``; ValueError (naming the valid values) for bad ones."""
    ap = argparse.ArgumentParser(prog="dllm bench trees", description=__doc__.split("\n\n")[0])
    ap.add_argument("--trees", nargs="+", default=[",".join(DEFAULT_BUILDERS)],
                    help="tree builders, comma/space separated (dllm.drafters.trees)")
    ap.add_argument("--budgets", nargs="+", default=[",".join(map(str, DEFAULT_BUDGETS))],
                    help="draft nodes per tree, comma/space separated")
    ap.add_argument("--target", default="tiny-ar", help="transformers causal LM (embedded name, directory, Hub id)")
    ap.add_argument("--dflash", default="tiny-ar-dflash", help="DFlash drafter checkpoint of the target")
    ap.add_argument("--tasks", nargs="+", default=None, help="task names (default: the long-answer suite)")
    ap.add_argument("--n", type=int, default=4, help="test examples per task size in each split")
    ap.add_argument("--block-size", type=int, default=None, help="B (K = B - 1 drafted positions); default the "
                                                                     "drafter's")
    ap.add_argument("--temperatures", nargs="+", default=["0,1"], help="comma/space separated, >= 0 (reported split)")
    ap.add_argument("--max-new-tokens", type=int, default=None, help="default: each example's answer length")
    ap.add_argument("--seed", type=int, default=0, help="prompt i is seeded with seed + i")
    ap.add_argument("--prefix", type=int, default=100, help="cached tokens before the timed forwards (cost curve)")
    ap.add_argument("--cost-repeats", type=int, default=15, help="timed forwards per size (cost curve; median)")
    ap.add_argument("--device", default=None, help="where the target loads (default CPU)")
    ap.add_argument("--threads", type=int, default=None, help="torch CPU threads (1 on a busy machine)")
    ap.add_argument("--out", type=output_file, default=None, help="write everything as JSON here")
    ap.add_argument("--png", type=output_png, default=None, help="write the tau / tokens/s vs budget plot here")
    ap.add_argument("--no-progress", action="store_true")
    args = ap.parse_args(argv)
    args.trees = split_list(args.trees)
    check_builders(args.trees)
    try:
        args.budgets = [int(b) for b in split_list(args.budgets)]
    except ValueError:
        raise ValueError(f"--budgets must be integers >= 1 such as 16,32,64,128, got {args.budgets!r}") from None
    check_budgets(args.budgets)
    checked = check_common_args(args, ("n", "block_size", "threads", "max_new_tokens", "prefix", "cost_repeats"))
    if 2 * args.n > T.TEST_SPLIT_SIZE:  # two disjoint splits of n; instances past the split are not held out
        raise ValueError(f"--n {args.n}: the reported and held-out splits take 2n instances per task size and the "
                         f"test split holds {T.TEST_SPLIT_SIZE}; give --n <= {T.TEST_SPLIT_SIZE // 2}")
    return checked


def main(argv: Optional[Sequence[str]] = None) -> int:
    """``dllm bench trees [flags]``: print the tables, write ``--out`` JSON and ``--png``.
    Ctrl-C: status 130 and one line (the budgets are chosen on the whole held-out split, so no row is
    final before both splits are: nothing is written)."""
    args = parse_args(argv)
    if args.threads is not None:
        torch.set_num_threads(args.threads)
    return until_interrupted(lambda: _run(args), lambda: "the tree benchmark's rows are final only when both "
                             "splits are decoded; nothing written (fewer --budgets or a smaller --n run sooner)")


def _run(args: argparse.Namespace) -> int:
    from dllm.drafters.base import make_drafter
    from dllm.models.targets import load_target

    target, _ = load_target(args.target, device=args.device)
    drafter = make_drafter("dflash", model=args.dflash)
    block = args.block_size or drafter.block_size
    held, reported = held_out_examples(args.tasks, args.n), reported_examples(args.tasks, args.n)
    curve = forward_cost(target, prefix=args.prefix, repeats=args.cost_repeats, taps=drafter.target_layers)
    bench = run_trees(target, drafter, args.trees, args.budgets, held, reported, temperatures=args.temperatures,
                      seed=args.seed, max_new_tokens=args.max_new_tokens, block_size=block,
                      progress=not args.no_progress)
    print(f"target {args.target}, drafter {args.dflash}: block size {block} (K = {block - 1}), batch 1, "
          f"{torch.get_num_threads()} threads, {device_of(target)}; tasks {', '.join(args.tasks)}; "
          f"reported = test instances 0..{args.n - 1} per size ({len(reported)} prompts), "
          f"held-out = {args.n}..{2 * args.n - 1} per size ({len(held)} prompts)")
    print()
    print(curve.format())
    print("\nheld-out split (chooses each builder's budget by tokens/s, T = 0):")
    print(format_table(bench.held_out, COLUMNS))
    print("\nreported split:")
    print(format_table(bench.reported, COLUMNS))
    diffs = format_diffs(bench.held_out + bench.reported)
    if diffs:
        print("\ngreedy mismatches with target.generate (first differing token per prompt):")
        print(diffs)
    pairs = paired_rows(bench.reported)
    if pairs:
        print(f"\nbuilders paired on the reported prompts, same budget (chain verifies min(budget, K) nodes): tau "
              f"over all prompts, the 95% interval of tau a - tau b from {RESAMPLES:,} bootstrap draws of the prompts "
              f"(n/a below {MIN_PROMPTS} prompts):")
        print(format_paired(pairs))
    print("\nbudget selection (chosen on held-out; 'best budget' = the reported split's own best, for comparison):")
    print(format_selection(bench, args.temperatures))
    payload = {"target": args.target, "dflash": args.dflash, "tasks": args.tasks, "n_per_size": args.n,
               "splits": {"held-out": {"instances": f"{args.n}..{2 * args.n - 1} per size", "prompts": len(held),
                                       "temperatures": [0.0], "role": "chooses each builder's budget"},
                          "reported": {"instances": f"0..{args.n - 1} per size", "prompts": len(reported),
                                       "temperatures": args.temperatures, "role": "reported"}},
               "builders": args.trees, "budgets": args.budgets, "block_size": block, "temperatures": args.temperatures,
               "seed": args.seed, "threads": torch.get_num_threads(), "device": str(device_of(target)),
               "selection": bench.selection(), "cost_curve": curve.to_json(),
               "paired": [{"temperature": t, "budget": n, **p.to_json()} for t, n, p in pairs],
               "rows": [r.to_json() for r in bench.held_out + bench.reported]}
    if args.out:
        out = Path(args.out)
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(json.dumps(payload, indent=2) + "\n")
        print(f"wrote {out}")
    if args.png:
        png = Path(args.png)
        png.parent.mkdir(parents=True, exist_ok=True)
        temp = 0.0 if 0.0 in args.temperatures else min(args.temperatures)
        title = (f"target {args.target}, DFlash drafter {args.dflash}: {len(reported)} reported prompts, "
                 f"T = {temp:g}, batch 1")
        try:
            plot_trees(bench.reported, png, title, temperature=temp)
            print(f"wrote {png}")
        except ImportError:
            print("no plot: install matplotlib for --png (pip install matplotlib)")
    check_not_all_skipped(bench.held_out + bench.reported)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())


__all__ = ["BASELINES", "COLUMNS", "COST_SIZES", "Config", "CostCurve", "DEFAULT_BUDGETS", "DEFAULT_BUILDERS",
           "TreeBench", "TreeRow", "check_budgets", "check_builders", "choose_budgets", "configs_for", "fit_line",
           "format_diffs", "format_paired", "format_selection", "forward_cost", "greedy_diffs", "held_out_examples",
           "main", "paired_rows", "parse_args", "plot_trees", "reported_examples", "run_split", "run_trees",
           "tree_runner", "widths"]
