"""End to end: the recommended setting against Fast-dLLM's, on the accuracy / tokens-per-second plane.

    dllm bench e2e --n 8 --threads 2 --out benchmarks/results/e2e

For every (model, suite) pair of ``dllm.eval.bench.choose.cache.PAIRS`` (the PB-mini models on the short
suite, the long-prompt models on the long suite, blocks of 4), one ``dllm compare`` run decodes the
same examples with

- Fast-dLLM's recommended setting, ``threshold`` 0.9 with the ``dual`` cache (its drivers are
  reproduced token for token by ``threshold`` + ``dual``: tests/cache/test_fastdllm_transcript.py);
- ours, ``fast`` with the recommended cache (``auto`` when registered, else ``--cache``);
- both samplers without a cache, for reference.

Each suite is decoded on ``resolving_n(--n, its task count)`` examples per task, the sample size of
the cache rule (one example weighs at most half a point: 8 per task on PB-mini, 50 on the long
suite). It prints one table per pair, the verdict (ours dominates = at least as accurate AND faster in
tokens/s, and with ``--repeats`` > 1 faster in every timed round; the ratio of tokens/s), writes
``e2e.json`` and draws ``e2e.png``: one panel per pair, accuracy against tokens per second. Tokens/s
of the tiny models on a CPU are mostly per-call overhead; tokens per forward and forwarded tokens
are printed beside them.
"""

from __future__ import annotations

import argparse
import json
import math
from dataclasses import asdict
from pathlib import Path
from typing import Optional, Sequence

from dllm.flags import POSITIVE, output_dir, read_json_object
from dllm.eval.bench.choose.cache import label, resolving_n, select_pairs
from dllm.eval.interrupt import finished, until_interrupted

FASTDLLM = "threshold:cache=dual"


def specs(cache: str) -> list[str]:
    return [FASTDLLM, label(cache), "threshold", "fast"]


def faster_every_round(a: dict, b: dict) -> Optional[bool]:
    """With repeated timings (``extra["wall_times"]``, interleaved rounds): is ``a`` faster than ``b``
    in every round (paired by round)? None without them."""
    wa, wb = (r.get("extra", {}).get("wall_times") for r in (a, b))
    if not wa or not wb or len(wa) != len(wb):
        return None
    return all(x < y for x, y in zip(wa, wb))


def paired_outcomes(ours: Optional[str], theirs: Optional[str]) -> Optional[dict]:
    """Per-example exact matches of two settings on the same examples (``extra["solved"]``, "1"/"0" per
    example): how many only ours solved, how many only theirs, and the exact two-sided sign test's p
    on those discordant pairs (the chance of a split at least this uneven if either setting were as
    likely to win each one). None without both strings."""
    if not ours or not theirs or len(ours) != len(theirs):
        return None
    only_ours = sum(a == "1" and b == "0" for a, b in zip(ours, theirs))
    only_theirs = sum(a == "0" and b == "1" for a, b in zip(ours, theirs))
    n = only_ours + only_theirs
    tail = sum(math.comb(n, k) for k in range(min(only_ours, only_theirs) + 1)) / 2 ** n
    return {"only_ours": only_ours, "only_theirs": only_theirs, "sign_test_p": float(f"{min(1.0, 2 * tail):.3g}")}


def verdict(rows: dict, ours: str) -> dict:
    """Does ``ours`` dominate Fast-dLLM's setting: accuracy >=, tokens/s >, and (with repeated timings)
    faster in every round, so that a median within the machine's noise is not called a win?"""
    a, b = rows[ours], rows[FASTDLLM]
    speed = a["tokens_per_second"] / b["tokens_per_second"] if b["tokens_per_second"] else float("nan")
    every = faster_every_round(a, b)
    return {"accuracy_delta_pt": round(100 * (a["accuracy"] - b["accuracy"]), 2), "speed_ratio": round(speed, 3),
            "tpf_ratio": round(a["tokens_per_forward"] / b["tokens_per_forward"], 3),
            "forwarded_ratio": round(a["forwarded_tokens"] / b["forwarded_tokens"], 3),
            "faster_every_round": every,
            "paired": paired_outcomes(*(r.get("extra", {}).get("solved") for r in (a, b))),
            "dominates": a["accuracy"] >= b["accuracy"] and speed > 1.0 and every is not False}


