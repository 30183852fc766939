"""Choose the ``auto`` cache policy by measurement.

    dllm bench choose-cache --threads 1 --out benchmarks/results/cache-choice.json

The rule of the speed issue, applied to every candidate policy with the recommended sampler
(``fast``), and measured side by side with ``cache="none"`` in the same run:

- accuracy: within ``TOLERANCE`` (1 point) of ``none`` on the short suite (PB-mini, blocks of 4,
  so a cache spans several blocks) with the two PB-mini models, and on the long-prompt suite with
  the two long-prompt models (``PAIRS``), on enough test examples that the tolerance is resolved:
  ``--n`` per task, raised per suite until one example weighs at most half the tolerance
  (``resolving_n``: 8 per task on PB-mini's 31 tasks, 50 on the long suite's 4);
- speed: >= ``MIN_SPEEDUP`` (3x) the wall-clock speed of ``none`` at prompt 1,024 + 256 generated
  (blocks of 32, ``dllm.eval.bench.caches.run_cache_bench``: a random prompt, median of repeats)
  on every speed model;

and picks, among the candidates that pass everything, the fastest (mean speed-up). No candidate
passing is a result too: ``choose`` returns None and ``auto`` stays what it was.
"""

from __future__ import annotations

import argparse
import json
import math
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Mapping, Optional, Sequence

from dllm.flags import POSITIVE, output_file, read_json_object
from dllm.eval.interrupt import finished, until_interrupted

SAMPLER = "fast"
PAIRS = (("tiny-llada", "pb-mini", 4), ("tiny-dream", "pb-mini", 4),
         ("tiny-llada-long", "long-prompt", 4), ("tiny-dream-long", "long-prompt", 4))  # (model, suite, block)
SPEED_MODELS = ("tiny-llada", "tiny-dream")  # the speed issue's own setup: tiny-llada at a 1,024-token prompt
SPEED_SHAPE = {"prompt_len": 1024, "gen_len": 256, "block": 32}
CANDIDATES = ("dual", "dual:look_back=16,look_ahead=16", "dual:look_back=64", "drift", "drift:threshold=0.001",
              "drift:threshold=0.001,max_extra=64", "drift:threshold=1e-06,max_extra=32")
TOLERANCE = 0.01
MIN_SPEEDUP = 3.0


def resolving_n(n: int, tasks: int, tolerance: float = TOLERANCE) -> int:
    """Test examples per task for a suite of ``tasks`` tasks: at least ``n``, and enough that one example
    weighs at most ``tolerance / 2`` of the suite's accuracy, so that the rule tells a one-example
    difference from a tolerance-sized one (at 8 per task, one example of the 4-task long suite is 3.1
    points: a 1-point rule there is a rule of equality)."""
    if n < 1 or tasks < 1 or not 0 < tolerance < 1:
        raise ValueError(f"resolving_n needs n >= 1, tasks >= 1 and 0 < tolerance < 1; got {n}, {tasks}, {tolerance}")
    return max(n, math.ceil(2 / (tolerance * tasks) - 1e-9))


def select_pairs(names: Optional[Sequence[str]]) -> list[tuple[str, str, int]]:
    """The ``PAIRS`` named ``"model/suite"`` (all of them for None); ValueError listing the valid names."""
    known = {f"{m}/{s}": (m, s, b) for m, s, b in PAIRS}
    bad = sorted(set(names or ()) - set(known))
    if bad:
        raise ValueError(f"--pairs: {bad} are not pairs; valid: {sorted(known)}")
    return [known[p] for p in names] if names else list(PAIRS)


@dataclass(frozen=True)
class CacheVerdict:
    cache: str
    passes: bool
    mean_speedup: float
    reasons: tuple[str, ...]
    accuracy_drop: dict[str, float]  # "model/suite" -> none's accuracy - this policy's (points)


def label(cache: str) -> str:
    """The compare label of the recommended sampler on ``cache``: ``fast:cache=(dual:look_back=16,...)``
    (``DecodeSettings.spec``)."""
    from dllm.settings import DecodeSettings

    return DecodeSettings(SAMPLER, cache=cache).spec


def judge(cache: str, accuracy: Mapping[str, Mapping[str, float]], speedup: Mapping[str, Mapping[str, float]], *,
          tolerance: float = TOLERANCE, min_speedup: float = MIN_SPEEDUP) -> CacheVerdict:
    """accuracy[pair][cache] (fractions, "none" included), speedup[model][cache] (x none)."""
    reasons, drops = [], {}
    if not accuracy:
        reasons.append("no accuracy measurement")
    if not speedup:
        reasons.append("no speed measurement")
    for pair, acc in accuracy.items():
        drop = acc["none"] - acc[cache]
        drops[pair] = round(100 * drop, 2)
        if drop > tolerance + 1e-12:
            reasons.append(f"{pair}: accuracy {100 * acc[cache]:.1f}% < none {100 * acc['none']:.1f}% - "
                           f"{100 * tolerance:g} pt")
    speeds = [s[cache] for s in speedup.values()]
    for model, s in speedup.items():
        if s[cache] < min_speedup - 1e-12:
            reasons.append(f"{model}: {s[cache]:.2f}x none < {min_speedup:g}x at "
                           f"{SPEED_SHAPE['prompt_len']} + {SPEED_SHAPE['gen_len']}")
    return CacheVerdict(cache, not reasons, sum(speeds) / max(1, len(speeds)), tuple(reasons), drops)


