"""Per-request block size, end to end: the block head (``plan="auto"``) against fixed sizes.

    python benchmarks/block_head_bench.py [--n 8] [--threads 1] [--out benchmarks/block-head-DATE.json]

Greedy, batch 1, the target ``tiny-ar``; test instances 0..n-1 per default size of the long-answer
tasks (the reported split of ``dllm bench trees``; the head was trained on mixture prompts and
evaluated on instances 8-15). Every method decodes every prompt in turn, ``--passes`` + 1 passes, the
first a warm-up: ``target.generate``; the shipped 16-token drafter ``tiny-ar-dflash`` at 16 and with
``ddtree:budget=16`` (its tree setting chosen on held-out prompts by ``dllm bench trees``);
``tiny-ar-dflash-wide`` under each fixed plan of its head (a block size, with or without a tree);
the same drafter with ``plan="auto"``.
Prints tau (tokens per target forward, prefill included), tokens/s and the speed-up over
``target.generate`` per method and per task, the sizes the head picked per task, and the bound of
any per-request rule (each prompt at the fixed plan that was fastest for it, with hindsight), and
95% intervals of auto's speed ratio against the best fixed plan and the 16-token drafter's two
settings (a paired bootstrap over the prompts: it covers how the prompts vary, not a change in
the machine's speed between runs).
Every greedy output is checked against ``target.generate``.
"""

import argparse
import json
import random
import time
from collections import defaultdict

import torch

