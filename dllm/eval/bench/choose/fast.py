"""Choose the ``fast`` sampler alias by measurement.

    dllm bench choose-fast --models tiny-llada tiny-dream oracle --n 8 --out benchmarks/results/fast-choice.json
    dllm bench choose-fast --results A/compare.json B/compare.json   # judge finished runs
    dllm bench choose-fast --results old.json new.json   # merge runs: rows per model, by label

Runs ``dllm compare`` (``dllm.eval.compare``) on each model over the full stress suite with the
reference ``low_confidence`` at one token per step, the baseline ``threshold`` (0.9) and the
candidates, then applies the rule of the sampler-comparison issue on EVERY model:

- accuracy >= reference accuracy - ``tolerance`` (1 point);
- accuracy >= baseline accuracy;
- tokens per forward >= ``MIN_TPF_GAIN`` (1.2) x the baseline's (the speed issue's bar; a candidate
  that merely ties or edges past ``threshold`` is not worth a new default);

and picks, among the candidates that pass on every model, the one that forwards the fewest tokens
(forwarded tokens relative to the baseline's, mean over the models; ties: the higher mean tokens per
forward). The bar already guarantees the gain in forwards; above it, the winner is the one that
spends the least compute, because a candidate that buys tokens per forward with larger forwards
(verification variants) pays for them in time wherever a forward is compute-bound (a CPU, a GPU at
large batch). The choices made under earlier rules are in docs/results/samplers.md.

``--cost forwards`` ranks the passing candidates by tokens per forward instead (the most first; ties:
the fewer forwarded tokens): the cost of a device where a step costs its forwards, whatever their rows
(a GPU at batch 1, where a forward is bound by its kernel launches or its weight read up to a few
hundred rows). It names the candidate to time there; ``fast`` stays the ``tokens`` choice until such a
timing says otherwise. ``--results`` applies it to finished runs: nothing is decoded.
No candidate passing is a result too: it is printed as such and ``choose`` returns None.
Every verdict reports the candidate's forwarded-token ratio and mean tokens per forward.
Ctrl-C writes the rows of the models that finished to ``--out`` (unjudged, ``"interrupted": true``),
which ``--results`` reads back.
"""

from __future__ import annotations

import argparse
import json
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Mapping, Optional, Sequence

from dllm.flags import POSITIVE, output_file, read_json_object
from dllm.eval.compare import SamplerResult, compare, format_results
from dllm.eval.interrupt import finished, until_interrupted
from dllm.settings import DecodeSettings

REFERENCE = "low_confidence"
BASELINE = "threshold"
CANDIDATES = (
    "threshold:threshold=0.8", "threshold:threshold=0.7", "factor", "eb:gamma=0.01", "eb:gamma=0.1",
    "localleap", "hierarchy", "credit", "klass", "dawn", "wino", "ssd", "spec_threshold",
    "spec_threshold:threshold=0.95", "spec_threshold:threshold=0.99", "lopa", "lopa:branches=6", "lopa:branches=8",
    "lopa:tau_conf=0.95,branches=6", "lopa:reuse=True", "lopa:branches=6,reuse=True", "lopa:branches=8,reuse=True",
    "lopa:branches=2,reuse=True", "lopa:branches=3,reuse=True",
)  # fmt: skip
MIN_TPF_GAIN = 1.2  # a candidate needs >= this x the baseline's tokens per forward on every model
COSTS = ("tokens", "forwards")  # what ranks the passing candidates: forwarded tokens, or forwards


@dataclass(frozen=True)
class Verdict:
    label: str
    passes: bool
    mean_tpf: float
    reasons: tuple[str, ...]  # why it fails, per model (empty when it passes)
    forwarded_ratio: float = 0.0  # forwarded tokens / the baseline's, mean over the models


