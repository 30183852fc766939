"""Are the drafter's marginals calibrated below a deviation? And does taps' decay help? (README "Draft trees")

    python benchmarks/taps_calibration.py > benchmarks/taps-calibration-2026-12-03.txt

1. Decodes the long-answer suite's held-out split of ``dllm bench spec --trees`` (test instances
   8-15 per size, 72 prompts) with ``ddtree:budget=128`` (greedy, batch 1) and records every
   verified tree: the drafter's log-marginals, the nodes, and the target's arg-max at every node.
   A node is *accepted given its parent* iff its token is the target's arg-max at its parent (the
   tree forward reads the target at every node, so this is known off the accepted path too).
   Prints, per number of deviations above the node (ancestors that are not their parent's
   top-ranked child) and bin of the node's marginal q: nodes, mean q, acceptance.
2. tau (generated tokens / target forwards) on the same split for ddtree and taps variants.
"""
import collections
import math

import torch

import dllm.drafters.trees as tree_mod
import dllm.drafters.trees.verify as verify_mod
from dllm import tasks as T
from dllm.drafters.base import make_drafter
from dllm.drafters.loading import load_target
from dllm.drafters.loop import speculative_generate
from dllm.eval.bench_trees import held_out_examples, parse_args
from dllm.eval.tree_runs import _task_vocab

N = 8  # instances per size in each split, as `dllm bench spec --trees --n 8`
SPECS = ("ddtree", "taps", "taps:gamma=0,decay=0.9", "taps:gamma=0,decay=0.8", "taps:gamma=0,decay=0.7",
         "taps:gamma=0.25,decay=0.8")
BUDGETS = (16, 32, 64, 128)


def prompts():
    vocab = _task_vocab()
    return [([vocab[w] for w in T.prompt_words(ex)], T.answer_length(ex.task, ex.size))
            for ex in held_out_examples(parse_args([]).tasks, N)]


def record(target, drafter, split):
    """[(log_probs [1, K, V], tree, target arg-max [1, 1+N])] of every verified ddtree:128 tree."""
    rounds, last = [], {}
    walk, tree_for = verify_mod.walk_tree, tree_mod.TreeBuilder.tree_for

    def tree_for_rec(self, log_probs):
        last["lp"] = log_probs
        return tree_for(self, log_probs)

    def walk_rec(logits, tree, *args, **kwargs):
        rounds.append((last["lp"], tree, logits.argmax(-1)))
        return walk(logits, tree, *args, **kwargs)

    verify_mod.walk_tree, tree_mod.TreeBuilder.tree_for = walk_rec, tree_for_rec  # read at call time by the loop
    try:
        for p, n in split:
            speculative_generate(target, drafter, [p], max_new_tokens=n, tree="ddtree:budget=128")
    finally:
        verify_mod.walk_tree, tree_mod.TreeBuilder.tree_for = walk, tree_for
    return rounds


def node_rows(rounds):
    """(deviations above, q, accepted given the parent) per verified node."""
    rows = []
    for lp, tree, choice in rounds:
        lp = lp[0]
        rank = lp.argsort(-1, descending=True).argsort(-1)  # [K, V] rank of every token per depth
        devs = {}
        for i, (tok, par, dep, ok) in enumerate(zip(tree.tokens[0].tolist(), tree.parents[0].tolist(),
                                                   tree.depths[0].tolist(), tree.valid[0].tolist())):
            if not ok:
                continue
            above = devs.get(par, 0)
            devs[i] = above + (int(rank[dep - 1, tok]) > 0)
            rows.append((above, math.exp(float(lp[dep - 1, tok])), tok == int(choice[0, par + 1])))
    return rows


def main():
    torch.set_num_threads(1)
    target, _ = load_target("tiny-ar")
    drafter = make_drafter("dflash", model="tiny-ar-dflash")
    split = prompts()
    rows = node_rows(record(target, drafter, split))
    print(f"{len(rows)} verified nodes of ddtree:budget=128, held-out split ({len(split)} prompts)")
    print("| deviations above | q bin | nodes | mean q | accepted |\n|---|---|---|---|---|")
    table = collections.defaultdict(lambda: [0, 0.0, 0])
    for above, q, acc in rows:
        cell = table[(min(above, 2), min(int(q * 5), 4) / 5)]
        cell[0] += 1
        cell[1] += q
        cell[2] += acc
    for (above, q_bin), (n, sq, acc) in sorted(table.items()):
        print(f"| {above}{'+' if above == 2 else ''} | >= {q_bin:.1f} | {n} | {sq / n:.3f} | {acc / n:.3f} |")
    print("\n| tree | budget | tau | target forwards |\n|---|---|---|---|")
    for budget in BUDGETS:
        for spec in SPECS:
            full = f"{spec}{',' if ':' in spec else ':'}budget={budget}"
            toks = fw = 0
            for p, n in split:
                out = speculative_generate(target, drafter, [p], max_new_tokens=n, tree=full)
                toks, fw = toks + len(out.generated[0]), fw + out.target_forwards
            print(f"| {spec} | {budget} | {toks / fw:.3f} | {fw} |", flush=True)


if __name__ == "__main__":
    main()
