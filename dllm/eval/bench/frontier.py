"""The accuracy / speed frontier against Fast-dLLM's settings.

    dllm bench frontier --model tiny-llada --dev 2 --test 2 --repeats 3 --threads 1 --out runs/frontier

Users pick a point on a curve, so one recommended setting against another answers the wrong
question. This command sweeps both curves on the same examples:

- **theirs**: Fast-dLLM's parallel decoding (Wu et al., arXiv 2505.22618; NVlabs/Fast-dLLM
  ``llada/generate.py``): ``threshold`` at 0.5 - 0.95 and ``factor`` at 1.0 - 1.9 (``rule=reference``:
  its code's walk, not the rule as the paper states it), each with its ``prefix`` and ``dual`` caches
  (``FASTDLLM_POINTS``, 18 points; the engine reproduces those drivers token for token,
  tests/cache/test_fastdllm_transcript.py, tests/samplers/test_factor_upstream.py);
- **ours**: the candidate grid (``candidate_grid``): every registered sampler that can decode the model,
  a few option values of the adaptive ones and k = 1, 2 of the fixed-step ones, each without a cache
  and with ``prefix`` / ``dual`` (``block`` for a block-causal model, whose only exact cache it is),
  each at every block length of ``--candidate-blocks`` (the suite's and ``answer``, one block of the
  whole answer: a label such as ``threshold:threshold=0.7 @ block=answer``). ``--point-blocks`` runs
  their points at other block lengths too, counted apart from the bar's (``block_label``).

Settings are **chosen on a dev split** (test instances ``0 .. --dev - 1`` of every size of every task
of the suite) and **reported on disjoint test instances** (``--dev .. --dev + --test - 1``): for each of
their points, ours is the dev-fastest candidate whose dev accuracy is at least the point's plus
``--margin``, among those at >= ``--tpf-bar`` x its dev tokens per forward when any is (``choose``). On the
test instances each chosen pair is timed in ``--repeats`` interleaved rounds, and the table gives,
per point: both accuracies, the tokens/s ratio (median of the per-round ratios), the tokens-per-forward
ratio and both forwarded-token counts (a win bought with more forwarded tokens shows). ``met``: ours
at >= their test accuracy with >= ``--speed-bar`` (1.1x) their tokens/s and >= ``--tpf-bar`` (1.3x)
their tokens per forward. Writes ``frontier.json``, ``frontier.txt`` and ``frontier.png`` (both
frontiers on the accuracy / tokens-per-second plane, the dev sweep in grey); Ctrl-C keeps every
finished row, and ``--resume`` measures only the dev rows an earlier run did not leave (an earlier run
of the same model, suite, ``--dev`` and ``--block-length``).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Optional, Sequence

from dllm.flags import POSITIVE, output_dir
from dllm.eval.interrupt import finished, until_interrupted

THRESHOLDS = (0.5, 0.7, 0.8, 0.9, 0.95)
FACTORS = (1.0, 1.3, 1.6, 1.9)
FASTDLLM_CACHES = ("prefix", "dual")
FASTDLLM_POINTS = tuple([f"threshold:threshold={t},cache={c}" for c in FASTDLLM_CACHES for t in THRESHOLDS]
                        + [f"factor:factor={f},rule=reference,cache={c}" for c in FASTDLLM_CACHES for f in FACTORS])

# option values swept for the adaptive samplers (their defaults are always in the grid)
SWEEPS: dict[str, tuple[str, ...]] = {
    "threshold": ("threshold=0.6", "threshold=0.7", "threshold=0.8", "threshold=0.95"),
    "factor": ("factor=1.3", "factor=1.9"),
    "eb": ("gamma=0.01", "gamma=0.1", "gamma=1.0"),
    "fast": ("tau_conf=0.7", "tau_conf=0.8"),
    "localleap": (),
    "klass": (),
    "credit": (),
    "hierarchy": (),
}
FIXED_STEP_K = (1, 2)
SKIP = ("random", "origin")  # draw at random: no fixed accuracy to choose a point by
ANSWER = "answer"  # a block length: one block of the whole answer
BLOCK_TAG = " @ block="  # a label's block length, when it is not the suite's


def block_label(spec: str, block: "int | str", suite_block: int) -> str:
    """The label of ``spec`` decoded in blocks of ``block`` (an int, or ``ANSWER``): the spec alone at
    the suite's block length, else ``"SPEC @ block=8"`` / ``"SPEC @ block=answer"``."""
    return spec if block == suite_block else f"{spec}{BLOCK_TAG}{block}"


