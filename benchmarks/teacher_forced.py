"""Teacher-forced tree measurements on the tiny pair, shared by benchmarks/taps_tuning.py and
benchmarks/taps_estimators.py (run from the repository root: ``python benchmarks/<script>.py``).

Every answer position of tiny-ar's own greedy outputs is an anchor; tiny-ar-dflash's block
marginals there build a tree, and the tree's tau there is 1 + its nodes on the target's path.
"""
import torch
import torch.nn.functional as F

from dllm import tasks as T
from dllm.drafters.base import make_drafter
from dllm.drafters.dflash.model import extract_context_feature, target_embedding, target_head
from dllm.drafters.loading import load_target
from dllm.drafters.trees import Tree
from dllm.train.dflash_train import ANSWER_TOKENS, block_layout, regenerate
from dllm.train.path_head_train import nodes_on_path

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


class Anchored:
    """One prompt + answer, every answer position an anchor: the target's features and the block
    layout, so that a drafter pass over any block tokens is one call (``log_probs``)."""

    @torch.no_grad()
    def __init__(self, prompt: list[int], row: list[int], model=None) -> None:
        self.model = drafter if model is None else model
        self.ids, self.n, self.b = torch.tensor([row]), len(row), self.model.block_size
        self.anchors = torch.arange(len(prompt), self.n - 1)[None]  # [1, A]
        o = target(input_ids=self.ids, output_hidden_states=True)
        self.feats = extract_context_feature(o.hidden_states, self.model.target_layer_ids)
        self.pos, self.mask = block_layout(self.anchors, self.n, self.b)

    def blocks(self) -> torch.Tensor:
        """[1, A*b] block tokens: each anchor's token, then masks."""
        bids = torch.full_like(self.pos, self.model.mask_token_id)
        bids[:, ::self.b] = self.ids.gather(1, self.anchors)
        return bids

    @torch.no_grad()
    def log_probs(self, bids: torch.Tensor) -> torch.Tensor:
        """The drafter's log-probabilities [A, K, V] at block slots 1..K for block tokens ``bids``."""
        m = self.model
        h = m(F.embedding(bids, target_embedding(target)), self.feats, feature_positions=torch.arange(self.n)[None],
              block_positions=self.pos, attn_mask=self.mask)
        h = h.reshape(1, self.anchors.shape[1], self.b, -1)[:, :, 1:]
        return torch.log_softmax(m.compute_logits(h, target_head(target)).float()[0], -1)

    def truth(self) -> torch.Tensor:
        """[A, K] the target's tokens at slots 1..K, -1 past the end."""
        lab = self.anchors[0][:, None] + torch.arange(1, self.b)
        return torch.where(lab < self.n, self.ids[0, lab.clamp(max=self.n - 1)], torch.full_like(lab, -1))


def anchors_lp(prompts, rows) -> tuple[torch.Tensor, torch.Tensor]:
    """(log-marginals [A, K, V] of the drafter at every anchor, the target's tokens [A, K], -1 past the end)."""
    out = [Anchored(p, r) for p, r in zip(prompts, rows)]
    return torch.cat([a.log_probs(a.blocks()) for a in out]), torch.cat([a.truth() for a in out])


def tau(tree: Tree, truth: torch.Tensor) -> float:
    """Mean over anchors of 1 + the tree's nodes on the target's path."""
    return 1 + nodes_on_path(tree, truth).float().mean().item()
