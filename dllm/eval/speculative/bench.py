"""``dllm bench spec``: speculative decoding methods side by side, at batch 1, on the same prompts.

Each prompt of the tasks (default: the long-answer suite) is decoded one at a time (as DFlash's
reference and transformers' assisted generation do) by every method in turn, so a busy machine slows
them alike. ``METHODS``: ``generate`` (plain ``target.generate``, the baseline), ``ar`` (our loop,
block size 1), ``dflash`` / ``ngram`` / ``dlm`` (our loop with that drafter, block size B), ``failfast``
(when named: the ``--dlm`` model drafting FailFast's dynamic length, arXiv 2512.20573, <= B - 1 a round),
``assisted`` (transformers' ``assistant_model=``: up to 20 drafts, fewer once the assistant's
confidence drops below 0.4) and ``prompt_lookup`` (transformers' ``prompt_lookup_num_tokens=10``).

A ``Row`` per method and temperature: ``tau`` = generated tokens / target forwards (prefill and bonus
included; 1.0 without drafts); ``tau_round`` = mean tokens per verification round (DFlash's
convention: our prefill is no round, transformers' first forward is one, it verifies drafts);
``acceptance`` (k-1: fraction of rounds accepting >= k drafts); target / drafter forwards
(transformers' counted by forward pre-hooks); tokens/s; wall time; ``speedup`` (tokens/s over
``generate``'s); exact-match ``accuracy``; at T = 0 ``greedy_match`` (outputs token-identical to
``generate``'s; every method is lossless). A method that cannot run is skipped, with the reason.

By default a quick run (``QUICK``: greedy only, ``copy_long`` at one prompt per size: 3 prompts, about
1.5 minutes on one busy CPU core); ``--full`` is the whole table (``FULL``: T = 0 and 1, the long-answer
suite at 4 prompts per size: 36 prompts). A flag given
explicitly wins over either. A drafter or model flag naming no checkpoint is refused before the
target loads. Ctrl-C ends the run with the finished temperatures' rows printed and, with ``--out``,
written (``dllm.eval.interrupt``).
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Optional, Sequence, Union

import torch

from dllm.flags import output_file
from dllm import tasks as T
from dllm.eval.interrupt import finished, until_interrupted
from dllm.eval.speculative.flags import (check_common_args, check_not_all_skipped, check_temperatures, failure_reason,
                                         split_list)
from dllm.eval.speculative.report import (COLUMNS, Row, acceptance_by_position, compare_to_baseline, format_table,
                                          summarize, task_vocab)
from dllm.eval.speculative.runners import (METHODS, MORE_METHODS, Method, Runner, Sample, commits_from_starts, counting,
                                           device_of, hf_runner, loop_runner, make_runner)

WARMUP_TOKENS = 8
QUICK = {"n": 1, "temperatures": ["0"], "tasks": ["copy_long"]}  # the default: greedy, 3 prompts (~1.5 min, 1 core)
FULL = {"n": 4, "temperatures": ["0,1"], "tasks": None}  # --full: the whole table (tasks: the long-answer suite)
MODEL_FLAGS = {"dflash": "dflash", "assisted": "assistant", "dlm": "dlm", "failfast": "dlm"}  # method -> its model flag


def parse_options(text: str) -> dict:
    """``"key=value,..."`` -> drafter options ("" -> none); the drafter itself checks the names."""
    from dllm.registry import parse_spec

    return parse_spec(f"failfast:{text}", "failfast options")[1] if text.strip() else {}


def check_methods(names: Sequence[str]) -> None:
    """Every name is a built-in method or a registered drafter (run by our loop with its
    ``--drafter-options``): ValueError listing the valid ones."""
    from dllm.drafters.base import drafters, load_builtin_drafters

    load_builtin_drafters()
    valid = (*METHODS, *MORE_METHODS, *(n for n in drafters.names() if n not in METHODS + MORE_METHODS))
    bad = [m for m in names if m not in valid]
    if bad or not names:
        raise ValueError(f"unknown method(s) {bad or list(names)!r}; valid methods: {', '.join(valid)}")


def check_tree(tree: Optional[str], block_size: Union[int, str]) -> None:
    """``--tree``: a registered tree builder with valid options, with an int ``--block-size``."""
    if tree is None:
        return
    if block_size == "auto":
        raise ValueError("--block-size auto (the drafter's block head) picks each prompt's tree itself; drop --tree, "
                         "or give an int --block-size with it")
    from dllm.drafters.trees.builders import make_tree_builder

    try:
        make_tree_builder(tree)
    except (KeyError, TypeError, ValueError) as err:
        raise ValueError(f"--tree {tree!r}: {err}") from None


def drafter_options(specs: Sequence[str], methods: Sequence[str]) -> dict[str, dict]:
    """``--drafter-options NAME:k=v,...`` (repeatable) -> {NAME: options}, each checked against its
    drafter's config before anything loads; a NAME not among ``methods`` is refused (it would not run)."""
    from dllm.drafters.base import drafters, load_builtin_drafters
    from dllm.registry import build_config, parse_spec

    load_builtin_drafters()
    out: dict[str, dict] = {}
    for spec in specs:
        name, options = parse_spec(spec, "--drafter-options")
        if name not in drafters:
            raise ValueError(f"--drafter-options {spec!r}: unknown drafter {name!r}; registered: "
                             f"{', '.join(drafters.names())}")
        canonical = drafters.canonical(name)  # an alias names its drafter, whose method runs with the options
        if canonical not in methods:
            also = "" if canonical == name else (f" ({name!r} names the {canonical!r} drafter" + (
                f"; the {name!r} method is transformers' and takes no drafter options)" if name in methods else ")"))
            raise ValueError(f"--drafter-options {spec!r}: {canonical!r}{also} is not among --methods "
                             f"{','.join(methods)}")
        try:
            build_config(drafters.get(name).Config, options, "drafter", name)
        except (TypeError, ValueError) as err:
            raise ValueError(f"--drafter-options {spec!r}: {err}") from None
        out[canonical] = {**out.get(canonical, {}), **options}
    return out


