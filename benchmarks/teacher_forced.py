"""Teacher-forced tree measurements on the tiny pair, shared by benchmarks/taps_tuning.py and
benchmarks/taps_estimators.py (run from the repository root: ``python benchmarks/<script>.py``).

Every answer position of tiny-ar's own greedy outputs is an anchor; tiny-ar-dflash's block
marginals there build a tree, and the tree's tau there is 1 + its nodes on the target's path.
"""
import torch
import torch.nn.functional as F

from dllm import tasks as T
from dllm.drafters.base import make_drafter
from dllm.drafters.dflash_model import extract_context_feature, target_embedding, target_head
from dllm.drafters.loading import load_target
from dllm.drafters.tree import Tree, ancestor_mask
from dllm.train.dflash_train import block_layout, regenerate

ANSWER_TOKENS = 66  # the longest long-answer answer
torch.set_num_threads(1)
target, tok = load_target("tiny-ar")
drafter = make_drafter("dflash", model="tiny-ar-dflash").model
vocab = tok.get_vocab()


def encode(examples) -> tuple[list[list[int]], list[list[int]]]:
    """(prompt ids, prompt + the target's greedy answer) of each example."""
    prompts = [[vocab[w] for w in T.prompt_words(ex)] for ex in examples]
    return prompts, regenerate(target, prompts, ANSWER_TOKENS)


def split(lo: int, hi: int):
    """Test instances lo..hi-1 of every default size of the long-answer suite, encoded."""
    return encode([ex for n in T.suite_task_names("long-answer") for s in T.get_task(n).default_sizes
                   for ex in T.test_split(n, s, n=hi)[lo:]])


@torch.no_grad()
def anchors_lp(prompts, rows) -> tuple[torch.Tensor, torch.Tensor]:
    """(log-marginals [A, K, V] of the drafter at every anchor, the target's tokens [A, K], -1 past the end)."""
    out_lp, out_truth = [], []
    b = drafter.block_size
    for p, r in zip(prompts, rows):
        ids = torch.tensor([r])
        n = len(r)
        anchors = torch.arange(len(p), n - 1)[None]
        o = target(input_ids=ids, output_hidden_states=True)
        feats = extract_context_feature(o.hidden_states, drafter.target_layer_ids)
        pos, mask = block_layout(anchors, n, b)
        bids = torch.full_like(pos, drafter.mask_token_id)
        bids[:, ::b] = ids.gather(1, anchors)
        h = drafter(F.embedding(bids, target_embedding(target)), feats, feature_positions=torch.arange(n)[None],
                    block_positions=pos, attn_mask=mask)
        h = h.reshape(1, anchors.shape[1], b, -1)[:, :, 1:]
        lg = drafter.compute_logits(h, target_head(target)).float()[0]  # [A, K, V]
        out_lp.append(torch.log_softmax(lg, -1))
        lab = anchors[0][:, None] + torch.arange(1, b)
        out_truth.append(torch.where(lab < n, ids[0, lab.clamp(max=n - 1)], torch.full_like(lab, -1)))
    return torch.cat(out_lp), torch.cat(out_truth)


def tau(tree: Tree, truth: torch.Tensor) -> float:
    """Mean over anchors of 1 + the tree's nodes on the target's path."""
    tr = truth.gather(1, (tree.depths - 1).clamp(min=0))
    match = (tree.tokens == tr) & tree.valid
    on = ~(ancestor_mask(tree) & ~match[:, None, :]).any(-1) & tree.valid
    return 1 + on.float().sum(1).mean().item()