def parse_block(text: str) -> "int | str":
    """A block length as written in a label or on the command line: an integer >= 1, or ``ANSWER``."""
    if text == ANSWER:
        return ANSWER
    if not text.isdigit() or int(text) < 1:
        raise ValueError(f"the block length must be an integer >= 1 or {ANSWER!r}, got {text!r}")
    return int(text)


def parse_label(label: str, suite_block: Optional[int]) -> tuple[str, Optional[int]]:
    """``block_label``'s inverse: ``(spec, block_length)``, None for one block of the answer (or the
    model's own grid when ``suite_block`` is None)."""
    spec, tag, block = label.partition(BLOCK_TAG)
    if not tag:
        return spec, suite_block
    if suite_block is None:
        raise ValueError(f"{label!r}: a block-causal model decodes on its own grid; no block length applies")
    try:
        length = parse_block(block)
    except ValueError as err:
        raise ValueError(f"{label!r}: {err}") from None
    return spec, None if length == ANSWER else length


@dataclass
class Row:
    """One setting measured on one split."""

    setting: str
    accuracy: float
    tokens_per_second: float
    tokens_per_forward: float
    forwarded_tokens: int
    wall_times: list[float]


def candidate_grid(model, caches: Sequence[str]) -> list[str]:
    """Our candidates for ``model``: every registered sampler that can decode it (defaults, the
    ``SWEEPS`` values; k = 1, 2 for fixed-step samplers), each with every cache of ``caches``."""
    from dllm.eval.bench.choose.fast import cannot_run
    from dllm.samplers import make_sampler, samplers

    out: list[str] = []
    for name in samplers.names():
        if name in SKIP or cannot_run(model, name):
            continue
        adaptive = not make_sampler(name).fixed_steps
        variants = [""] + list(SWEEPS.get(name, ())) if adaptive else [f"k={k}" for k in FIXED_STEP_K]
        for v in variants:
            for c in caches:
                opts = ",".join(o for o in (v, "" if c == "none" else f"cache={c}") if o)
                out.append(f"{name}:{opts}" if opts else name)
    return out


def choose(points: dict[str, Row], candidates: dict[str, Row], margin: float = 0.0,
           tpf_bar: Optional[float] = None) -> dict[str, Optional[str]]:
    """For each of their points: our dev-fastest candidate at >= its dev accuracy + ``margin`` (a
    fraction; a margin keeps a pick chosen at the edge of the dev accuracy from falling below the point
    on the test instances), among those with >= ``tpf_bar`` x its dev tokens per forward when any has
    (the bar asks for both) -- None if no candidate is accurate enough."""
    picks: dict[str, Optional[str]] = {}
    for label, ref in points.items():
        ok = [c for c in candidates.values() if c.accuracy >= ref.accuracy + margin - 1e-12]
        if tpf_bar is not None:
            ok = [c for c in ok if c.tokens_per_forward >= tpf_bar * ref.tokens_per_forward] or ok
        picks[label] = max(ok, key=lambda c: c.tokens_per_second).setting if ok else None
    return picks


