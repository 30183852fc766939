"""The budget rule and shorter blocks on the tiny pair (README "Draft trees"; 2026-12-01).

    python benchmarks/tree_rules.py

Greedy, batch 1, 1 thread, the reported split of ``dllm bench trees`` (test instances 0-1
per default size of the long-answer suite, 18 prompts); every configuration runs on each prompt in
turn, 3 passes, the first one a warm-up. Prints tau and tokens/s per configuration.
"""

import time

import torch

from dllm import tasks as T
from dllm.drafters.base import make_drafter
from dllm.models.targets import load_target
from dllm.drafters.loop import speculative_generate
from dllm.drafters.plan import Plan

CONFIGS = [  # (tree spec, block size)
    (None, 16), ("ddtree:budget=32", 16), ("ddtree:budget=128", 16),
    ("ddtree:budget=128,cost_per_node=0.012", 16), ("ddtree:budget=128,cost_per_node=0.006", 16),
    ("taps:budget=128,cost_per_node=0.012", 16), (None, 4), (None, 8), (None, 12),
]


def main(argv=None) -> None:
    import argparse

    argparse.ArgumentParser(description=__doc__.split("\n\n")[0]).parse_args(argv)  # --help; no options
    torch.set_num_threads(1)
    target, tok = load_target("tiny-ar")
    drafter = make_drafter("dflash", model="tiny-ar-dflash")
    vocab = tok.get_vocab()
    exs = [ex for n in T.suite_task_names("long-answer") for s in T.get_task(n).default_sizes
           for ex in T.test_split(n, s, n=2)]
    prompts = [[vocab[w] for w in T.prompt_words(ex)] for ex in exs]
    totals = {c: [0, 0, 0.0] for c in CONFIGS}
    for rep in range(3):
        for p in prompts:
            for tree, block in CONFIGS:
                t0 = time.perf_counter()
                out = speculative_generate(target, drafter, [p], max_new_tokens=66, tokenizer=tok,
                                           plan=Plan(block_size=block, tree=tree))
                wall = time.perf_counter() - t0
                if rep:
                    t = totals[(tree, block)]
                    t[0] += len(out.generated[0])
                    t[1] += out.target_forwards
                    t[2] += wall
    for (tree, block), (tokens, forwards, wall) in totals.items():
        print(f"{tree or 'no tree'} block {block}: tau {tokens / forwards:.3f}, {tokens / wall:.1f} tokens/s")


if __name__ == "__main__":
    main()