from dllm import tasks as T
from dllm.drafters.base import make_drafter
from dllm.models.targets import load_target
from dllm.drafters.loop import speculative_generate
from dllm.drafters.plan import Plan
from dllm.scoring.exact_match import eval_examples
from dllm.train.drafters.block_head_train import plan_label


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--n", type=int, default=8, help="test instances per size")
    ap.add_argument("--skip", type=int, default=0, help="first test instance per size (0: the reported split)")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--passes", type=int, default=2, help="timed passes after the warm-up one")
    ap.add_argument("--out", default=None)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    target, tok = load_target("tiny-ar")
    vocab = tok.get_vocab()
    prompts = [(ex.task, [vocab[w] for w in T.prompt_words(ex)])
               for ex in eval_examples(T.suite_task_names("long-answer"), per_size=args.n, skip=args.skip)]
    wide = make_drafter("dflash", model="tiny-ar-dflash-wide")
    d16 = make_drafter("dflash", model="tiny-ar-dflash")
    methods = [("target.generate", None, None, None), ("tiny-ar-dflash, block 16", d16, 16, None),
               ("tiny-ar-dflash, ddtree:16", d16, 16, "ddtree:budget=16")]
    plans = [(f"wide, {b}" + ("" if t is None else "/" + t.replace("budget=", "")), b, t)
             for b, t in wide.block_head.plans]
    methods += [(label, wide, b, t) for label, b, t in plans] + [("wide, auto", wide, "auto", None)]
    stats = defaultdict(lambda: [0, 0, 0.0])  # (method, prompt) -> tokens, target forwards, seconds
    picks: dict[int, str] = {}
    mismatches = 0
    for rep in range(args.passes + 1):
        for j, (_, p) in enumerate(prompts):
            ref = None
            for label, drafter, block, tree in methods:
                t0 = time.perf_counter()
                if drafter is None:
                    out_ids = target.generate(torch.tensor([p]), max_new_tokens=66, do_sample=False)[0, len(p):]
                    wall = time.perf_counter() - t0
                    ref = out_ids.tolist()
                    if tok.eos_token_id in ref:
                        ref = ref[:ref.index(tok.eos_token_id) + 1]
                    gen, fwd = ref, len(ref)
                else:
                    plan = "auto" if block == "auto" else Plan(block_size=block, tree=tree)
                    r = speculative_generate(target, drafter, [p], max_new_tokens=66, plan=plan)
                    wall = time.perf_counter() - t0
                    gen, fwd = r.generated[0], r.target_forwards
                    mismatches += gen != ref
                    if block == "auto":
                        picks[j] = plan_label((r.row_block_sizes[0], r.row_trees[0]))
                if rep:
                    s = stats[label, j]
                    s[0] += len(gen)
                    s[1] += fwd
                    s[2] += wall
    tasks = sorted({t for t, _ in prompts})

    def agg(label, js):
        tokens, fwd, wall = (sum(stats[label, j][k] for j in js) for k in range(3))
        return tokens / fwd, tokens / wall

    every = range(len(prompts))
    base = agg("target.generate", every)[1]
    rows = {}
    print(f"{len(prompts)} prompts, batch 1, greedy, {args.passes} timed passes; outputs != target.generate: "
          f"{mismatches}")
    print(f"{'method':34s}{'tau':>7}{'tokens/s':>10}{'speed-up':>10}  " + "  ".join(f"{t:>16s}" for t in tasks))
    for label, *_ in methods:
        tau, tps = agg(label, every)
        per = [agg(label, [j for j, (t, _) in enumerate(prompts) if t == task]) for task in tasks]
        rows[label] = {"tau": tau, "tokens_per_second": tps, "speedup": tps / base,
                       "per_task": {t: {"tau": a, "tokens_per_second": b} for t, (a, b) in zip(tasks, per)}}
        print(f"{label:34s}{tau:7.2f}{tps:10.0f}{tps / base:9.2f}x  " +
              "  ".join(f"{a:6.2f} {b / base:6.2f}x  " for a, b in per))
    fixed = [label for label, _, _ in plans]
    best_fixed = max(fixed, key=lambda m: rows[m]["tokens_per_second"])
    hind_tokens = sum(max((stats[m, j] for m in fixed), key=lambda s: s[0] / s[2])[0] for j in every)
    hind_wall = sum(max((stats[m, j] for m in fixed), key=lambda s: s[0] / s[2])[2] for j in every)
    by_task = {t: sorted({picks[j] for j, (tt, _) in enumerate(prompts) if tt == t}) for t in tasks}
    auto = rows["wide, auto"]["tokens_per_second"]
    print(f"head picks per task: {by_task}")
    print(f"auto / best fixed plan ({best_fixed}): {auto / rows[best_fixed]['tokens_per_second']:.3f}x; "
          f"per-prompt hindsight bound: {hind_tokens / hind_wall / rows[best_fixed]['tokens_per_second']:.3f}x; "
          f"auto / tiny-ar-dflash at 16: {auto / rows['tiny-ar-dflash, block 16']['tokens_per_second']:.3f}x")
    intervals = {}
    for other in dict.fromkeys((best_fixed, "tiny-ar-dflash, block 16", "tiny-ar-dflash, ddtree:16")):
        low, high = speed_interval({k: v[2] for k, v in stats.items()}, "wide, auto", other, len(prompts))
        intervals[other] = [low, high]
        print(f"auto / {other}: 95% interval over the prompts (paired bootstrap, 2,000 draws) [{low:.3f}, {high:.3f}]")
    if args.out:
        with open(args.out, "w") as f:
            json.dump({"n": args.n, "skip": args.skip, "passes": args.passes, "prompts": len(prompts), "mismatches": mismatches,
                       "rows": rows, "picks_per_task": by_task, "best_fixed": best_fixed,
                       "auto_speed_ratio_intervals": intervals}, f, indent=1)


def speed_interval(walls, a: str, b: str, n: int, draws: int = 2000) -> tuple[float, float]:
    """2.5 / 97.5% points of (tokens/s of a) / (tokens/s of b) over bootstrap draws of the prompts
    (or batches) 0..n-1, the same draw for both; ``walls[label, j]`` are seconds (same tokens under
    both methods at T = 0, so the ratio of summed walls)."""
    rng = random.Random(0)
    ratios = []
    for _ in range(draws):
        idx = [rng.randrange(n) for _ in range(n)]
        ratios.append(sum(walls[b, j] for j in idx) / sum(walls[a, j] for j in idx))
    ratios.sort()
    return ratios[round(0.025 * (draws - 1))], ratios[round(0.975 * (draws - 1))]


if __name__ == "__main__":
    main()