def run_bench(
    target,
    methods: Sequence[Union[str, Method]],
    examples: Sequence[T.Example],
    *,
    temperatures: Sequence[float] = (0.0, 1.0),
    seed: int = 0,
    max_new_tokens: Optional[int] = None,
    progress: bool = True,
    block_size: Union[int, str] = 16,
    warmup: bool = True,
    rows_out: Optional[list[Row]] = None,
    tree: Optional[str] = None,
) -> list[Row]:
    """Decode every example with every method at every temperature: one ``Row`` per (T, method), in
    that order. ``max_new_tokens``: default each example's answer length (answer words + EOS). Prompt
    i is seeded with ``seed + i`` (torch.manual_seed before a transformers call, ``seed=`` for ours).
    ``warmup``: one untimed short greedy call per method first (where most failures surface).
    ``rows_out``: a list extended with each temperature's rows as soon as they are finished (what an
    interrupted run keeps). ``tree``: a tree builder spec the drafter methods verify trees of (None:
    chains)."""
    from tqdm.auto import tqdm

    methods = [m if isinstance(m, Method) else Method(m) for m in methods]
    check_methods([m.name for m in methods])
    if len({m.name for m in methods}) != len(methods):
        raise ValueError(f"each method may appear once, got {[m.name for m in methods]}")
    check_temperatures(temperatures)
    if not examples:
        raise ValueError("run_bench needs at least one example")
    if max_new_tokens is not None and (not isinstance(max_new_tokens, int) or max_new_tokens < 1):
        raise ValueError(f"max_new_tokens must be an integer >= 1 or None, got {max_new_tokens!r}")
    vocab = task_vocab()
    prompts = [[vocab[w] for w in T.prompt_words(ex)] for ex in examples]
    budgets = [max_new_tokens or T.answer_length(ex.task, ex.size) for ex in examples]
    runners, skipped = _prepare(target, methods, prompts[0], block_size, warmup, tree)
    rows: list[Row] = [] if rows_out is None else rows_out
    bar = tqdm(total=len(temperatures) * len(examples), disable=not progress, desc="bench spec", unit="prompt")
    for temp in temperatures:
        samples: dict[str, list[Sample]] = {name: [] for name in runners}
        for i, (prompt, budget) in enumerate(zip(prompts, budgets)):
            for name in [n for n in runners if n not in skipped]:
                bar.set_postfix_str(f"T={temp:g} {name}")
                try:
                    samples[name].append(runners[name](prompt, float(temp), budget, seed + i))
                except Exception as err:  # noqa: BLE001  one method's failure never ends the run
                    skipped[name] = failure_reason(err)
            bar.update(1)
        rows += _rows(methods, samples, skipped, examples, float(temp), block_size)
    bar.close()
    return rows


def _prepare(target, methods: Sequence[Method], prompt: list[int], block_size: int,
             warmup: bool, tree: Optional[str] = None) -> tuple[dict[str, Runner], dict[str, str]]:
    """Every method's runner, or its reason to be skipped."""
    runners: dict[str, Runner] = {}
    skipped: dict[str, str] = {}
    for m in methods:
        try:
            runners[m.name] = make_runner(target, m, block_size, tree)
            if warmup:
                runners[m.name](prompt, 0.0, WARMUP_TOKENS, 0)
        except Exception as err:  # noqa: BLE001
            skipped[m.name] = failure_reason(err)
    return runners, skipped


