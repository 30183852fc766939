"""How much of a long-suite decode is the block-start full forward, which no sampler or cache avoids.

    python benchmarks/prefill_share.py [--n 8] [--threads 2] [--repeats 3]

On the long-prompt suite (256-2,040-word prompts, 2-4-word answers, blocks of 4) every answer fits
one block, so every setting starts it with one forward over the whole canvas (prompt + block +
rest): the prompt's keys and values depend on the masked answer positions (bidirectional attention),
so no cache can serve them before it. Whatever a setting does after that (its steps) is all a
sampler or a cache can make cheaper. This times every model call of Fast-dLLM's setting
(``threshold`` + ``dual``) and ours (``fast`` + ``auto``) on both long pairs (``dllm.eval.bench.e2e``'s
examples), splits the wall into calls over >= ``FULL_COLUMNS`` columns (the block-start forwards:
the shortest long prompt has 256 words; a step forwards at most a few variants x 36 columns) and the
rest, and prints the bound it implies: a setting that skipped every step entirely would be at most
``wall / full`` times faster. Median of ``--repeats`` runs per setting, in interleaved rounds; every
column of a row comes from the run with the median wall. The split by width holds for cached
settings only (both here): without a cache every step forwards the whole canvas.
"""

from __future__ import annotations

import argparse
import time
from typing import Any

import torch

from dllm import tasks as T
from dllm.eval.bench.choose.cache import PAIRS
from dllm.eval.compare import task_examples
from dllm.scoring.exact_match import decode_and_score, load_model
from dllm.settings import DecodeSettings
from dllm.eval.bench.e2e import FASTDLLM

FULL_COLUMNS = 128  # a call over at least this many query columns is a block-start full forward
OURS = "fast:cache=auto"


class CallTimer:
    """Forward hooks on a model: wall time and forwarded tokens of its calls, split by query width."""

    def __init__(self, model: torch.nn.Module) -> None:
        self.totals = {"full": [0.0, 0], "step": [0.0, 0]}  # kind -> [seconds, tokens]
        self._start = 0.0
        self._handles = [model.register_forward_pre_hook(self._pre), model.register_forward_hook(self._post)]

    def _pre(self, module: Any, args: tuple) -> None:
        self._start = time.perf_counter()

    def _post(self, module: Any, args: tuple, out: Any) -> None:
        rows, cols = args[0].shape  # input_ids [B, T]
        kind = "full" if cols >= FULL_COLUMNS else "step"
        self.totals[kind][0] += time.perf_counter() - self._start
        self.totals[kind][1] += rows * cols

    def close(self) -> None:
        for h in self._handles:
            h.remove()


def run(model, examples, spec: str, block: int) -> dict:
    parsed = DecodeSettings.parse(spec)
    timer = CallTimer(model)
    try:
        t0 = time.perf_counter()
        tally = decode_and_score(model, examples, parsed.replace(block_length=block), by_task=True, max_batch=64)
        wall = time.perf_counter() - t0
    finally:
        timer.close()
    (full_s, full_tok), (step_s, step_tok) = timer.totals["full"], timer.totals["step"]
    return {"wall": wall, "full_s": full_s, "step_s": step_s, "full_tokens": full_tok, "step_tokens": step_tok,
            "accuracy": sum(tally.correct.values()) / tally.examples}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--n", type=int, default=8, help="examples per task (as dllm.eval.bench.e2e)")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--repeats", type=int, default=3)
    args = ap.parse_args()
    if min(args.n, args.threads, args.repeats) < 1:
        ap.error(f"--n, --threads and --repeats must be >= 1, got {args.n}, {args.threads}, {args.repeats}")
    torch.set_num_threads(args.threads)
    print(f"# python benchmarks/prefill_share.py --n {args.n} --threads {args.threads} --repeats {args.repeats}")
    print(f"{'pair':32s} {'setting':22s} {'acc %':>6s} {'wall s':>7s} {'full s':>7s} {'steps s':>8s} "
          f"{'full share':>10s} {'bound':>6s} {'full tok':>9s} {'step tok':>9s}")
    for model_name, suite, block in PAIRS:
        if suite != "long-prompt":
            continue
        model = load_model(model_name)
        examples = task_examples(T.suite_task_names(suite), args.n)
        runs: dict[str, list[dict]] = {FASTDLLM: [], OURS: []}
        for spec in runs:  # warm-up
            run(model, examples[:4], spec, block)
        for _ in range(args.repeats):
            for spec in runs:
                runs[spec].append(run(model, examples, spec, block))
        for spec, rs in runs.items():
            med = sorted(rs, key=lambda r: r["wall"])[len(rs) // 2]
            share = med["full_s"] / med["wall"]
            print(f"{model_name + '/' + suite:32s} {spec:22s} {100 * med['accuracy']:6.1f} {med['wall']:7.2f} "
                  f"{med['full_s']:7.2f} {med['step_s']:8.2f} {share:10.1%} {1 / share:5.2f}x "
                  f"{med['full_tokens']:9d} {med['step_tokens']:9d}", flush=True)


if __name__ == "__main__":
    main()
