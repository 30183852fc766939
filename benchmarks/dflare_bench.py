"""DFlare beside DFlash on the tiny AR target, in one run: ``python benchmarks/dflare_bench.py --n 4 --threads 1``.

``dllm bench spec`` runs each method once per call (``--dflash`` names one checkpoint), so the two
drafters would be timed in separate runs; here ``target.generate``, ``dflash`` with ``tiny-ar-dflash``
and ``dflash`` with ``tiny-ar-dflare`` (a DFlare checkpoint, loaded by the same registered drafter) take
turns on every prompt (the same runners, rows and table as ``dllm bench spec``).
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import torch

from dllm import tasks as T
from dllm.eval.speculative.bench import WARMUP_TOKENS
from dllm.eval.speculative.report import compare_to_baseline, format_table, summarize, task_vocab
from dllm.eval.speculative.runners import Method, make_runner
from dllm.models.targets import load_target

DRAFTERS = "tiny-ar-dflash,tiny-ar-dflare"  # embedded names or checkpoint directories


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--n", type=int, default=4, help="test examples per task size")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--temperatures", default="0,1")
    ap.add_argument("--block-size", type=int, default=16)
    ap.add_argument("--drafters", default=DRAFTERS, help="comma-separated dflash checkpoints (names or dirs)")
    ap.add_argument("--out", default=None)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    target, _ = load_target("tiny-ar")
    runners = {"generate": make_runner(target, Method("generate"), args.block_size)}
    runners.update({f"dflash ({model})": make_runner(target, Method("dflash", model), args.block_size)
                    for model in args.drafters.split(",")})
    examples = [ex for t in T.suite_task_names("long-answer") for ex in T.test_split(t, None, n=args.n)]
    vocab = task_vocab()
    prompts = [[vocab[w] for w in T.prompt_words(ex)] for ex in examples]
    budgets = [T.answer_length(ex.task, ex.size) for ex in examples]
    for run in runners.values():  # warm-up, untimed
        run(prompts[0], 0.0, WARMUP_TOKENS, 0)
    rows = []
    for temp in [float(t) for t in args.temperatures.split(",")]:
        samples = {name: [] for name in runners}
        for i, (prompt, budget) in enumerate(zip(prompts, budgets)):
            for name, run in runners.items():
                samples[name].append(run(prompt, temp, budget, i))
        block = [summarize(name, temp, samples[name], examples, args.block_size) for name in runners]
        compare_to_baseline(block, block[0], temp)
        rows += block
    print(f"target tiny-ar: {len(examples)} prompts (long-answer; n = {args.n} per size), batch 1, block size "
          f"{args.block_size}, {torch.get_num_threads()} threads")
    print(format_table(rows))
    if args.out:
        Path(args.out).write_text(json.dumps({"prompts": len(examples), "threads": torch.get_num_threads(),
                                              "rows": [r.to_json() for r in rows]}, indent=2) + "\n")


if __name__ == "__main__":
    main()
