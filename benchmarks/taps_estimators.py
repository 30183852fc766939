"""Two more acceptance estimators for the taps builder, against ddtree (README "Draft trees"; 2026-12-01).

    python benchmarks/taps_estimators.py > benchmarks/taps-estimators-2026-12-01.txt

Teacher-forced as in benchmarks/taps_tuning.py: every answer position of tiny-ar's own greedy
outputs is an anchor, tiny-ar-dflash's block marginals there build a tree, the tree's tau there is
1 + its nodes on the target's path. Splits: "fit" = 96 prompts drawn from the drafter recipe's
training mixture (seed 123), "held" = long-answer test instances 2-3, "rep" = instances 0-1.

1. calib: a(y | path) = P(target token = y | depth, deviations above (0, 1, 2+), bin of log q(y)),
   a table counted on "fit" (prior: q itself, 2 pseudo-counts), made monotone in q; best-first.
2. lambda: log P(child) = lam * (log P(parent) + log q) + (1 - lam) * min(log P(parent), log q);
   lam = 1 is ddtree's product, lam = 0 treats the drafter's errors as fully correlated.
"""
import heapq
import time

import torch

from dllm.drafters.trees import Tree, best_first_tree
from dllm.train.data import TaskMixture
from dllm.train.dflash_train import dflash_recipes
from teacher_forced import anchors_lp, encode, split, tau as tau_tree, tok


def train_split(n):
    """n prompts of the drafter recipe's training mixture (seed 123), encoded."""
    mix = TaskMixture(dflash_recipes.get("tiny-ar-dflash").mixture, seed=123, tokenizer=tok)
    rng = mix.rng(-1)
    return encode([mix.sample(rng) for _ in range(n)])


t0 = time.time()
fit = anchors_lp(*train_split(96))
held = anchors_lp(*split(2, 4)); rep = anchors_lp(*split(0, 2))
print("anchors fit", fit[0].shape[0], "held", held[0].shape[0], "rep", rep[0].shape[0], round(time.time()-t0,1),"s")
d = {"fit": fit, "held": held, "rep": rep}
W = 16; NB = 24; MCAP = 2
def feats(lp, truth):
    top = torch.topk(lp, W, -1)  # [A,K,W]
    valid = truth >= 0
    lab = (top.indices == truth[..., None])  # [A,K,W]
    rank = torch.where(lab.any(-1), lab.float().argmax(-1), torch.full_like(truth, W))  # [A,K]
    dev = (rank > 0).long()
    m = torch.cumsum(dev, 1) - dev  # deviations strictly above
    return top, lab, m.clamp(max=MCAP), valid
def qbin(v):  # log prob -> bin
    return ((-v).clamp(max=11.99) * NB / 12).long()
def fit_table(lp, truth, prior=2.0):
    top, lab, m, valid = feats(lp, truth)
    A, K, _ = lab.shape
    hits = torch.zeros(K, MCAP + 1, NB); cnt = torch.zeros(K, MCAP + 1, NB); qsum = torch.zeros(K, MCAP+1, NB)
    b = qbin(top.values)
    dd = torch.arange(K)[None, :, None].expand(A, K, W)
    mm = m[..., None].expand(A, K, W)
    vv = valid[..., None].expand(A, K, W)
    idx = (dd * (MCAP + 1) + mm) * NB + b
    idx, l, q = idx[vv], lab[vv].float(), top.values[vv].exp()
    hits.view(-1).index_add_(0, idx, l); cnt.view(-1).index_add_(0, idx, torch.ones_like(l)); qsum.view(-1).index_add_(0, idx, q)
    qmean = torch.where(cnt > 0, qsum / cnt.clamp(min=1), (-(torch.arange(NB) + 0.5) * 12 / NB).exp().expand(K, MCAP+1, NB))
    p = (hits + prior * qmean) / (cnt + prior)
    # monotone in q: bin 0 = highest q; enforce nonincreasing along bins
    p = torch.flip(torch.cummax(torch.flip(p, [-1]), -1).values, [-1])
    return p.clamp(1e-6, 1.0).log()
def scored_tree(lp, budget, width, score, child_state, root_state=0):
    """Best-first prefix-closed tree: score(r, parent_score, depth, rank, state) is a node's log
    estimate given its parent's; child_state(state, rank) carries path information to the children."""
    R, K, V = lp.shape
    depth_cap = min(K, budget)
    top = torch.topk(lp[:, :depth_cap], width, -1)
    depth = [[0]*budget for _ in range(R)]; rank = [[0]*budget for _ in range(R)]; par = [[-1]*budget for _ in range(R)]
    for r in range(R):
        heap = [(-score(r, 0.0, 1, 0, root_state), 0, 1, 0, -1, 0.0, root_state)]; order = 1; n = 0
        while heap and n < budget:
            neg, _, dep, rk, p, ps, st = heapq.heappop(heap)
            depth[r][n], rank[r][n], par[r][n] = dep, rk, p
            if rk + 1 < width:
                heapq.heappush(heap, (-score(r, ps, dep, rk + 1, st), order, dep, rk + 1, p, ps, st)); order += 1
            if dep < depth_cap:
                cs = child_state(st, rk)
                heapq.heappush(heap, (-score(r, -neg, dep + 1, 0, cs), order, dep + 1, 0, n, -neg, cs)); order += 1
            n += 1
    depths = torch.tensor(depth); ranks = torch.tensor(rank); parents = torch.tensor(par)
    valid = depths > 0
    tokens = top.indices.reshape(R, -1).gather(1, (depths-1).clamp(min=0) * width + ranks)
    return Tree(tokens=torch.where(valid, tokens, 0), parents=parents, depths=depths, valid=valid)


def calib_tree(lp, table, budget):
    width = min(lp.shape[2], budget, W)
    bl = qbin(torch.topk(lp[:, :min(lp.shape[1], budget)], width, -1).values).tolist()  # [R, D, W] bins
    tab = table.tolist()
    return scored_tree(lp, budget, width, lambda r, ps, dep, rk, mdev: ps + tab[dep-1][min(mdev, MCAP)][bl[r][dep-1][rk]],
                       lambda mdev, rk: mdev + (rk > 0))


table = fit_table(*d["fit"])
for name in ("held", "rep"):
    lp, truth = d[name]
    for budget in (8, 16, 32, 64, 128):
        dd_ = tau_tree(best_first_tree(lp, budget), truth)
        tp = tau_tree(best_first_tree(lp, budget, gamma=0.25), truth)
        cb = tau_tree(calib_tree(lp, table, budget), truth)
        print("calib", name, budget, "ddtree", round(dd_, 3), "taps", round(tp, 3), "calib", round(cb, 3), f"{cb/dd_:.4f}")
def tree_lam(lp, budget, lam):
    width = min(lp.shape[2], budget)
    val = torch.topk(lp[:, :min(lp.shape[1], budget)], width, -1).values.tolist()
    comb = lambda ps, q: lam * (ps + q) + (1 - lam) * min(ps, q)
    return scored_tree(lp, budget, width, lambda r, ps, dep, rk, st: comb(ps, val[r][dep-1][rk]), lambda st, rk: st)


for name in ("fit", "held", "rep"):
    lp, truth = d[name]
    for budget in (16, 32, 64):
        row = [round(tau_tree(tree_lam(lp, budget, lam), truth), 3) for lam in (1.0, 0.75, 0.5, 0.25, 0.0)]
        print("lambda 1/.75/.5/.25/0", name, budget, row, f"best/ddtree {max(row)/row[0]:.4f}")