def judge(results: Mapping[str, Sequence[SamplerResult]], label: str, *, reference: str = REFERENCE,
          baseline: str = BASELINE, tolerance: float = 0.01, min_gain: float = MIN_TPF_GAIN,
          skipped: Optional[Mapping[str, Mapping[str, str]]] = None) -> Verdict:
    """Apply the rule to one candidate over every model's results (labels as given to compare).
    ``skipped[model][label]``: why the candidate could not run on that model (it then fails)."""
    skipped = skipped or {}
    reasons: list[str] = []
    tpfs: list[float] = []
    ratios: list[float] = []
    for model, rows in results.items():
        by = {r.label: r for r in rows}
        missing = [x for x in (label, reference, baseline) if x not in by]
        if missing == [label] and label in skipped.get(model, {}):
            reasons.append(f"{model}: cannot run ({skipped[model][label]})")
            continue
        if missing:
            raise KeyError(f"results for {model!r} lack {missing}; have {sorted(by)}")
        c, ref, base = by[label], by[reference], by[baseline]
        tpfs.append(c.tokens_per_forward)
        ratios.append(c.forwarded_tokens / base.forwarded_tokens if base.forwarded_tokens else 0.0)
        if c.accuracy < ref.accuracy - tolerance - 1e-12:
            reasons.append(f"{model}: accuracy {100 * c.accuracy:.1f}% < {reference} "
                           f"{100 * ref.accuracy:.1f}% - {100 * tolerance:g} pt")
        if c.accuracy < base.accuracy:
            reasons.append(f"{model}: accuracy {100 * c.accuracy:.1f}% < {baseline} {100 * base.accuracy:.1f}%")
        if c.tokens_per_forward < min_gain * base.tokens_per_forward - 1e-12:
            reasons.append(f"{model}: TPF {c.tokens_per_forward:.2f} < {min_gain:g} x {baseline} "
                           f"{base.tokens_per_forward:.2f}")
    return Verdict(label, not reasons, sum(tpfs) / max(1, len(tpfs)), tuple(reasons), sum(ratios) / max(1, len(ratios)))


def merge_rows(rows: list[SamplerResult], more: Sequence[SamplerResult], model: str, source: str) -> None:
    """Add ``more`` (one run's results for ``model``) to ``rows`` in place, for judging several runs
    at once (say, new candidates decoded beside an earlier run). Decoding is deterministic, so a
    sampler in both must agree on what it decoded (accuracy, NFE, forwarded tokens): ValueError
    otherwise (runs of different code or settings); its first row is kept (timings differ anyway)."""
    by = {r.label: r for r in rows}
    for r in more:
        old = by.get(r.label)
        if old is None:
            rows.append(r)
            by[r.label] = r
            continue
        a = (old.accuracy, old.nfe_per_example, old.forwarded_tokens)
        b = (r.accuracy, r.nfe_per_example, r.forwarded_tokens)
        if a != b:
            raise ValueError(f"{model}: {r.label!r} decoded differently in {source} (accuracy, NFE/example, "
                             f"forwarded tokens {b}) than in an earlier --results file {a}; judge runs of the same "
                             "code and settings")


def cannot_run(model, spec: str) -> Optional[str]:
    """Why sampler ``spec`` cannot decode with ``model`` (None when it can): a sampler that reads
    attention probabilities needs a model with transformer layers (the oracle has none)."""
    sampler = DecodeSettings.parse(spec).check()
    if sampler.attention_layers and not getattr(model, "supports_kv_cache", True):
        return f"{sampler.name} reads attention probabilities; {type(model).__name__} has none"
    return None


def choose(results: Mapping[str, Sequence[SamplerResult]], candidates: Sequence[str], cost: str = "tokens",
           **kw) -> tuple[Optional[str], list[Verdict]]:
    """(the winning label or None, every candidate's verdict, best first: the passing ones by
    forwarded tokens (fewest first, then the higher TPF), or with ``cost="forwards"`` by TPF (highest
    first, then the fewer forwarded tokens), then the failing ones by TPF)."""
    if cost not in COSTS:
        raise ValueError(f"cost must be one of {COSTS}, got {cost!r}")

    def order(v: Verdict) -> tuple:
        if not v.passes:
            return (True, -v.mean_tpf, v.forwarded_ratio)
        return (False, v.forwarded_ratio, -v.mean_tpf) if cost == "tokens" else (False, -v.mean_tpf, v.forwarded_ratio)

    verdicts = sorted((judge(results, c, **kw) for c in candidates), key=order)
    winner = verdicts[0].label if verdicts and verdicts[0].passes else None
    return winner, verdicts