def plot(results: dict, ours: str, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, len(results), figsize=(4.2 * len(results), 3.8), squeeze=False)
    for ax, (pair, rows) in zip(axes[0], results.items()):
        for name, r in rows.items():
            style = {"marker": "*", "s": 160} if name == ours else {"marker": "o", "s": 50}
            ax.scatter(r["tokens_per_second"], 100 * r["accuracy"], label=name, **style)
        ax.set_title(pair, fontsize=9)
        ax.set_xlabel("tokens / s")
        ax.set_ylabel("accuracy %")
        ax.grid(alpha=0.3)
    axes[0][0].legend(fontsize=7, loc="lower left")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def main(argv: Optional[Sequence[str]] = None) -> int:
    from dllm import tasks as T
    from dllm.cache import caches
    from dllm.engine.graphs import check_graphs_option
    from dllm.eval.compare import compare, format_results
    from dllm.inputs import model_device
    from dllm.scoring.exact_match import load_model

    ap = argparse.ArgumentParser(prog="dllm bench e2e", description=__doc__.split("\n\n")[0])
    ap.add_argument("--cache", default=None, help="our cache (default: auto when registered, else drift)")
    ap.add_argument("--n", type=int, default=8,
                    help="test examples per task, at least; raised per suite by dllm.eval.bench.choose.cache.resolving_n")
    ap.add_argument("--repeats", type=int, default=3,
                    help="timed runs per setting, interleaved; the median wall time is reported")
    ap.add_argument("--threads", type=POSITIVE, default=None, help="torch CPU threads")
    ap.add_argument("--device", default=None, help="e.g. cuda (default: where dllm.models.load puts it)")
    ap.add_argument("--pairs", nargs="+", default=None, metavar="MODEL/SUITE", help="default: every pair of PAIRS")
    ap.add_argument("--merge", nargs="+", default=None, metavar="JSON",
                    help="earlier e2e.json files (same --cache) whose pairs join this run's table and plot")
    ap.add_argument("--cuda-graphs", action="store_true",
                    help="every setting's cached forwards replayed as CUDA graphs (generate(cuda_graphs=True); "
                         "a CUDA device); Fast-dLLM's own loop is benchmarks/e2e_driver.py")
    ap.add_argument("--out", type=output_dir, default="runs/e2e")
    ap.add_argument("--no-progress", action="store_true")
    args = ap.parse_args(argv)
    if args.n < 1 or args.repeats < 1:
        ap.error(f"--n and --repeats must be >= 1, got {args.n} and {args.repeats}")
    cache = args.cache or ("auto" if "auto" in caches else "drift")
    if args.threads is not None:
        import torch

        torch.set_num_threads(args.threads)
    ours = specs(cache)[1]
    results: dict[str, dict] = {}
    verdicts: dict[str, dict] = {}
    n_per_task: dict[str, int] = {}
    try:
        pairs = select_pairs(args.pairs)
    except ValueError as err:
        ap.error(str(err))
    for path in args.merge or ():
        try:
            old = read_json_object(path, "--merge", ("ours", "results", "verdicts"), "`dllm bench e2e --out`")
        except ValueError as err:
            ap.error(str(err))
        if old["ours"] != ours:
            ap.error(f"--merge {path}: measured {old['ours']!r}, this run measures {ours!r}")
        if old.get("cuda_graphs", False) != args.cuda_graphs:
            ap.error(f"--merge {path}: measured with cuda_graphs={old.get('cuda_graphs', False)}, this run with "
                     f"cuda_graphs={args.cuda_graphs}")
        results.update(old["results"])
        verdicts.update(old["verdicts"])
        if isinstance(old.get("n_per_task"), dict):  # an older file holds one number for every pair
            n_per_task.update(old["n_per_task"])
    out = Path(args.out)

    def run() -> int:
        for model_name, suite, block in pairs:
            try:
                model = load_model(model_name, device=args.device)
                check_graphs_option(args.cuda_graphs, model_device(model))
            except ValueError as err:  # a bad --device names the valid ones; graphs need a CUDA model
                ap.error(str(err))
            names = T.suite_task_names(suite)
            key = f"{model_name}/{suite}"
            n_per_task[key] = resolving_n(args.n, len(names))
            rows = compare(model, specs(cache), names, n_per_task[key], block_length=block,
                           show_progress=not args.no_progress, repeats=args.repeats, cuda_graphs=args.cuda_graphs)
            print(f"\n== {key} (blocks of {block}, n = {n_per_task[key]} per task, median of {args.repeats} "
                  f"timed runs{', CUDA graphs' if args.cuda_graphs else ''})\n{format_results(rows)}")
            results[key] = {r.label: asdict(r) for r in rows}
            verdicts[key] = verdict(results[key], ours)
            v = verdicts[key]
            every, paired = v["faster_every_round"], v["paired"]
            discordant = "" if not paired else (f", solved by ours only {paired['only_ours']}, by theirs only "
                                                f"{paired['only_theirs']} (sign test p = {paired['sign_test_p']:.2g})")
            print(f"{ours} vs {FASTDLLM}: accuracy {v['accuracy_delta_pt']:+.1f} pt, "
                  f"tokens/s x{v['speed_ratio']:.2f}, TPF x{v['tpf_ratio']:.2f}, "
                  f"forwarded tokens x{v['forwarded_ratio']:.2f}"
                  f"{'' if every is None else f', faster in every round: {every}'}{discordant}: "
                  f"{'dominates' if v['dominates'] else 'does NOT dominate'}", flush=True)
            write(out, ours, n_per_task, args.repeats, verdicts, results,  # after every pair: a kill keeps them
                  args.cuda_graphs)
        print(f"wrote {out / 'e2e.json'} and {out / 'e2e.png'}")
        return 0

    def kept() -> str:  # every finished pair was written when it finished; merged ones are written here
        if verdicts:  # --merge pairs with no new pair finished yet: the file the message names must hold them
            done = {k: n for k, n in n_per_task.items() if k in verdicts}  # not the pair cut short
            write(out, ours, done, args.repeats, verdicts, results, args.cuda_graphs)
        return finished(len(verdicts), "pair", str(out / "e2e.json") if verdicts else None,
                        "; --merge that file to measure only the missing pairs")

    return until_interrupted(run, kept)


def write(out: Path, ours: str, n_per_task: dict, repeats: int, verdicts: dict, results: dict,
          cuda_graphs: bool = False) -> None:
    """e2e.json and e2e.png under ``out`` for the pairs measured so far."""
    out.mkdir(parents=True, exist_ok=True)
    (out / "e2e.json").write_text(json.dumps({"ours": ours, "fastdllm": FASTDLLM, "n_per_task": n_per_task,
                                              "repeats": repeats, "cuda_graphs": cuda_graphs, "verdicts": verdicts,
                                              "results": results}, indent=2))
    plot(results, ours, out / "e2e.png")


if __name__ == "__main__":
    raise SystemExit(main())