def choose(accuracy, speedup, candidates: Sequence[str], **kw) -> tuple[Optional[str], list[CacheVerdict]]:
    """(the winning policy spec or None, every verdict, best first)."""
    verdicts = sorted((judge(c, accuracy, speedup, **kw) for c in candidates),
                      key=lambda v: (not v.passes, -v.mean_speedup))
    return (verdicts[0].cache if verdicts and verdicts[0].passes else None), verdicts


def measure_accuracy(pairs, candidates: Sequence[str], n: int, progress: bool,
                     partial: Optional[Path] = None) -> tuple[dict, dict]:
    """accuracy[pair][cache] and the compare rows (dicts) per pair; each pair's suite is measured on
    ``resolving_n(n, its task count)`` examples per task. With ``partial``, the pairs measured so far
    are written there after each pair (a run that dies keeps them: ``--merge`` takes the file)."""
    from dllm import tasks as T
    from dllm.eval.compare import compare
    from dllm.scoring.exact_match import load_model

    accuracy: dict[str, dict[str, float]] = {}
    rows: dict[str, list[dict[str, Any]]] = {}
    caches = ["none", *candidates]
    for model_name, suite, block in pairs:
        model = load_model(model_name)
        names = T.suite_task_names(suite)
        results = compare(model, [label(c) for c in caches], names, resolving_n(n, len(names)),
                          block_length=block, show_progress=progress)
        key = f"{model_name}/{suite}"
        by = {r.label: r for r in results}
        accuracy[key] = {c: by[label(c)].accuracy for c in caches}
        rows[key] = [asdict(r) for r in results]
        if partial is not None:
            partial.parent.mkdir(parents=True, exist_ok=True)
            note = "accuracy only; finish with --pairs <the rest> --merge <this file>"
            partial.write_text(json.dumps({"partial": note, "accuracy": accuracy, "speedup": {}, "accuracy_rows": rows},
                                          indent=2, default=str))
    return accuracy, rows


def measure_speed(models: Sequence[str], candidates: Sequence[str], repeats: int, progress: bool) -> tuple[dict, dict]:
    """speedup[model][cache] (x none, same run) and the bench rows per model."""
    from dllm.cache import make_cache
    from dllm.eval.bench.caches import run_cache_bench
    from dllm.scoring.exact_match import load_model

    given = {make_cache(c).spec: c for c in candidates}  # the policies' normalised specs -> as given
    speedup: dict[str, dict[str, float]] = {}
    rows: dict[str, list[dict[str, Any]]] = {}
    for name in models:
        out = run_cache_bench(load_model(name), SPEED_SHAPE["prompt_len"], SPEED_SHAPE["gen_len"],
                              SPEED_SHAPE["block"], samplers=(SAMPLER,), policies=("none", *candidates),
                              repeats=repeats, warmup=repeats > 1, progress=progress)
        speedup[name] = {given.get(r["policy"], r["policy"]): r["speedup"] for r in out}
        rows[name] = out
    return speedup, rows


