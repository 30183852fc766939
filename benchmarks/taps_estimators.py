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
import torch.nn.functional as F

from dllm import tasks as T
from dllm.drafters.base import make_drafter
from dllm.drafters.dflash_model import extract_context_feature, target_embedding, target_head
from dllm.drafters.loading import load_target
from dllm.drafters.tree import Tree, ancestor_mask, best_first_tree
from dllm.train.data import TaskMixture
from dllm.train.dflash_train import block_layout, dflash_recipes, regenerate

torch.set_num_threads(1)
target, tok = load_target("tiny-ar")
drafter = make_drafter("dflash", model="tiny-ar-dflash").model
vocab = tok.get_vocab()
def split(lo, hi):
    exs = [ex for n in T.suite_task_names("long-answer") for s in T.get_task(n).default_sizes for ex in T.test_split(n, s, n=hi)[lo:]]
    prompts = [[vocab[w] for w in T.prompt_words(ex)] for ex in exs]
    return prompts, regenerate(target, prompts, 66)
def train_split(n):
    rec = dflash_recipes.get("tiny-ar-dflash")
    rec = getattr(rec, "obj", rec)
    mix = TaskMixture(rec.mixture, seed=123, tokenizer=tok)
    rng = mix.rng(-1)
    exs = [mix.sample(rng) for _ in range(n)]
    prompts = [[vocab[w] for w in T.prompt_words(ex)] for ex in exs]
    return prompts, regenerate(target, prompts, 66)
@torch.no_grad()
def anchors_lp(prompts, rows):
    out_lp, out_truth = [], []
    B = drafter.block_size
    for p, r in zip(prompts, rows):
        ids = torch.tensor([r]); n = len(r)
        anchors = torch.arange(len(p), n - 1)[None]
        o = target(input_ids=ids, output_hidden_states=True)
        feats = extract_context_feature(o.hidden_states, drafter.target_layer_ids)
        pos, mask = block_layout(anchors, n, B)
        bids = torch.full_like(pos, drafter.mask_token_id); bids[:, ::B] = ids.gather(1, anchors)
        h = drafter(F.embedding(bids, target_embedding(target)), feats, feature_positions=torch.arange(n)[None], block_positions=pos, attn_mask=mask)
        a = anchors.shape[1]
        h = h.reshape(1, a, B, -1)[:, :, 1:]
        lg = drafter.compute_logits(h, target_head(target)).float()[0]
        out_lp.append(torch.log_softmax(lg, -1))
        lab = anchors[0][:, None] + torch.arange(1, B)
        truth = torch.where(lab < n, ids[0, lab.clamp(max=n - 1)], torch.full_like(lab, -1))
        out_truth.append(truth)
    return torch.cat(out_lp), torch.cat(out_truth)
t0=time.time()
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
def calib_tree(lp, table, budget):
    R, K, V = lp.shape
    depth_cap, width = min(K, budget), min(V, budget, W)
    top = torch.topk(lp[:, :depth_cap], width, -1)
    b = qbin(top.values)  # [R,D,W]
    bl = b.tolist(); tab = table.tolist()
    depth = [[0]*budget for _ in range(R)]; rank = [[0]*budget for _ in range(R)]; par = [[-1]*budget for _ in range(R)]
    for r in range(R):
        def s(dep, rk, mdev):
            return tab[dep-1][min(mdev, MCAP)][bl[r][dep-1][rk]]
        heap = [(-s(1, 0, 0), 0, 1, 0, -1, 0.0, 0)]; order = 1; n = 0
        while heap and n < budget:
            neg, _, dep, rk, p, ps, mdev = heapq.heappop(heap)
            depth[r][n], rank[r][n], par[r][n] = dep, rk, p
            if rk + 1 < width:
                heapq.heappush(heap, (-(ps + s(dep, rk+1, mdev)), order, dep, rk+1, p, ps, mdev)); order += 1
            if dep < depth_cap:
                cm = mdev + (rk > 0)
                heapq.heappush(heap, (-(-neg + s(dep+1, 0, cm)), order, dep+1, 0, n, -neg, cm)); order += 1
            n += 1
    depths = torch.tensor(depth); ranks = torch.tensor(rank); parents = torch.tensor(par)
    valid = depths > 0
    tokens = top.indices.reshape(R, -1).gather(1, (depths-1).clamp(min=0) * width + ranks)
    return Tree(tokens=torch.where(valid, tokens, 0), parents=parents, depths=depths, valid=valid)
def tau_tree(tree, truth):
    tr = truth.gather(1, (tree.depths - 1).clamp(min=0))
    match = (tree.tokens == tr) & tree.valid
    on = ~(ancestor_mask(tree) & ~match[:, None, :]).any(-1) & tree.valid
    return 1 + on.float().sum(1).mean().item()
table = fit_table(*d["fit"])
for name in ("held", "rep"):
    lp, truth = d[name]
    for budget in (8, 16, 32, 64, 128):
        dd_ = tau_tree(best_first_tree(lp, budget), truth)
        tp = tau_tree(best_first_tree(lp, budget, gamma=0.25), truth)
        cb = tau_tree(calib_tree(lp, table, budget), truth)
        print("calib", name, budget, "ddtree", round(dd_, 3), "taps", round(tp, 3), "calib", round(cb, 3), f"{cb/dd_:.4f}")
def tree_lam(lp, budget, lam):
    R, K, V = lp.shape
    dc, w = min(K, budget), min(V, budget)
    top = torch.topk(lp[:, :dc], w, -1); val = top.values.tolist()
    depth = [[0]*budget for _ in range(R)]; rank = [[0]*budget for _ in range(R)]; par = [[-1]*budget for _ in range(R)]
    comb = lambda ps, q: lam * (ps + q) + (1 - lam) * min(ps, q)
    for r in range(R):
        lp_ = val[r]
        heap = [(-lp_[0][0], 0, 1, 0, -1, 0.0)]; order = 1; n = 0
        while heap and n < budget:
            neg, _, dep, rk, p, ps = heapq.heappop(heap)
            depth[r][n], rank[r][n], par[r][n] = dep, rk, p
            if rk + 1 < w:
                heapq.heappush(heap, (-comb(ps, lp_[dep-1][rk+1]), order, dep, rk+1, p, ps)); order += 1
            if dep < dc:
                heapq.heappush(heap, (-comb(-neg, lp_[dep][0]), order, dep+1, 0, n, -neg)); order += 1
            n += 1
    depths = torch.tensor(depth); ranks = torch.tensor(rank); parents = torch.tensor(par); valid = depths > 0
    tokens = top.indices.reshape(R, -1).gather(1, (depths-1).clamp(min=0) * w + ranks)
    return Tree(tokens=torch.where(valid, tokens, 0), parents=parents, depths=depths, valid=valid)
for name in ("fit", "held", "rep"):
    lp, truth = d[name]
    for budget in (16, 32, 64):
        row = [round(tau_tree(tree_lam(lp, budget, lam), truth), 3) for lam in (1.0, 0.75, 0.5, 0.25, 0.0)]
        print("lambda 1/.75/.5/.25/0", name, budget, row, f"best/ddtree {max(row)/row[0]:.4f}")