def main(argv: Optional[Sequence[str]] = None) -> int:
    ap = argparse.ArgumentParser(prog="dllm bench choose-fast", description=__doc__.split("\n\n")[0])
    ap.add_argument("--models", nargs="+", default=["tiny-llada", "tiny-dream", "oracle"])
    ap.add_argument("--candidates", nargs="+", default=None,
                    help="default: CANDIDATES, or with --results every other sampler in them")
    ap.add_argument("--n", type=POSITIVE, default=8, help="test examples per task")
    ap.add_argument("--out", type=output_file, default="runs/fast-choice.json")
    ap.add_argument("--no-progress", action="store_true")
    ap.add_argument("--threads", type=int, default=None, help="torch CPU threads (1 on a busy machine)")
    ap.add_argument("--results", nargs="+", default=None,
                    help="compare.json files of `dllm compare` runs (or an earlier --out) to judge instead of running them")
    ap.add_argument("--cost", default="tokens", choices=COSTS,
                    help="what ranks the candidates that pass: tokens (default: the fewest forwarded tokens, the "
                         "choice of fast) or forwards (the most tokens per forward: a GPU at batch 1)")
    args = ap.parse_args(argv)
    if args.threads is not None:
        if args.threads < 1:
            ap.error(f"--threads must be >= 1, got {args.threads}")
        import torch

        torch.set_num_threads(args.threads)
    specs = [REFERENCE, BASELINE, *(args.candidates or CANDIDATES)]
    results: dict[str, list[SamplerResult]] = {}
    skipped: dict[str, dict[str, str]] = {}
    if args.results:
        ns = set()
        for path in args.results:
            try:
                payload = read_json_object(path, "--results", ("results",),
                                           "`dllm compare --out` or `dllm bench choose-fast --out`")
            except ValueError as err:
                ap.error(str(err))
            if isinstance(payload["results"], dict):  # an earlier choose-fast --out: every model's results
                for model, rows in payload["results"].items():
                    merge_rows(results.setdefault(model, []), [SamplerResult(**r) for r in rows], model, path)
                for model, why in payload.get("skipped", {}).items():
                    skipped.setdefault(model, {}).update(why)
            else:  # one `dllm compare` run
                merge_rows(results.setdefault(payload["model"], []),
                           [SamplerResult(**r) for r in payload["results"]], payload["model"], path)
            ns.add(payload.get("n_per_task", args.n))
        if len(ns) > 1:
            ap.error(f"--results files decoded different numbers of examples per task {sorted(ns)}; "
                     "judge runs of one --n")
        args.n = ns.pop()
    else:
        status = until_interrupted(lambda: run_models(args, specs, results, skipped),
                                   lambda: save_finished(args, results, skipped))
        if status:
            return status
    for name, rows in results.items():
        print(f"\n== {name} (n = {args.n} per task, full suite)\n{format_results(rows)}")
    candidates = args.candidates
    if candidates is None:
        shared = set.intersection(*({r.label for r in rows} | set(skipped.get(m, {})) for m, rows in results.items()))
        candidates = [c for c in (list(CANDIDATES) if not args.results else
                                  [r.label for r in next(iter(results.values()))])
                      if c in shared and c not in (REFERENCE, BASELINE)]
    winner, verdicts = choose(results, candidates, cost=args.cost, skipped=skipped)
    wins = "the fewest forwarded tokens wins" if args.cost == "tokens" else "the most tokens per forward wins"
    print(f"\ncandidates (rule: acc >= low_confidence - 1 pt, acc >= threshold, TPF >= {MIN_TPF_GAIN:g} x threshold, "
          f"on every model; {wins}; fwd = forwarded tokens / threshold's)")
    for v in verdicts:
        print(f"  {'PASS' if v.passes else 'fail'}  {v.label:<30} mean TPF {v.mean_tpf:5.2f}  fwd {v.forwarded_ratio:4.2f}x  "
              f"{'; '.join(v.reasons)}")
    chosen = "fast" if args.cost == "tokens" else "by forwards"
    print(f"\n{chosen} = {winner}" if winner else "\nno candidate passes on every model")
    write_choice(args, results, skipped, winner, [asdict(v) for v in verdicts])
    print(f"wrote {args.out}")
    return 0


def run_models(args, specs: Sequence[str], results: dict[str, list[SamplerResult]],
               skipped: dict[str, dict[str, str]]) -> int:
    """``dllm compare`` of every runnable spec on each of ``--models`` in turn, into ``results`` (a
    model's rows land when its run ends)."""
    from dllm.scoring.exact_match import load_model

    for name in args.models:
        model = load_model(name)
        why = {spec: cannot_run(model, spec) for spec in specs}
        skipped[name] = {spec: reason for spec, reason in why.items() if reason is not None}
        runnable = [spec for spec in specs if why[spec] is None]
        results[name] = compare(model, runnable, None, args.n, show_progress=not args.no_progress)
    return 0


def write_choice(args, results: Mapping[str, list[SamplerResult]], skipped: Mapping[str, Mapping[str, str]],
                 winner: Optional[str], verdicts: list[dict], interrupted: bool = False) -> None:
    """``--out``: the verdicts and every model's rows (``--results`` reads the file back)."""
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    doc = {"n_per_task": args.n, "cost": args.cost, "winner": winner, "verdicts": verdicts,
           "skipped": {m: why for m, why in skipped.items() if m in results},
           "results": {m: [asdict(r) for r in rs] for m, rs in results.items()}}
    out.write_text(json.dumps({**doc, "interrupted": True} if interrupted else doc, indent=2))


def save_finished(args, results: Mapping[str, list[SamplerResult]], skipped: Mapping[str, Mapping[str, str]]) -> str:
    """On Ctrl-C: the models whose runs finished, written to ``--out`` unjudged."""
    write_choice(args, results, skipped, None, [], interrupted=True)
    return finished(len(results), "model", args.out, f"; judge them with --results {args.out} once the rest are run")


if __name__ == "__main__":
    raise SystemExit(main())