def main(argv: Optional[Sequence[str]] = None) -> int:
    ap = argparse.ArgumentParser(prog="dllm bench choose-cache", description=__doc__.split("\n\n")[0])
    ap.add_argument("--candidates", nargs="+", default=list(CANDIDATES))
    ap.add_argument("--n", type=int, default=8,
                    help="test examples per task (accuracy), at least; raised per suite by resolving_n")
    ap.add_argument("--repeats", type=int, default=3,
                    help="timed runs per policy (speed; the median, after one warm-up run when > 1)")
    ap.add_argument("--threads", type=POSITIVE, default=None, help="torch CPU threads")
    ap.add_argument("--pairs", nargs="+", default=None, metavar="MODEL/SUITE",
                    help="measure the accuracy of these pairs only (default: every pair of PAIRS)")
    ap.add_argument("--speed-models", nargs="*", default=None,
                    help="default: SPEED_MODELS; 'none' (or no name): skip the speed measurement")
    ap.add_argument("--merge", nargs="+", default=None, metavar="JSON",
                    help="earlier outputs whose accuracy/speed-up entries are added before judging")
    ap.add_argument("--out", type=output_file, default="runs/cache-choice.json")
    ap.add_argument("--no-progress", action="store_true")
    args = ap.parse_args(argv)
    from dllm.cache import make_cache

    for c in args.candidates:
        make_cache(c)  # a bad spec fails here, before anything runs
    if args.n < 1 or args.repeats < 1:
        ap.error(f"--n and --repeats must be >= 1, got {args.n} and {args.repeats}")
    if args.threads is not None:
        import torch

        torch.set_num_threads(args.threads)
    try:
        pairs = select_pairs(args.pairs)
    except ValueError as err:
        ap.error(str(err))
    speed_models = SPEED_MODELS if args.speed_models is None else [m for m in args.speed_models if m != "none"]
    from dllm.models.loading import ModelNotFoundError, locate

    for name in speed_models:  # before the accuracy runs: a bad name must not cost them
        try:
            locate(name)
        except ModelNotFoundError as err:
            ap.error(f"--speed-models: {err}")
    out = Path(args.out)
    partial = out.with_name(out.stem + ".partial.json")
    try:  # before the run rewrites any
        merged = [(path, read_json_object(path, "--merge", ("accuracy", "speedup"), "`dllm bench choose-cache --out`"))
                  for path in args.merge or ()]
    except ValueError as err:
        ap.error(str(err))

    def kept() -> str:  # measure_accuracy writes the partial file after every pair
        done = len(json.loads(partial.read_text()).get("accuracy", {})) if partial.exists() else 0
        return finished(done, "pair", str(partial) if done else None,
                        f"; --merge {partial} reuses them" if done else "")

    return until_interrupted(lambda: _measure_and_choose(args, pairs, speed_models, out, partial, merged, ap), kept)


def _measure_and_choose(args, pairs, speed_models, out: Path, partial: Path, merged, ap) -> int:
    accuracy, acc_rows = measure_accuracy(pairs, args.candidates, args.n, not args.no_progress, partial)
    speedup, speed_rows = measure_speed(speed_models, args.candidates, args.repeats, not args.no_progress)
    for path, old in merged:
        for name, have, mine in (("accuracy", old["accuracy"], accuracy), ("speedup", old["speedup"], speedup)):
            for key, values in have.items():
                missing = [c for c in ["none", *args.candidates] if c not in values]
                if missing:
                    ap.error(f"--merge {path}: {name}[{key!r}] lacks {missing}")
                mine.setdefault(key, values)
        acc_rows.update({k: v for k, v in old.get("accuracy_rows", {}).items() if k not in acc_rows})
        speed_rows.update({k: v for k, v in old.get("speed_rows", {}).items() if k not in speed_rows})
    winner, verdicts = choose(accuracy, speedup, args.candidates)
    if not accuracy or not speedup:
        print("note: the rule needs accuracy AND speed measurements; the verdicts below lack one")
    width = max([26, *(len(k) + 2 for k in accuracy)])  # a column per model/suite, wide enough for its name
    head = "".join(f"{k:>{width}}" for k in accuracy)
    print(f"{'cache (sampler fast)':<34}{head}" + "".join(f"{m + ' x':>20}" for m in speedup))
    print(f"{'(test examples)':<34}" + "".join(f"{acc_rows[k][0]['examples'] if acc_rows.get(k) else '?':>{width}}"
                                             for k in accuracy))
    for c in ["none", *args.candidates]:
        print(f"{c:<34}" + "".join(f"{100 * a[c]:>{width - 1}.1f}%" for a in accuracy.values())
              + "".join(f"{s[c]:>19.2f}x" for s in speedup.values()))
    print(f"\nrule: accuracy >= none - {100 * TOLERANCE:g} pt on every model/suite, >= {MIN_SPEEDUP:g}x none at "
          f"{SPEED_SHAPE['prompt_len']} + {SPEED_SHAPE['gen_len']} on every speed model")
    for v in verdicts:
        print(f"  {'PASS' if v.passes else 'fail'}  {v.cache:<34} mean {v.mean_speedup:5.2f}x  {'; '.join(v.reasons)}")
    print(f"\nauto = {winner}" if winner else "\nno candidate passes")
    out.parent.mkdir(parents=True, exist_ok=True)
    n_per_task = {k: rows[0]["examples"] // len(rows[0]["per_task"]) for k, rows in acc_rows.items() if rows}
    out.write_text(json.dumps({"sampler": SAMPLER, "n_per_task": n_per_task, "speed_shape": SPEED_SHAPE,
                               "winner": winner, "verdicts": [asdict(v) for v in verdicts],
                               "accuracy": accuracy, "speedup": speedup, "accuracy_rows": acc_rows,
                               "speed_rows": speed_rows}, indent=2, default=str))
    partial.unlink(missing_ok=True)  # the full result supersedes it
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
