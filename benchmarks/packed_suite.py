"""The long-prompt suite decoded in ``dllm compare``'s batches (one per task) with the ``sdpa``
backend's padded-batch path against ``sdpa_plain`` (one masked call), with the models' full
forwards run per group of equally padded rows (``dllm.models.core.packed_rows``: forwards without a
cache only, so it shows with ``--cache none``), in batches of similar prompt length
(``decode_and_score``'s default since 2026-12-02: ``length_batches``), and one prompt at a time (no
padding), in interleaved rounds.

    python benchmarks/packed_suite.py [MODEL] [--sampler threshold] [--cache dual] [--repeats 3] [--threads 2]

One batch per task holds 8 examples of 256- to 2,040-word prompts left-padded to the longest; prints
the median wall of each variant and its correct answers (the same for every variant unless float
summation tips a near tie).
"""

from __future__ import annotations

import argparse
import statistics

import torch

from dllm import tasks as T
from dllm.eval.compare import task_examples
from dllm.scoring.exact_match import decode_and_score, load_model


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("model", nargs="?", default="tiny-llada-long")
    ap.add_argument("--sampler", default="threshold")
    ap.add_argument("--cache", default="dual")
    ap.add_argument("--n", type=int, default=8)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--threads", type=int, default=2)
    args = ap.parse_args()
    if min(args.n, args.repeats, args.threads) < 1:
        ap.error(f"--n, --repeats and --threads must be >= 1, got {args.n}, {args.repeats}, {args.threads}")
    torch.set_num_threads(args.threads)
    model = load_model(args.model)
    examples = task_examples(list(T.suite_task_names("long-prompt")), args.n)
    # (attention backend, max batch, batches by length, full forwards per group of rows: packs_padded_rows)
    variants = {"one batch per task, sdpa_plain": ("sdpa_plain", 64, False, False),
                "one batch per task, sdpa": ("sdpa", 64, False, False),
                "one batch per task, sdpa, rows": ("sdpa", 64, False, True),
                "batched by length, sdpa": ("sdpa", 64, True, True),
                "one prompt at a time": ("sdpa", 1, False, True)}
    walls: dict[str, list[float]] = {k: [] for k in variants}
    correct = {}
    for _ in range(args.repeats):
        for name, (backend, max_batch, by_length, rows) in variants.items():
            model.set_attn_backend(backend)
            model.packs_padded_rows = rows
            tally = decode_and_score(model, examples, args.sampler, block_length=4, by_task=True,
                                     max_batch=max_batch, by_length=by_length, cache=args.cache)
            walls[name].append(tally.seconds)
            correct[name] = sum(tally.correct.values())
    print(f"{args.model}, {args.sampler} + cache {args.cache}, {len(examples)} long-prompt examples, blocks of 4, "
          f"{args.threads} thread(s), median of {args.repeats}")
    base = statistics.median(walls["one batch per task, sdpa_plain"])
    for name, w in walls.items():
        med = statistics.median(w)
        print(f"  {name:<32} {med:7.2f} s  ({', '.join(f'{x:.2f}' for x in w)})  x plain {base / med:5.2f}  "
              f"correct {correct[name]}/{len(examples)}")


if __name__ == "__main__":
    main()
