"""Choose the ``fast`` sampler alias by measurement.

    python -m dllm.eval.choose_fast --models tiny-llada tiny-dream --n 8 --out benchmarks/fast-choice.json
    python -m dllm.eval.choose_fast --results A/compare.json B/compare.json   # judge finished runs

Runs ``dllm compare`` (``dllm.eval.compare``) on each model over the full stress suite with the
reference ``low_confidence`` at one token per step, the baseline ``threshold`` (0.9) and the
candidates, then applies the rule of the sampler-comparison issue on EVERY model:

- accuracy >= reference accuracy - ``tolerance`` (1 point);
- accuracy >= baseline accuracy;
- tokens per forward > baseline tokens per forward;

and picks, among the candidates that pass on every model, the highest tokens per forward (mean over
the models). No candidate passing is a result too: it is printed as such and ``choose`` returns None.
"""

from __future__ import annotations

import argparse
import json
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Mapping, Optional, Sequence

from dllm.eval.compare import SamplerResult, compare, format_results

REFERENCE = "low_confidence"
BASELINE = "threshold"
CANDIDATES = (
    "threshold:threshold=0.8", "threshold:threshold=0.7", "factor", "eb:gamma=0.01", "eb:gamma=0.1",
    "localleap", "hierarchy", "credit", "klass", "dawn", "wino", "ssd", "spec_threshold",
    "spec_threshold:threshold=0.95", "spec_threshold:threshold=0.99",
)  # fmt: skip


@dataclass(frozen=True)
class Verdict:
    label: str
    passes: bool
    mean_tpf: float
    reasons: tuple[str, ...]  # why it fails, per model (empty when it passes)


def judge(results: Mapping[str, Sequence[SamplerResult]], label: str, *, reference: str = REFERENCE,
          baseline: str = BASELINE, tolerance: float = 0.01) -> Verdict:
    """Apply the rule to one candidate over every model's results (labels as given to compare)."""
    reasons: list[str] = []
    tpfs: list[float] = []
    for model, rows in results.items():
        by = {r.label: r for r in rows}
        missing = [x for x in (label, reference, baseline) if x not in by]
        if missing:
            raise KeyError(f"results for {model!r} lack {missing}; have {sorted(by)}")
        c, ref, base = by[label], by[reference], by[baseline]
        tpfs.append(c.tokens_per_forward)
        if c.accuracy < ref.accuracy - tolerance - 1e-12:
            reasons.append(f"{model}: accuracy {100 * c.accuracy:.1f}% < {reference} "
                           f"{100 * ref.accuracy:.1f}% - {100 * tolerance:g} pt")
        if c.accuracy < base.accuracy:
            reasons.append(f"{model}: accuracy {100 * c.accuracy:.1f}% < {baseline} {100 * base.accuracy:.1f}%")
        if c.tokens_per_forward <= base.tokens_per_forward:
            reasons.append(f"{model}: TPF {c.tokens_per_forward:.2f} <= {baseline} {base.tokens_per_forward:.2f}")
    return Verdict(label, not reasons, sum(tpfs) / len(tpfs), tuple(reasons))


def choose(results: Mapping[str, Sequence[SamplerResult]], candidates: Sequence[str], **kw) -> tuple[Optional[str], list[Verdict]]:
    """(the winning label or None, every candidate's verdict, best first)."""
    verdicts = sorted((judge(results, c, **kw) for c in candidates), key=lambda v: (not v.passes, -v.mean_tpf))
    winner = verdicts[0].label if verdicts and verdicts[0].passes else None
    return winner, verdicts


def main(argv: Optional[Sequence[str]] = None) -> int:
    from dllm.models import load

    ap = argparse.ArgumentParser(prog="python -m dllm.eval.choose_fast", description=__doc__.split("\n\n")[0])
    ap.add_argument("--models", nargs="+", default=["tiny-llada", "tiny-dream"])
    ap.add_argument("--candidates", nargs="+", default=None,
                    help="default: CANDIDATES, or with --results every other sampler in them")
    ap.add_argument("--n", type=int, default=8, help="test examples per task")
    ap.add_argument("--out", default="runs/fast-choice.json")
    ap.add_argument("--no-progress", action="store_true")
    ap.add_argument("--threads", type=int, default=None, help="torch CPU threads (1 on a busy machine)")
    ap.add_argument("--results", nargs="+", default=None,
                    help="compare.json files of `dllm compare` runs to judge instead of running them")
    args = ap.parse_args(argv)
    if args.threads is not None:
        if args.threads < 1:
            ap.error(f"--threads must be >= 1, got {args.threads}")
        import torch

        torch.set_num_threads(args.threads)
    specs = [REFERENCE, BASELINE, *(args.candidates or CANDIDATES)]
    results: dict[str, list[SamplerResult]] = {}
    if args.results:
        for path in args.results:
            payload = json.loads(Path(path).read_text())
            results[payload["model"]] = [SamplerResult(**r) for r in payload["results"]]
            args.n = payload.get("n_per_task", args.n)
    else:
        for name in args.models:
            results[name] = compare(load(name), specs, None, args.n, show_progress=not args.no_progress)
    for name, rows in results.items():
        print(f"\n== {name} (n = {args.n} per task, full suite)\n{format_results(rows)}")
    candidates = args.candidates
    if candidates is None:
        shared = set.intersection(*({r.label for r in rows} for rows in results.values()))
        candidates = [c for c in (list(CANDIDATES) if not args.results else
                                  [r.label for r in next(iter(results.values()))])
                      if c in shared and c not in (REFERENCE, BASELINE)]
    winner, verdicts = choose(results, candidates)
    print("\ncandidates (rule: acc >= low_confidence - 1 pt, acc >= threshold, TPF > threshold, on every model)")
    for v in verdicts:
        print(f"  {'PASS' if v.passes else 'fail'}  {v.label:<26} mean TPF {v.mean_tpf:5.2f}  {'; '.join(v.reasons)}")
    print(f"\nfast = {winner}" if winner else "\nno candidate passes on every model")
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps({"n_per_task": args.n, "winner": winner,
                               "verdicts": [asdict(v) for v in verdicts],
                               "results": {m: [asdict(r) for r in rs] for m, rs in results.items()}}, indent=2))
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