def _rows(methods: Sequence[Method], samples: dict[str, list[Sample]], skipped: dict[str, str],
          examples: Sequence[T.Example], temp: float, block_size: int) -> list[Row]:
    rows = [Row(m.name, temp, status="skipped", reason=skipped[m.name]) if m.name in skipped
            else summarize(m.name, temp, samples[m.name], examples, _width(block_size, samples[m.name]))
            for m in methods]
    compare_to_baseline(rows, next((r for r in rows if r.method == "generate" and r.status == "ok"), None), temp)
    return rows


def _width(block_size: Union[int, str], samples: Sequence[Sample]) -> int:
    """The block size the acceptance-by-position columns span: the given one, or with ``"auto"`` the
    most tokens any round committed."""
    if isinstance(block_size, int):
        return block_size
    return max((c for s in samples for c in s.commits or ()), default=1)


def parse_args(argv: Optional[Sequence[str]] = None) -> argparse.Namespace:
    """The flags of ``dllm bench spec``; ValueError (naming the valid values) for bad ones."""
    ap = argparse.ArgumentParser(prog="dllm bench spec", description=__doc__.split("\n\n")[0],
                                 epilog="dllm bench trees --trees chain,ddtree,taps --budgets 16,32,64,128 ...: draft "
                                        "trees vs their budget (dllm bench trees --help: its flags)")
    ap.add_argument("--target", default="tiny-ar", help="transformers causal LM (embedded name, directory, Hub id)")
    ap.add_argument("--dflash", default="tiny-ar-dflash", help="DFlash drafter checkpoint of the target")
    ap.add_argument("--assistant", default="tiny-ar-draft", help="small AR model for assisted generation")
    ap.add_argument("--dlm", default="tiny-llada", help="dllm diffusion model drafting for the dlm method")
    ap.add_argument("--dlm-sampler", default="low_confidence")
    ap.add_argument("--dlm-steps", type=int, default=4, help="denoising forwards per dlm draft")
    ap.add_argument("--failfast", default="", help="failfast options (drafting with the --dlm model), e.g. "
                                                   "'chunk=10,max_draft=60,tau=0.45' (default: the paper's); its "
                                                   "drafts are capped at --block-size - 1")
    ap.add_argument("--methods", nargs="+", default=list(METHODS), help=f"comma/space separated: {','.join(METHODS)} "
                                                                      f"(default), {','.join(MORE_METHODS)}, or any "
                                                                      "registered drafter (dllm drafters)")
    ap.add_argument("--drafter-options", action="append", default=[], metavar="NAME:K=V,...",
                    help="options of a drafter named in --methods (repeatable), e.g. "
                         "'failfast:chunk=10' or 'dflash:model=tiny-ar-dflash-mixed'")
    ap.add_argument("--tree", default=None, metavar="SPEC",
                    help="verify the drafter methods' drafts as trees of this builder (e.g. 'ddtree:budget=32', "
                         "'jetspec:budget=63,width=7'); default: chains")
    ap.add_argument("--tasks", nargs="+", default=None,
                    help="task names (default copy_long; --full: the long-answer suite)")
    ap.add_argument("--n", type=int, default=None, help=f"test examples per task size (default {QUICK['n']}; "
                                                        f"--full: {FULL['n']})")
    ap.add_argument("--full", action="store_true", help="the whole table: T = 0 and 1, the long-answer suite, 4 "
                                                        "prompts per task size (default: a quick greedy run on "
                                                        "copy_long, one prompt per size)")
    ap.add_argument("--block-size", type=lambda v: v if v == "auto" else int(v), default=16,
                    help="B for dflash / ngram / dlm (K = B - 1 drafts), or 'auto': per prompt from the drafter's "
                         "block head (--dflash tiny-ar-dflash-wide; methods without one are skipped)")
    ap.add_argument("--temperatures", nargs="+", default=None,
                    help="comma/space separated, >= 0 (default 0; --full: 0,1)")
    ap.add_argument("--max-new-tokens", type=int, default=None, help="default: each example's answer length")
    ap.add_argument("--seed", type=int, default=0, help="prompt i is seeded with seed + i")
    ap.add_argument("--device", default=None, help="where the target loads (default CPU)")
    ap.add_argument("--threads", type=int, default=None, help="torch CPU threads (1 on a busy machine)")
    ap.add_argument("--out", type=output_file, default=None, help="write the rows as JSON here")
    ap.add_argument("--no-progress", action="store_true")
    args = ap.parse_args(argv)
    for key, value in (FULL if args.full else QUICK).items():
        if getattr(args, key) is None:
            setattr(args, key, value)
    args.methods = split_list(args.methods)
    check_methods(args.methods)
    args.drafter_options = drafter_options(args.drafter_options, args.methods)
    check_tree(args.tree, args.block_size)
    check_models(args)
    if "failfast" in args.methods:  # bad failfast options are refused before anything loads
        from dllm.drafters.failfast import FailFastConfig
        from dllm.registry import build_config

        try:
            build_config(FailFastConfig, parse_options(args.failfast), "drafter", "failfast")
        except (TypeError, ValueError) as err:
            raise ValueError(f"--failfast {args.failfast!r}: {err}") from None
    checked = check_common_args(args, ("n", "block_size", "dlm_steps", "threads", "max_new_tokens"))
    if args.n > T.TEST_SPLIT_SIZE:  # instances past the split are not held out of training
        raise ValueError(f"--n {args.n}: the test split holds {T.TEST_SPLIT_SIZE} instances per task size; "
                         f"give --n <= {T.TEST_SPLIT_SIZE}")
    return checked


