"""A path-conditioned estimator from alignment shifts, for the taps builder, against ddtree
(README "Draft trees"; 2026-12-02). Negative result: not shipped.

    python benchmarks/taps_alignment.py > benchmarks/taps-alignment-2026-12-02.txt

Where tiny-ar-dflash's top-1 draft is first wrong (held-out anchors), the error is a substitution
(the next two top-1 drafts right again) in 124 of 238 cases, but in 55 an *insertion*: the target
puts a new token at depth j and then continues with the drafter's depth-j top-1, i.e. the
drafter's later marginals apply one depth late. A path-conditioned estimate from the marginals
alone: a left-to-right HMM over the shift s in {0, -1 (insertion), +1 (deletion)}, state 0 -> -1
with probability e_ins and 0 -> +1 with e_del at every depth (shifted states absorbing), emitting
the path's token at depth d from q_{d+s}. P(node) = the HMM's forward probability of its path;
children's candidates = the top-8 tokens of q_{d-1}, q_d, q_{d+1}, ranked by the mixture. Still
a product of factors <= 1 along the path with siblings in score order, so best-first is exact.
Teacher-forced as in benchmarks/taps_tuning.py: tau = 1 + the tree's nodes on the target's path,
mean over every answer position (held-out = test instances 2-3 per size, reported = 0-1).
"""
import heapq
import math
import time

import numpy as np
import torch

from dllm.drafters.trees import Tree, best_first_tree
from teacher_forced import anchors_lp, split, tau as tree_tau

SHIFTS = (0, -1, 1)


def first_errors(lp: torch.Tensor, truth: torch.Tensor) -> dict:
    """Kinds of the drafter's first top-1 error per anchor (those with 2 more target tokens after it)."""
    top = lp.argmax(-1)  # [A, K]
    wrong = (top != truth) & (truth >= 0)
    k = lp.shape[1]
    kinds: dict = {}
    for a in range(lp.shape[0]):
        if not wrong[a].any():
            continue
        j = int(wrong[a].float().argmax())
        if j >= k - 2 or truth[a, j + 2] < 0:
            continue
        if bool((top[a, j + 1:j + 3] == truth[a, j + 1:j + 3]).all()):
            kind = "substitution"
        elif int(truth[a, j]) == int(top[a, j + 1]) and int(truth[a, j + 1]) == int(top[a, j + 2]):
            kind = "deletion"
        elif int(truth[a, j + 1]) == int(top[a, j]):
            kind = "insertion"
        else:
            kind = "other"
        kinds[kind] = kinds.get(kind, 0) + 1
    return kinds


def hmm_tree(lp: torch.Tensor, budget: int, e_ins: float, e_del: float, width: int = 8) -> Tree:
    r_all, k, v = lp.shape
    width = min(v, width)
    topi = torch.topk(lp.float(), width, -1).indices  # [R, K, W]
    trans = [math.log(1 - e_ins - e_del), math.log(e_ins) if e_ins else -math.inf,
             math.log(e_del) if e_del else -math.inf]  # log P(0 -> 0 / -1 / +1)
    toks = torch.zeros(r_all, budget, dtype=torch.long)
    par = torch.full((r_all, budget), -1)
    dep = torch.zeros(r_all, budget, dtype=torch.long)
    for r in range(r_all):
        per = {}
        for d in range(1, k + 1):  # candidates and their emissions under each shift, per depth
            idx = torch.tensor(sorted({t for s in SHIFTS if 1 <= d + s <= k for t in topi[r, d + s - 1].tolist()}))
            em = torch.stack([lp[r, d + s - 1, idx] if 1 <= d + s <= k else torch.full((len(idx),), -math.inf)
                              for s in SHIFTS])  # [3, C]
            per[d] = (idx.numpy(), em.double().numpy())

        def children(d: int, alpha: np.ndarray) -> list:
            pre = np.array([alpha[0] + trans[0], np.logaddexp(alpha[0] + trans[1], alpha[1]),
                            np.logaddexp(alpha[0] + trans[2], alpha[2])])
            idx, em = per[d]
            a = pre[:, None] + em  # [3, C]
            m = a.max(0)
            tot = m + np.log(np.exp(a - np.where(np.isfinite(m), m, 0)).sum(0))
            return [(float(tot[o]), int(idx[o]), a[:, o]) for o in np.argsort(-tot, kind="stable")[:width]]

        first = children(1, np.array([0.0, -np.inf, -np.inf]))
        lists = [first]
        heap, order, n = [(-first[0][0], 0, 1, 0, -1, 0)], 1, 0
        while heap and n < budget:
            _, _, d, rank, parent, li = heapq.heappop(heap)
            cl = lists[li]
            toks[r, n], par[r, n], dep[r, n] = cl[rank][1], parent, d
            if rank + 1 < len(cl):
                heapq.heappush(heap, (-cl[rank + 1][0], order, d, rank + 1, parent, li))
                order += 1
            if d < k:
                lists.append(children(d + 1, cl[rank][2]))
                heapq.heappush(heap, (-lists[-1][0][0], order, d + 1, 0, n, len(lists) - 1))
                order += 1
            n += 1
    return Tree(tokens=toks, parents=par, depths=dep, valid=dep > 0)


held, rep = anchors_lp(*split(2, 4)), anchors_lp(*split(0, 2))
print("first top-1 errors (held-out):", first_errors(*held))
grid = [(0.0, 0.0), (0.01, 0.0), (0.03, 0.0), (0.03, 0.01)]
for name, (lp, truth) in (("held-out", held), ("reported", rep)):
    for budget in (16, 32, 64, 128):
        t0 = time.time()
        cells = [f"ddtree {tree_tau(best_first_tree(lp, budget), truth):.3f}"]
        cells += [f"({ei},{ed}) {tree_tau(hmm_tree(lp, budget, ei, ed), truth):.3f}" for ei, ed in grid]
        print(name, budget, " | ".join(cells), f"{time.time() - t0:.0f}s", flush=True)
