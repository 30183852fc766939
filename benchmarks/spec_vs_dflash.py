"""dllm's speculative loop against the ``dflash`` package's own ``dflash_generate``, batch 1.

    python benchmarks/spec_vs_dflash.py [--n 36] [--repeats 3] [--threads 1] [--block-size 16]
                                        [--out benchmarks/results/spec-vs-dflash.md]

Same weights (the shipped pair: target ``tiny-ar``, drafter ``tiny-ar-dflash``, loaded by
``dflash.model.DFlashDraftModel.from_pretrained`` for the reference and by ``make_drafter("dflash")``
for ours), same prompts (``--n`` of the long-answer suite: 36 = the first 4 test instances of every size),
same budget (each prompt's answer length), greedy, stop at EOS. Every prompt's tokens must be equal
in both loops (a mismatch is reported and fails the run).

Interleaved: ``--repeats`` rounds; in each round every prompt runs in both loops back to back (the
order alternates per prompt and round), so a busy machine slows both alike. Reported: tokens/s of
each loop (all rounds), the ratio ours / theirs overall and the median of the per-round ratios (each
round's total time), verification rounds and tokens per round. Ctrl-C keeps the finished
(round, prompt) rows and writes the report from them.

Reference: z-lab/dflash ``dflash/model.py`` ``dflash_generate`` (the ``dflash`` 0.1.0 package).
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Callable, Optional, Sequence

import torch

from dllm import tasks as T
from dllm.drafters.base import make_drafter
from dllm.models.targets import load_target
from dllm.drafters.loop import speculative_generate
from dllm.eval.interrupt import finished, until_interrupted
from dllm.eval.speculative.report import task_vocab
from dllm.eval.speculative.runners import counting
from dllm.models.loading import locate
from dllm.tasks.vocab import EOS, word_id

TARGET, DRAFTER = "tiny-ar", "tiny-ar-dflash"


@dataclass
class Pair:
    """One prompt in one round: both loops' tokens, wall time and verification rounds."""

    round: int
    prompt: int
    task: str
    tokens: int  # generated tokens (ours; equal to theirs when ``equal``)
    ours_s: float
    theirs_s: float
    ours_rounds: int
    theirs_rounds: int
    equal: bool


def parse_args(argv: Optional[Sequence[str]] = None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--n", type=int, default=36, help="prompts: the first test instances of every size of every "
                                                      "long-answer task, instance 0 of each first (36: 4 per size)")
    ap.add_argument("--repeats", type=int, default=3, help="interleaved rounds over all prompts")
    ap.add_argument("--threads", type=int, default=1, help="torch CPU threads")
    ap.add_argument("--block-size", type=int, default=16, help="block size of both loops")
    ap.add_argument("--out", default="benchmarks/results/spec-vs-dflash.md",
                    help="the Markdown report (a .json with every row beside it); '' writes none")
    ap.add_argument("--no-progress", action="store_true", help="no progress bar")
    args = ap.parse_args(argv)
    for name in ("n", "repeats", "threads", "block_size"):
        if getattr(args, name) < 1:
            ap.error(f"--{name.replace('_', '-')} must be >= 1, got {getattr(args, name)}")
    return args