def check_models(args: argparse.Namespace) -> None:
    """Every model a chosen method loads names a checkpoint (``--dflash``, ``--assistant``, ``--dlm``;
    the target is checked by its own loader first): ValueError naming the flag, before anything loads."""
    from dllm.models.loading import ModelNotFoundError, locate

    given = {m: ("--drafter-options", o["model"]) for m, o in getattr(args, "drafter_options", {}).items()
             if isinstance(o.get("model"), str)}
    flags = {m: (f"--{flag}", getattr(args, flag)) for m, flag in MODEL_FLAGS.items()}
    for method, (flag, name) in {**flags, **given}.items():
        if method not in args.methods or name is None:
            continue
        try:
            locate(name)
        except ModelNotFoundError as err:
            raise ValueError(f"{flag} {name!r} (for the {method} method): {err}") from None


def main(argv: Optional[Sequence[str]] = None) -> int:
    """``dllm bench spec [flags]``: print the table, write ``--out`` JSON. ValueError on bad flags.
    (Draft trees against their budget are ``dllm bench trees``: ``dllm.eval.speculative.trees``.)"""
    args = parse_args(argv)
    if args.threads is not None:
        torch.set_num_threads(args.threads)
    from dllm.models.targets import load_target

    target, _ = load_target(args.target, device=args.device)
    models = {"dflash": args.dflash, "assisted": args.assistant, "dlm": args.dlm, "failfast": args.dlm}
    opts = {"dlm": {"sampler": args.dlm_sampler, "steps": args.dlm_steps}, "failfast": parse_options(args.failfast)}
    for name, extra in args.drafter_options.items():  # --drafter-options wins over the per-method flags
        opts[name] = {**opts.get(name, {}), **extra}
        if "model" in extra:
            models[name] = opts[name].pop("model")
    names = args.methods if "generate" in args.methods else ["generate", *args.methods]  # the baseline always runs
    methods = [Method(n, models.get(n), opts.get(n, {})) for n in names]
    examples = [ex for t in args.tasks for ex in T.test_split(t, None, n=args.n)]
    rows: list[Row] = []

    def report() -> None:
        print(f"target {args.target}: {len(examples)} prompts ({', '.join(args.tasks)}; n = {args.n} per size), "
              f"batch 1, block size {args.block_size}, {torch.get_num_threads()} threads, {device_of(target)}")
        print(format_table(rows))
        if args.out:
            out = Path(args.out)
            out.parent.mkdir(parents=True, exist_ok=True)
            payload = {"target": args.target, "models": models, "tasks": args.tasks, "n_per_size": args.n,
                       "prompts": len(examples), "block_size": args.block_size, "tree": args.tree,
                       "temperatures": args.temperatures,
                       "seed": args.seed, "threads": torch.get_num_threads(), "device": str(device_of(target)),
                       "rows": [r.to_json() for r in rows]}
            out.write_text(json.dumps(payload, indent=2) + "\n")
            print(f"wrote {out}")

    def run() -> int:
        run_bench(target, methods, examples, temperatures=args.temperatures, seed=args.seed,
                  max_new_tokens=args.max_new_tokens, progress=not args.no_progress, block_size=args.block_size,
                  rows_out=rows, tree=args.tree)
        report()
        check_not_all_skipped(rows)
        return 0

    def keep() -> str:
        if not rows:
            return "no row finished; nothing written" + (f" to {args.out}" if args.out else "")
        report()
        return finished(len(rows), "row", args.out)

    return until_interrupted(run, keep)

if __name__ == "__main__":
    raise SystemExit(main())


__all__ = ["COLUMNS", "METHODS", "Method", "Row", "Sample", "acceptance_by_position", "commits_from_starts",
           "counting", "format_table", "hf_runner", "loop_runner", "main", "make_runner", "parse_args", "run_bench",
           "summarize"]
