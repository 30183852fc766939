"""Draft trees at batch > 1: does a builder's fixed per-round cost amortise over the rows?

    python benchmarks/trees_batch.py [--batch 1 8] [--n 8] [--passes 2] [--threads 1] [--out F.json]

The reported split of ``dllm bench trees`` (test instances 0..n-1 per default size of the
long-answer tasks, 72 prompts at n = 8), the target ``tiny-ar``, greedy. For each batch size the
prompts go in consecutive batches (ragged: rows end at their own EOS); every method decodes every
batch in turn, ``--passes`` + 1 passes, the first a warm-up: the drafted chain (no tree) and each
``--trees`` spec. Prints tokens per target forward (a forward serves every row of its batch),
tokens/s, and each method's tokens/s relative to the drafted chain and to ``ddtree`` at the same
budget, with a 95% interval from a paired bootstrap over the batches
(``block_head_bench.speed_interval``). Greedy outputs are checked against the chain's (itself tested
equal to ``target.generate``).
"""

import argparse
import json
import time
from collections import defaultdict

import torch

from dllm import tasks as T
from dllm.drafters.base import make_drafter
from dllm.models.targets import load_target
from dllm.drafters.loop import speculative_generate
from dllm.drafters.plan import Plan
from dllm.scoring.exact_match import eval_examples

from block_head_bench import speed_interval  # benchmarks/ is on sys.path when run as a script


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--batch", type=int, nargs="+", default=[1, 8])
    ap.add_argument("--n", type=int, default=8, help="test instances per size")
    ap.add_argument("--dflash", default="tiny-ar-dflash")
    ap.add_argument("--trees", nargs="+", default=["ddtree:budget=16", "taps:budget=16"])
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--passes", type=int, default=2, help="timed passes after the warm-up one")
    ap.add_argument("--out", default=None)
    args = ap.parse_args()
    if args.passes < 1 or min(args.batch) < 1:
        ap.error(f"--passes and --batch must be >= 1, got {args.passes} and {args.batch}")
    torch.set_num_threads(args.threads)
    target, tok = load_target("tiny-ar")
    vocab = tok.get_vocab()
    prompts = [[vocab[w] for w in T.prompt_words(ex)]
               for ex in eval_examples(T.suite_task_names("long-answer"), per_size=args.n)]
    drafter = make_drafter("dflash", model=args.dflash)
    methods = [("chain (no tree)", None)] + [(spec, spec) for spec in args.trees]
    report = {}
    for batch in args.batch:
        batches = [prompts[i:i + batch] for i in range(0, len(prompts), batch)]
        tokens, forwards, walls = defaultdict(int), defaultdict(int), defaultdict(float)
        mismatches = 0
        for rep in range(args.passes + 1):
            for j, rows in enumerate(batches):
                ref = None
                for label, tree in methods:
                    t0 = time.perf_counter()
                    out = speculative_generate(target, drafter, rows, max_new_tokens=66, plan=Plan(tree=tree))
                    wall = time.perf_counter() - t0
                    ref = out.generated if ref is None else ref
                    mismatches += sum(g != r for g, r in zip(out.generated, ref))
                    if rep:
                        tokens[label, j] += sum(len(g) for g in out.generated)
                        forwards[label, j] += out.target_forwards
                        walls[label, j] += wall
        every = range(len(batches))
        rows_out = {}
        print(f"batch {batch}: {len(prompts)} prompts in {len(batches)} batches, greedy, {args.passes} timed "
              f"passes; outputs != the chain's: {mismatches}")
        print("| method | tokens / target forward | tokens/s | vs chain [95%] | vs ddtree [95%] |")
        print("|---|---|---|---|---|")
        for label, tree in methods:
            tok_sum = sum(tokens[label, j] for j in every)
            tps = tok_sum / sum(walls[label, j] for j in every)
            per_forward = tok_sum / sum(forwards[label, j] for j in every)
            cells, row = [], {"tokens_per_forward": per_forward, "tokens_per_second": tps}
            for other in ("chain (no tree)", next((s for s in args.trees if s.startswith("ddtree")), None)):
                if other is None or other == label:
                    cells.append("")
                    continue
                other_tps = sum(tokens[other, j] for j in every) / sum(walls[other, j] for j in every)
                low, high = speed_interval(walls, label, other, len(batches))
                row[f"vs {other}"] = [tps / other_tps, low, high]
                cells.append(f"{tps / other_tps:.3f}x [{low:.3f}, {high:.3f}]")
            rows_out[label] = row
            print(f"| {label} | {per_forward:.2f} | {tps:.0f} | " + " | ".join(cells) + " |")
        report[str(batch)] = {"batches": len(batches), "mismatches": mismatches, "rows": rows_out}
        print()
    if args.out:
        with open(args.out, "w") as f:
            json.dump({"n": args.n, "passes": args.passes, "dflash": args.dflash, "trees": args.trees,
                       "report": report}, f, indent=1)


if __name__ == "__main__":
    main()