def long_answer_examples(n: int) -> list[T.Example]:
    """``n`` prompts of the long-answer suite: instance 0 of every (task, size), then instance 1, ..."""
    groups: dict[tuple[str, int], list[T.Example]] = {}
    for task in T.suite_task_names("long-answer"):
        sizes = len({ex.size for ex in T.test_split(task, None, n=1)})
        for ex in T.test_split(task, None, n=-(-n // sizes)):
            groups.setdefault((task, ex.size), []).append(ex)
    depth = max(len(g) for g in groups.values())
    ordered = [g[i] for i in range(depth) for g in groups.values() if i < len(g)]
    return ordered[:n]


def reference_runner(block_size: int, target, eos: int) -> Callable[[list[int], int], tuple[list[int], int]]:
    """The ``dflash`` package's loop on the shipped drafter's weights: prompt -> (generated, rounds)."""
    try:
        from dflash.model import DFlashDraftModel, dflash_generate
    except ImportError as err:
        raise SystemExit(f"the reference package is not installed ({err}); pip install --no-deps dflash==0.1.0")
    model = DFlashDraftModel.from_pretrained(locate(DRAFTER), dtype=torch.float32).eval()

    def run(prompt: list[int], max_new: int) -> tuple[list[int], int]:
        out = dflash_generate(model, target, torch.tensor([prompt]), max_new, [eos], block_size=block_size)
        return out[0, len(prompt):].tolist(), -1

    def run_stats(prompt: list[int], max_new: int) -> tuple[list[int], int]:
        # verification rounds = target forwards - the prefill (return_stats=True needs CUDA for its timers)
        with counting(target) as starts:
            out = dflash_generate(model, target, torch.tensor([prompt]), max_new, [eos], block_size=block_size)
        return out[0, len(prompt):].tolist(), len(starts) - 1

    run.stats = run_stats  # type: ignore[attr-defined]
    return run


def ours_runner(block_size: int, target) -> Callable[[list[int], int], tuple[list[int], int]]:
    drafter = make_drafter("dflash", model=DRAFTER)

    def run(prompt: list[int], max_new: int) -> tuple[list[int], int]:
        out = speculative_generate(target, drafter, [prompt], max_new_tokens=max_new, plan=block_size)
        return out.generated[0], out.rounds

    return run


def timed(fn: Callable[[], tuple[list[int], int]]) -> tuple[list[int], int, float]:
    t0 = time.perf_counter()
    gen, rounds = fn()
    return gen, rounds, time.perf_counter() - t0


def summary(pairs: Sequence[Pair], prompts: int) -> dict:
    """Totals over every finished row and per-round ratios (rounds with all ``prompts`` only)."""
    tokens = sum(p.tokens for p in pairs)
    ours, theirs = sum(p.ours_s for p in pairs), sum(p.theirs_s for p in pairs)
    by_round: dict[int, list[Pair]] = {}
    for p in pairs:
        by_round.setdefault(p.round, []).append(p)
    ratios = [sum(p.theirs_s for p in v) / sum(p.ours_s for p in v) for v in by_round.values() if len(v) == prompts]
    first = [p for p in pairs if p.round == 0]
    return {
        "rows": len(pairs), "tokens": tokens, "equal": sum(p.equal for p in pairs),
        "ours_tokens_per_s": tokens / ours if ours else 0.0, "theirs_tokens_per_s": tokens / theirs if theirs else 0.0,
        "ratio_overall": theirs / ours if ours else 0.0, "ratio_per_round": ratios,
        "ratio_median": statistics.median(ratios) if ratios else None,
        "ours_rounds": sum(p.ours_rounds for p in first), "theirs_rounds": sum(p.theirs_rounds for p in first),
        "round0_tokens": sum(p.tokens for p in first),
        "rounds_equal": sum(p.ours_rounds == p.theirs_rounds for p in first), "round0_prompts": len(first),
    }


def report(args: argparse.Namespace, command: str, pairs: Sequence[Pair], prompts: int) -> str:
    s = summary(pairs, prompts)
    med = "n/a" if s["ratio_median"] is None else f"{s['ratio_median']:.3f}x"
    per_round = ", ".join(f"{r:.3f}" for r in s["ratio_per_round"]) or "none complete"
    tau = lambda rounds: f"{s['round0_tokens'] / rounds:.2f}" if rounds > 0 else "n/a"  # noqa: E731
    lines = [
        "# dllm's speculative loop vs the `dflash` package's `dflash_generate`", "",
        f"`{command}`", "",
        f"target `{TARGET}`, drafter `{DRAFTER}` (same weights), {prompts} long-answer prompts "
        f"(the first instances of every task and size), greedy, batch 1, block size {args.block_size}, stop at EOS, "
        f"{torch.get_num_threads()} thread(s), {platform.machine()} CPU, torch {torch.__version__}; "
        f"{args.repeats} interleaved rounds (both loops per prompt, order alternating). Shared, noisy machine: "
        f"only the interleaved ratios are meaningful.", "",
        "| loop | tokens/s | verification rounds (round 0) | tokens / round |",
        "|---|---:|---:|---:|",
        f"| dllm `speculative_generate` | {s['ours_tokens_per_s']:.1f} | {s['ours_rounds']} | {tau(s['ours_rounds'])} |",
        f"| dflash `dflash_generate` | {s['theirs_tokens_per_s']:.1f} | {s['theirs_rounds']} | "
        f"{tau(s['theirs_rounds'])} |", "",
        f"- speed ratio dllm / dflash: **{med}** (median of per-round ratios: {per_round}); "
        f"{s['ratio_overall']:.3f}x over all {s['rows']} rows",
        f"- tokens equal on {s['equal']} / {s['rows']} (round, prompt) rows; {s['tokens']} generated tokens",
        f"- verification rounds equal (so the same acceptance) on {s['rounds_equal']} / {s['round0_prompts']} prompts",
    ]
    if len(pairs) < args.repeats * prompts:
        lines.append(f"- interrupted: {len(pairs)} of {args.repeats * prompts} rows finished")
    return "\n".join(lines) + "\n"


def main(argv: Optional[Sequence[str]] = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    args = parse_args(argv)
    command = " ".join(["python benchmarks/spec_vs_dflash.py", *argv])
    torch.set_num_threads(args.threads)
    from tqdm.auto import tqdm

    examples = long_answer_examples(args.n)
    pairs: list[Pair] = []

    def write() -> Optional[str]:
        text = report(args, command, pairs, len(examples))
        print(text)
        if not args.out:
            return None
        out = Path(args.out)
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(text)
        payload = {"command": command, "summary": summary(pairs, len(examples)), "rows": [asdict(p) for p in pairs]}
        out.with_suffix(".json").write_text(json.dumps(payload, indent=1) + "\n")
        return str(out)

    def body() -> int:
        target, _ = load_target(TARGET)
        theirs, ours = reference_runner(args.block_size, target, word_id(EOS)), ours_runner(args.block_size, target)
        vocab = task_vocab()
        prompts = [[vocab[w] for w in T.prompt_words(ex)] for ex in examples]
        budgets = [T.answer_length(ex.task, ex.size) for ex in examples]
        theirs_rounds = [theirs.stats(p, b)[1] for p, b in zip(prompts, budgets)]  # type: ignore[attr-defined]
        ours(prompts[0], 8), theirs(prompts[0], 8)  # warm-up
        bar = tqdm(total=args.repeats * len(prompts), disable=args.no_progress, desc="spec vs dflash", unit="prompt")
        for r in range(args.repeats):
            for i, (prompt, budget) in enumerate(zip(prompts, budgets)):
                first_ours = (r + i) % 2 == 0
                calls = [lambda: ours(prompt, budget), lambda: theirs(prompt, budget)]
                results = [timed(c) for c in (calls if first_ours else calls[::-1])]
                (g_ours, n_ours, t_ours), (g_theirs, _, t_theirs) = results if first_ours else results[::-1]
                pairs.append(Pair(r, i, examples[i].task, len(g_ours), t_ours, t_theirs, n_ours, theirs_rounds[i],
                                  g_ours == g_theirs))
                s = summary(pairs, len(examples))
                bar.set_postfix_str(f"x{s['ratio_overall']:.3f} equal {s['equal']}/{s['rows']}")
                bar.update(1)
        bar.close()
        write()
        return 0 if all(p.equal for p in pairs) else 1

    def keep() -> str:
        where = write() if pairs else None
        return finished(len(pairs), "row", where)

    return until_interrupted(body, keep)


if __name__ == "__main__":
    raise SystemExit(main())
