"""A path-conditioned second drafter pass as the acceptance estimate beyond the marginals (issue:
draft trees; 2026-12-01). Teacher-forced, as benchmarks/taps_estimators.py.

    python benchmarks/taps_second_pass.py [DRAFTER]      # default tiny-ar-dflash

Pass 1 is the usual DFlash block [x_p, MASK x 15] (positions p..p+15, target features < p). Pass 2
fills the block's second slot with pass 1's top-1 token d1: [x_p, d1, MASK x 14], same positions
and context, so its distributions at depths >= 2 are conditioned on the first draft (the drafter
never saw a filled slot past the anchor in training). Tree: depth-1 candidates from pass 1; below
d1 the children come from pass 2 (tokens and probabilities), below the other depth-1 candidates from
pass 1, best-first on the product of probabilities (DDTree's rule). Prints, per split, the top-1
hit rate per depth of both passes where d1 is right, and tau of ddtree vs the two-pass tree at
budgets 16 / 32 / 64 (a decoder would pay one more drafter forward per round).
"""
import heapq
import sys

import torch

import teacher_forced
from dllm.drafters.base import make_drafter
from dllm.drafters.trees import Tree, best_first_tree
from teacher_forced import split, tau

# another DFlash checkpoint of tiny-ar as the argument (e.g. one trained with filled slots)
drafter = teacher_forced.drafter if len(sys.argv) < 2 else make_drafter("dflash", model=sys.argv[1]).model
K = drafter.block_size - 1


def two_passes(prompts, rows):
    """(pass-1 log-probs [A, K, V], pass-2 log-probs [A, K, V] (depth 1 copied from pass 1), truth [A, K])."""
    out1, out2, truth = [], [], []
    for p, r in zip(prompts, rows):
        a = teacher_forced.Anchored(p, r, drafter)
        bids = a.blocks()
        lp1 = a.log_probs(bids)
        bids[:, 1::a.b] = lp1[:, 0].argmax(-1)[None]  # d1 in the block's second slot
        lp2 = a.log_probs(bids)
        lp2[:, 0] = lp1[:, 0]
        out1.append(lp1)
        out2.append(lp2)
        truth.append(a.truth())
    return torch.cat(out1), torch.cat(out2), torch.cat(truth)


def two_pass_tree(lp1, lp2, budget: int, width: int = 8) -> Tree:
    """Best-first tree; the subtree under depth-1 rank 0 draws from lp2, every other from lp1."""
    depth_cap = min(K, budget)
    tops = [torch.topk(lp[:, :depth_cap], width, -1) for lp in (lp1, lp2)]
    vals = [t.values.tolist() for t in tops]
    toks = [t.indices.tolist() for t in tops]
    R = lp1.shape[0]
    tokens = torch.zeros(R, budget, dtype=torch.long)
    parents = torch.full((R, budget), -1)
    depths = torch.zeros(R, budget, dtype=torch.long)
    for r in range(R):
        # (neg score, order, depth, rank, parent node, parent score, source)
        heap = [(-vals[0][r][0][0], 0, 1, 0, -1, 0.0, 0)]
        order, n = 1, 0
        while heap and n < budget:
            neg, _, dep, rk, par, ps, src = heapq.heappop(heap)
            tokens[r, n], parents[r, n], depths[r, n] = toks[src][r][dep - 1][rk], par, dep
            if rk + 1 < width:  # next sibling
                heapq.heappush(heap, (-(ps + vals[src][r][dep - 1][rk + 1]), order, dep, rk + 1, par, ps, src))
                order += 1
            if dep < depth_cap:  # first child
                child_src = 1 if (dep == 1 and rk == 0) else src
                heapq.heappush(heap, (-(-neg + vals[child_src][r][dep][0]), order, dep + 1, 0, n, -neg, child_src))
                order += 1
            n += 1
    valid = depths > 0
    return Tree(tokens=tokens, parents=parents, depths=depths, valid=valid)


def main() -> None:
    for name, (lo, hi) in (("held", (2, 4)), ("rep", (0, 2))):
        lp1, lp2, truth = two_passes(*split(lo, hi))
        ok = lp1[:, 0].argmax(-1) == truth[:, 0]  # d1 right
        hits1 = ((lp1.argmax(-1) == truth) & (truth >= 0))[ok].float().mean(0)
        hits2 = ((lp2.argmax(-1) == truth) & (truth >= 0))[ok].float().mean(0)
        print(f"{name}: {lp1.shape[0]} anchors, d1 right at {ok.float().mean():.3f}")
        print("  top-1 hit per depth where d1 is right, pass 1:", [round(x, 3) for x in hits1[:8].tolist()])
        print("  top-1 hit per depth where d1 is right, pass 2:", [round(x, 3) for x in hits2[:8].tolist()])
        for budget in (16, 32, 64):
            a = tau(best_first_tree(lp1, budget), truth)
            b = tau(two_pass_tree(lp1, lp2, budget), truth)
            print(f"  budget {budget}: ddtree tau {a:.3f}, two-pass tau {b:.3f} ({b / a:.3f}x)")


if __name__ == "__main__":
    main()