def pareto(rows: Sequence[Row]) -> list[Row]:
    """Rows no other row beats in both accuracy and tokens/s, by tokens/s."""
    front = [r for r in rows if not any(o.accuracy >= r.accuracy and o.tokens_per_second > r.tokens_per_second
                                        or o.accuracy > r.accuracy and o.tokens_per_second >= r.tokens_per_second
                                        for o in rows)]
    return sorted(front, key=lambda r: r.tokens_per_second)


def compare_pair(ours: Row, theirs: Row, speed_bar: float, tpf_bar: float) -> dict[str, Any]:
    """The table's numbers for one of their points and our pick, on the test split."""
    rounds = [t / o for o, t in zip(ours.wall_times, theirs.wall_times)]  # their wall / ours = our speed-up
    speed = statistics.median(rounds) if rounds else float("nan")
    tpf = ours.tokens_per_forward / theirs.tokens_per_forward
    return {"accuracy_theirs": theirs.accuracy, "accuracy_ours": ours.accuracy,
            "speed_ratio": round(speed, 3), "speed_ratio_rounds": [round(r, 3) for r in rounds],
            "tpf_ratio": round(tpf, 3), "forwarded_theirs": theirs.forwarded_tokens,
            "forwarded_ours": ours.forwarded_tokens,
            "met": ours.accuracy >= theirs.accuracy and speed >= speed_bar and tpf >= tpf_bar}


def run_setting(model, label: str, examples, suite_block: Optional[int]):
    """One decode of ``examples`` with the setting ``label`` names (``dllm.eval.compare.run_sampler``;
    ``parse_label`` gives its block length)."""
    from dllm.eval.compare import run_sampler
    from dllm.settings import DecodeSettings

    spec, block = parse_label(label, suite_block)
    return run_sampler(model, DecodeSettings.parse(spec, block_length=block), examples, block_length=None)


def as_row(setting: str, r) -> Row:
    """A compare ``SamplerResult`` (one run, or ``median_wall`` of several) as a frontier row."""
    walls = r.extra.get("wall_times", [r.wall_time])
    return Row(setting, r.accuracy, r.tokens_per_second, r.tokens_per_forward, r.forwarded_tokens, list(walls))


def measure(model, setting: str, examples, suite_block: Optional[int]) -> Row:
    return as_row(setting, run_setting(model, setting, examples, suite_block))


def timed_rounds(model, settings: Sequence[str], examples, suite_block: Optional[int], repeats: int,
                 bar) -> dict[str, Row]:
    """Every setting ``repeats`` times in interleaved rounds, folded by ``compare.median_wall`` (the first
    round's counts, every wall time, tokens/s from the median wall; runs that differ are an error)."""
    from dllm.eval.compare import median_wall

    runs: dict[str, list] = {s: [] for s in settings}
    for _ in range(repeats):
        for s in settings:
            runs[s].append(run_setting(model, s, examples, suite_block))
            bar.update(1)
    return {s: as_row(s, median_wall(r) if len(r) > 1 else r[0]) for s, r in runs.items()}


def format_table(pairs: dict[str, dict[str, Any]], picks: dict[str, Optional[str]],
                 groups: Optional[dict[str, Sequence[str]]] = None) -> str:
    """The table, one line per point of ``pairs``; then how many points met the bars, per group of
    ``groups`` (name -> its points; default one group of every point)."""
    wt = max([len("theirs (Fast-dLLM)")] + [len(p) for p in pairs]) + 2
    wo = max([len("ours (chosen on dev)")] + [len(c) for c in picks.values() if c]) + 2
    head = (f"{'theirs (Fast-dLLM)':<{wt}}{'acc %':>7}  {'ours (chosen on dev)':<{wo}}{'acc %':>7}{'tok/s x':>9}"
            f"{'TPF x':>7}{'fwd theirs':>11}{'fwd ours':>10}  met")
    lines = [head, "-" * len(head)]
    for ref, p in pairs.items():
        if picks.get(ref) is None:
            lines.append(f"{ref:<{wt}}{100 * p['accuracy_theirs']:7.1f}  {'(no candidate as accurate on dev)':<{wo}}")
            continue
        lines.append(f"{ref:<{wt}}{100 * p['accuracy_theirs']:7.1f}  {picks[ref]:<{wo}}{100 * p['accuracy_ours']:7.1f}"
                     f"{p['speed_ratio']:9.2f}{p['tpf_ratio']:7.2f}{p['forwarded_theirs']:11d}"
                     f"{p['forwarded_ours']:10d}  {'yes' if p['met'] else 'no'}")
    for name, members in (groups or {"": list(pairs)}).items():
        met = sum(pairs[p].get("met", False) for p in members if p in pairs)
        lines.append(f"met at {met} of {len(members)} points{name}")
    return "\n".join(lines)


