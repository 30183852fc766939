"""JetSpec's budgeted draft tree (``accum_logp``): the ``jetspec`` tree builder.

JetSpec (Hu et al., arXiv 2606.18394; hao-ai-lab/JetSpec ``jetflow/tree/baselines/accum_logp.py``)
builds its tree from the causal head's per-depth log-probabilities ``log_probs`` [R, K, V]: the
children offered at depth d are the same ``width`` tokens for every parent, the top-``width`` of
``log_probs[:, d - 1]`` in rank order, and a node's score is the accumulated log-probability of its
path. Expansion is best-first over whole nodes, not over single candidates:

    nodes = [root]; heap = [(score 0, order 0, root)]
    while heap and draft nodes < budget:
        pop the node u with the highest score (ties: the one pushed first)
        if depth(u) == K: skip it (the head gives no deeper distribution)
        append u's first min(width, budget - draft nodes) children, rank order, each pushed with
        score(u) + log q_{depth(u)+1}(token)

So the tree is every child of the ``m`` best-scoring expanded nodes (the last one possibly cut
short). Nodes are appended parent first; stopping earlier gives exactly a prefix, so every prefix
of the tree is the tree of a smaller budget and the budget rule (``trees/budget.py``,
``cost_per_node``) applies unchanged. It differs from ``ddtree`` (which picks the ``budget`` best
single candidates): a node's low-ranked children come in with it, bounded by ``width`` (7 in the
paper), which keeps the tree wide near the root.

``budget`` counts draft nodes (the project's convention, root not counted): the authors'
``budget=64`` (their count includes the root) is ``jetspec:budget=63``. The paper's settings are
width 7, budgets 63-255. Runs a Python heap per row on host lists (one device -> host copy of the
top-k values per round, a sync); tokens are gathered on the input's device.
"""

from __future__ import annotations

import heapq
from dataclasses import dataclass
from typing import TYPE_CHECKING, Optional

import torch

from dllm.drafters.trees.builders import TreeBuilder, TreeConfig, register_tree_builder
from dllm.drafters.trees.tree import Tree
from dllm.options import check_int

if TYPE_CHECKING:
    from dllm.drafters.trees.path_head import PathScorer


@dataclass(frozen=True)
class JetSpecTreeConfig(TreeConfig):
    budget: int = 63  # draft nodes per row (root not counted; the authors' budget 64)
    width: int = 7  # children offered per expanded node: the top-`width` tokens of the next depth

    def __post_init__(self) -> None:
        super().__post_init__()
        check_int("width", self.width, 1, hint=" (children per expanded node, the paper uses 7)")


def accum_logp_tree(log_probs: torch.Tensor, budget: int, width: int) -> Tree:
    """The ``accum_logp`` tree (module docstring) of ``budget`` draft nodes per row, padded.

    log_probs: [R, K, V] float per-depth log-probabilities of the drafter (depth d = index d - 1).
    Returns a ``Tree`` [R, budget] in insertion order (parents before children)."""
    if log_probs.dim() != 3 or not log_probs.is_floating_point() or log_probs.shape[1] < 1:
        shape = tuple(log_probs.shape) if isinstance(log_probs, torch.Tensor) else type(log_probs).__name__
        raise ValueError(f"log_probs must be a float tensor [R, K >= 1, V] of per-depth log-probabilities, got {shape}")
    r, k, v = log_probs.shape
    w = min(width, v)
    top = torch.topk(log_probs, w, dim=-1)  # values / indices [R, K, W]
    values = top.values.cpu().tolist()  # the one host sync
    node_depth = [[0] * budget for _ in range(r)]  # 0 = padding
    node_rank = [[0] * budget for _ in range(r)]
    node_parent = [[-1] * budget for _ in range(r)]
    for row in range(r):
        lp, depth_of, rank_of, parent_of = values[row], node_depth[row], node_rank[row], node_parent[row]
        depth = [0]  # per node of [root, drafts]
        heap = [(0.0, 0, 0)]  # (-score, push order, index in [root, drafts])
        order, n = 0, 0  # n draft nodes so far
        while heap and n < budget:
            neg, _, u = heapq.heappop(heap)
            d = depth[u]
            if d >= k:
                continue
            for j in range(min(w, budget - n)):
                s = -neg + lp[d][j]
                depth_of[n], rank_of[n], parent_of[n] = d + 1, j, u - 1  # parent as a draft index (-1: root)
                depth.append(d + 1)
                n += 1
                order += 1
                heapq.heappush(heap, (-s, order, n))
    device = log_probs.device
    depths = torch.tensor(node_depth, dtype=torch.long).view(r, budget).to(device)
    ranks = torch.tensor(node_rank, dtype=torch.long).view(r, budget).to(device)
    parents = torch.tensor(node_parent, dtype=torch.long).view(r, budget).to(device)
    valid = depths > 0
    flat = top.indices.reshape(r, k * w)  # [R, K * W]
    tokens = flat.gather(1, (depths - 1).clamp(min=0) * w + ranks)  # [R, N]
    return Tree(tokens=torch.where(valid, tokens, torch.zeros_like(tokens)), parents=parents, depths=depths,
                valid=valid)


@register_tree_builder("jetspec", aliases=("accum_logp",))
class JetSpecTreeBuilder(TreeBuilder):
    """JetSpec (arXiv 2606.18394): best-first expansion of whole nodes by accumulated log-prob, top-``width`` children."""

    Config = JetSpecTreeConfig

    def build(self, log_probs: torch.Tensor, paths: Optional["PathScorer"] = None) -> Tree:
        return accum_logp_tree(log_probs, self.config.budget, self.config.width)


__all__ = ["JetSpecTreeBuilder", "JetSpecTreeConfig", "accum_logp_tree"]
