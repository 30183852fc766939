"""Re-weighting the drafter marginals for the taps builder, tuned on held-out data (README "Draft trees"; 2026-12-01).

    python benchmarks/taps_tuning.py

Teacher-forced: every answer position of the target's own greedy outputs is an anchor (held-out =
test instances 2-3 per default size of the long-answer suite, reported = 0-1), the tiny-ar-dflash
drafter's block marginals at that anchor build a tree, and the tree's expected tau there is 1 +
its nodes on the target's path. Prints DDTree's tau and the best held-out taps setting (gamma,
decay), then the best per-depth prior rho / power beta on the marginals, on both splits.
"""
import math

import torch
import torch.nn.functional as F

from dllm import tasks as T
from dllm.drafters.base import make_drafter
from dllm.drafters.loading import load_target
from dllm.drafters.tree import ancestor_mask, best_first_tree, make_tree_builder
from dllm.train.dflash_train import block_layout, regenerate
from dllm.drafters.dflash_model import extract_context_feature, target_embedding, target_head
torch.set_num_threads(1)
target, tok = load_target("tiny-ar")
drafter = make_drafter("dflash", model="tiny-ar-dflash").model
vocab = tok.get_vocab()
def split(lo, hi):
    exs = [ex for n in T.suite_task_names("long-answer") for s in T.get_task(n).default_sizes for ex in T.test_split(n, s, n=hi)[lo:]]
    prompts = [[vocab[w] for w in T.prompt_words(ex)] for ex in exs]
    rows = regenerate(target, prompts, 66)
    return prompts, rows
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
        lg = drafter.compute_logits(h, target_head(target)).float()[0]  # [A, K, V]
        out_lp.append(torch.log_softmax(lg, -1))
        lab = anchors[0][:, None] + torch.arange(1, B)
        truth = torch.where(lab < n, ids[0, lab.clamp(max=n - 1)], torch.full_like(lab, -1))
        out_truth.append(truth)
    return torch.cat(out_lp), torch.cat(out_truth)
def tau(lp, truth, spec):
    tree = make_tree_builder(spec).build(lp)
    tr = truth.gather(1, (tree.depths - 1).clamp(min=0))
    match = (tree.tokens == tr) & tree.valid
    on = ~(ancestor_mask(tree) & ~match[:, None, :]).any(-1) & tree.valid
    return 1 + on.float().sum(1).mean().item()
held = anchors_lp(*split(2, 4)); rep = anchors_lp(*split(0, 2))
print("anchors", held[0].shape[0], rep[0].shape[0])
for budget in (16, 32, 64):
    base_h, base_r = tau(*held, f"ddtree:budget={budget}"), tau(*rep, f"ddtree:budget={budget}")
    best = max(((tau(*held, f"taps:budget={budget},gamma={g},decay={d}"), g, d) for g in (0, 0.1, 0.25, 0.5, 1.0) for d in (1.0, 0.8, 0.6, 0.4)))
    print(budget, "ddtree held", round(base_h, 3), "rep", round(base_r, 3), "| best taps held", round(best[0], 3), best[1:], "rep", round(tau(*rep, f"taps:budget={budget},gamma={best[1]},decay={best[2]}"), 3))
def tau_lp(lp_build, truth, budget):
    tree = best_first_tree(lp_build, budget)
    tr = truth.gather(1, (tree.depths - 1).clamp(min=0))
    match = (tree.tokens == tr) & tree.valid
    on = ~(ancestor_mask(tree) & ~match[:, None, :]).any(-1) & tree.valid
    return 1 + on.float().sum(1).mean().item()
for budget in (16, 32, 64):
    rows = []
    for rho in (0.5, 0.7, 0.85, 1.0, 1.2, 1.5, 2.0):
        for beta in (0.5, 1.0, 2.0):
            f = lambda lp: (lp * beta + math.log(rho)).clamp(max=0)
            rows.append((tau_lp(f(held[0]), held[1], budget), rho, beta, tau_lp(f(rep[0]), rep[1], budget)))
    rows.sort(reverse=True)
    print(budget, [tuple(round(x, 3) for x in r) for r in rows[:3]], "baseline", [tuple(round(x,3) for x in r) for r in rows if r[1]==1.0 and r[2]==1.0])