def plot(dev: dict[str, Row], test: dict[str, Row], picks: dict[str, Optional[str]], path: Path, title: str,
         groups: Optional[dict[str, Sequence[str]]] = None) -> None:
    """Both frontiers on the accuracy / tokens-per-second plane: their points per group of ``groups``
    (default one), our picks, the dev sweep in grey."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4.5))
    ax.scatter([r.tokens_per_second for r in dev.values()], [100 * r.accuracy for r in dev.values()], s=8,
               color="0.8", label="dllm candidates (dev)")
    series = [(f"Fast-dLLM{name} (test)", [test[p] for p in members if p in test])
              for name, members in (groups or {"": list(picks)}).items()]
    series.append(("dllm picks (test)", [test[c] for c in dict.fromkeys(picks.values()) if c and c in test]))
    colours = ["tab:blue", "tab:green", "tab:purple", "tab:orange"]
    for i, (label, pts) in enumerate(series):
        colour = "tab:red" if i == len(series) - 1 else colours[i % len(colours)]
        front = pareto(pts)
        ax.scatter([r.tokens_per_second for r in pts], [100 * r.accuracy for r in pts], s=24, color=colour, label=label)
        ax.plot([r.tokens_per_second for r in front], [100 * r.accuracy for r in front], "--", color=colour)
    ax.set_xlabel("tokens / s")
    ax.set_ylabel("exact match %")
    ax.set_title(title)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def main(argv: Optional[Sequence[str]] = None) -> int:
    from tqdm.auto import tqdm

    from dllm import tasks as T
    from dllm.scoring.exact_match import check_test_range, eval_examples, load_model

    ap = argparse.ArgumentParser(prog="dllm bench frontier", description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", default="tiny-llada")
    ap.add_argument("--suite", default=T.PB_MINI, help=f"task suite (valid: {', '.join(T.SUITES)})")
    ap.add_argument("--block-length", type=int, default=4, help="the suite's block length: their points run at it")
    ap.add_argument("--candidate-blocks", nargs="+", default=None, metavar="N|answer",
                    help="block lengths our candidates run at (default: --block-length and answer, one block of the "
                         "whole answer); ignored for a block-causal model, which decodes on its own grid")
    ap.add_argument("--point-blocks", nargs="+", default=None, metavar="N|answer",
                    help="their points again at these block lengths too (reported beside the bar's, which stay at "
                         "--block-length)")
    ap.add_argument("--margin", type=float, default=0.0,
                    help="pick a candidate only at >= the point's dev accuracy + this many points (0 - 100)")
    ap.add_argument("--dev", type=int, default=2, help="dev instances per size of every task (choosing)")
    ap.add_argument("--test", type=int, default=2, help="test instances per size, after the dev ones (reporting)")
    ap.add_argument("--candidates", nargs="+", default=None, metavar="SPEC",
                    help="our settings (default: candidate_grid over the registered samplers)")
    ap.add_argument("--points", nargs="+", default=None, metavar="SPEC",
                    help="their settings (default: Fast-dLLM's 18 threshold / factor x prefix / dual points)")
    ap.add_argument("--repeats", type=int, default=3, help="interleaved timed rounds on the test split")
    ap.add_argument("--speed-bar", type=float, default=1.1)
    ap.add_argument("--tpf-bar", type=float, default=1.3)
    ap.add_argument("--threads", type=POSITIVE, default=None, help="torch CPU threads")
    ap.add_argument("--device", default=None)
    ap.add_argument("--out", type=output_dir, default="runs/frontier")
    ap.add_argument("--resume", action="store_true",
                    help="reuse the dev rows of --out's frontier.json (same model, suite, --dev and --block-length) "
                         "and measure the rest")
    ap.add_argument("--no-progress", action="store_true")
    args = ap.parse_args(argv)
    if args.suite not in T.SUITES:
        ap.error(f"--suite {args.suite!r}: valid suites are {', '.join(T.SUITES)}")
    if args.repeats < 1 or args.dev < 1 or args.test < 1 or args.block_length < 1:
        ap.error("--repeats, --dev, --test and --block-length must be >= 1")
    if not 0 <= args.margin <= 100:
        ap.error(f"--margin {args.margin}: give accuracy points between 0 and 100")
    blocks: dict[str, list] = {}
    for flag, given in (("--candidate-blocks", args.candidate_blocks), ("--point-blocks", args.point_blocks)):
        blocks[flag] = []
        for b in given or ():
            try:
                blocks[flag].append(parse_block(b))
            except ValueError as err:
                ap.error(f"{flag} {b!r}: {err}")
    try:
        check_test_range(args.test, args.dev)
        model = load_model(args.model, device=args.device)
    except ValueError as err:
        ap.error(str(err))
    if args.threads is not None:
        import torch

        torch.set_num_threads(args.threads)
    block_causal = getattr(model.config, "block_causal", False)
    caches = ("none", "block") if block_causal else ("none", "prefix", "dual")
    bar_points = list(args.points or ([] if block_causal else FASTDLLM_POINTS))
    if not bar_points:
        ap.error(f"{args.model} attends block-causally: Fast-dLLM's prefix / dual points do not apply; give --points")
    suite = args.block_length
    cand_blocks = [suite] if block_causal else blocks["--candidate-blocks"] or [suite, ANSWER]
    more_blocks = [] if block_causal else [b for b in blocks["--point-blocks"] if b != suite]
    groups = {f" at block {suite} (the bar)" if more_blocks else "": bar_points}
    for b in dict.fromkeys(more_blocks):
        groups[f" at block {b}"] = [block_label(p, b, suite) for p in bar_points]
    points = [p for members in groups.values() for p in members]
    specs = args.candidates or candidate_grid(model, caches)  # once, not once per block length
    candidates = list(dict.fromkeys(c if BLOCK_TAG in c else block_label(c, b, suite)  # a label's own block stays
                                    for b in dict.fromkeys(cand_blocks) for c in specs))
    from dllm.settings import DecodeSettings

    for label in points + candidates:
        try:
            spec, _ = parse_label(label, None if block_causal else suite)
            DecodeSettings.parse(spec).check()  # the sampler and its options, the cache, k: before any decode
        except (ValueError, TypeError) as err:
            ap.error(f"{label}: {err}")
    names = T.suite_task_names(args.suite)
    dev_ex = eval_examples(names, args.dev)
    test_ex = eval_examples(names, args.test, skip=args.dev)
    block = None if block_causal else args.block_length
    out = Path(args.out)
    state: dict[str, Any] = {"dev": {}, "test": {}, "picks": {}, "pairs": {}, "skipped": {}}

    def save() -> None:
        out.mkdir(parents=True, exist_ok=True)
        doc = {"command": "dllm bench frontier " + " ".join(argv if argv is not None else sys.argv[1:]),
               "model": args.model, "suite": args.suite, "block_length": args.block_length,
               "dev_per_size": args.dev, "test_per_size": args.test,
               "examples": {"dev": len(dev_ex), "test": len(test_ex)}, "repeats": args.repeats,
               "margin": args.margin, "points": points, "groups": groups, "dev": {k: asdict(v) for k, v in state["dev"].items()},
               "test": {k: asdict(v) for k, v in state["test"].items()}, "picks": state["picks"],
               "pairs": state["pairs"], "skipped": state["skipped"]}
        (out / "frontier.json").write_text(json.dumps(doc, indent=2))

    if args.resume and (out / "frontier.json").exists():
        earlier = json.loads((out / "frontier.json").read_text())
        # the suite's block length is in no label (``block_label``): rows of another one must not be reused
        same = {k: earlier.get(k) for k in ("model", "suite", "dev_per_size", "block_length")}
        if same != {"model": args.model, "suite": args.suite, "dev_per_size": args.dev, "block_length": args.block_length}:
            ap.error(f"--resume: {out / 'frontier.json'} is of {same}, not of this run's model, suite, --dev and "
                     f"--block-length ({args.model!r}, {args.suite!r}, {args.dev}, {args.block_length})")
        state["dev"] = {k: Row(**v) for k, v in earlier.get("dev", {}).items() if k in points or k in candidates}
        state["skipped"] = {k: v for k, v in earlier.get("skipped", {}).items() if k in candidates}

    def run() -> int:
        measure(model, points[0], dev_ex[:8], block)  # warm-up (first-call allocations), not recorded
        with tqdm(total=len(points) + len(candidates), disable=args.no_progress, desc="frontier dev", unit="setting") as bar:
            bar.update(len(state["dev"]) + len(state["skipped"]))
            for s in points + candidates:
                if s in state["dev"] or s in state["skipped"]:
                    continue
                bar.set_postfix_str(s[:40])
                try:
                    state["dev"][s] = measure(model, s, dev_ex, block)
                except ValueError as err:  # a candidate that cannot decode these examples: skipped, said why
                    if s in points:
                        raise
                    state["skipped"][s] = str(err)
                    print(f"skipped {s}: {err}", flush=True)
                bar.update(1)
                if bar.n % 10 == 0:
                    save()
        save()
        picks = choose({p: state["dev"][p] for p in points},
                       {c: state["dev"][c] for c in candidates if c in state["dev"]}, args.margin / 100, args.tpf_bar)
        state["picks"] = picks
        chosen = list(dict.fromkeys([*points, *(c for c in picks.values() if c)]))
        with tqdm(total=len(chosen) * args.repeats, disable=args.no_progress, desc="frontier test", unit="run") as bar:
            state["test"] = timed_rounds(model, chosen, test_ex, block, args.repeats, bar)
        state["pairs"] = {p: compare_pair(state["test"][c], state["test"][p], args.speed_bar, args.tpf_bar)
                          for p, c in picks.items() if c}
        state["pairs"].update({p: {"accuracy_theirs": state["test"][p].accuracy} for p, c in picks.items() if not c})
        table = format_table({p: state["pairs"][p] for p in points}, picks, groups)
        print(table)
        save()
        (out / "frontier.txt").write_text(f"$ {json.loads((out / 'frontier.json').read_text())['command']}\n\n{table}\n")
        plot(state["dev"], state["test"], picks, out / "frontier.png",
             f"{args.model}, {args.suite}: Fast-dLLM's points vs dllm's picks", groups)
        print(f"wrote {out / 'frontier.json'}, {out / 'frontier.txt'} and {out / 'frontier.png'}")
        return 0

    def kept() -> str:
        save()
        return finished(len(state["dev"]), "dev row", str(out / "frontier.json"))

    return until_interrupted(run, kept)


__all__ = ["ANSWER", "FASTDLLM_POINTS", "Row", "block_label", "candidate_grid", "choose", "compare_pair", "format_table", "main",
           "pareto", "parse_block", "parse_label"]


if __name__ == "__main__":
    raise SystemExit(main())
