"""Re-weighting the drafter marginals for the taps builder, tuned on held-out data (README "Draft trees"; 2026-12-01).

    python benchmarks/taps_tuning.py

Teacher-forced: every answer position of the target's own greedy outputs is an anchor (held-out =
test instances 2-3 per default size of the long-answer suite, reported = 0-1), the tiny-ar-dflash
drafter's block marginals at that anchor build a tree, and the tree's expected tau there is 1 +
its nodes on the target's path. Prints DDTree's tau and the best held-out taps setting (gamma,
decay), then the best per-depth prior rho / power beta on the marginals, on both splits.
"""
import math

from dllm.drafters.trees import best_first_tree, make_tree_builder
from teacher_forced import anchors_lp, split, tau as tree_tau

def tau(lp, truth, spec):
    return tree_tau(make_tree_builder(spec).build(lp), truth)


held = anchors_lp(*split(2, 4)); rep = anchors_lp(*split(0, 2))
print("anchors", held[0].shape[0], rep[0].shape[0])
for budget in (16, 32, 64):
    base_h, base_r = tau(*held, f"ddtree:budget={budget}"), tau(*rep, f"ddtree:budget={budget}")
    best = max(((tau(*held, f"taps:budget={budget},gamma={g},decay={d}"), g, d) for g in (0, 0.1, 0.25, 0.5, 1.0) for d in (1.0, 0.8, 0.6, 0.4)))
    print(budget, "ddtree held", round(base_h, 3), "rep", round(base_r, 3), "| best taps held", round(best[0], 3), best[1:], "rep", round(tau(*rep, f"taps:budget={budget},gamma={best[1]},decay={best[2]}"), 3))
def tau_lp(lp_build, truth, budget):
    return tree_tau(best_first_tree(lp_build, budget), truth)
for budget in (16, 32, 64):
    rows = []
    for rho in (0.5, 0.7, 0.85, 1.0, 1.2, 1.5, 2.0):
        for beta in (0.5, 1.0, 2.0):
            f = lambda lp: (lp * beta + math.log(rho)).clamp(max=0)
            rows.append((tau_lp(f(held[0]), held[1], budget), rho, beta, tau_lp(f(rep[0]), rep[1], budget)))
    rows.sort(reverse=True)
    print(budget, [tuple(round(x, 3) for x in r) for r in rows[:3]], "baseline", [tuple(round(x,3) for x in r) for r in rows if r[1]==1.0 and r[2]==1.0])
