"""The registered tree builders: per-depth draft distributions -> a ``Tree`` (``tree.py``).

A block drafter (DFlash) gives per-position log-marginals ``log_probs`` [R, K, V] for the K
positions after each row's anchor (depth d = index d - 1). A tree builder turns them into a
``Tree`` of N candidate nodes per row; the target verifies ``[root = anchor, n_1..n_N]`` in one
forward (node i at position ``anchor_position + depths[i]``, attention ``ancestor_mask``) and walks
the tree from the root: at node u it takes the target's token y (arg-max or sample) and moves to
the child of u whose token is y, or emits y and stops. Expected tokens per round =
1 + sum over nodes of P(the walk reaches the node).

Builders (``make_tree_builder("ddtree:budget=32")``), small pure functions of the distributions:

- ``chain``: the arg-max token per depth, a path of ``min(budget, K)`` nodes (plain DFlash);
- ``ddtree`` (DDTree, Ringel & Romano, arXiv 2604.12989): the ``budget`` paths' nodes with the
  largest surrogate P(node) = prod of the drafter's marginals along its path, by a best-first heap;
- ``taps``: TAPS (Wang, Huang, Chen, arXiv 2606.00487): path-conditioned acceptance estimates,
  P(node) = P(parent) * a(node | its path), and the prefix-closed subtree of ``budget`` nodes with
  the largest sum of P. OUR estimators (the paper's is not available): a learned path head read
  with the drafter's states (``path_head.py``; candidates from a larger ddtree, ``select_subtree``)
  when the drafter has one, else a rule on the marginals below deviations (see ``TapsBuilder``).

``expected_accepted`` evaluates the surrogate (sum over nodes of the product of marginals along
the path) that ``ddtree`` maximises over prefix-closed subtrees of ``budget`` nodes.
"""

from __future__ import annotations

import heapq
import math
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, ClassVar, Mapping, Optional, Union

import torch

from dllm.drafters.trees.tree import Tree, chain_tree, path_jumps, select_subtree
from dllm.options import check_int, check_number
from dllm.registry import Configurable, Registry

if TYPE_CHECKING:
    from dllm.drafters.trees.path_head import PathScorer

TAPS_ESTIMATORS = ("auto", "head", "marginal")


@dataclass(frozen=True)
class TreeConfig:
    budget: int = 32  # draft nodes per row (the root/anchor not counted)
    # the budget rule (budget.py): a node's verification cost relative to a round with an empty
    # tree; > 0 cuts each row's tree where expected tokens per unit of cost peak (0 = always `budget`)
    cost_per_node: float = 0.0

    def __post_init__(self) -> None:
        check_int("budget", self.budget, 1, hint=" (draft nodes per tree)")
        check_number("cost_per_node", self.cost_per_node, low=0.0, finite=True,
                     hint=" (target cost of one tree node / cost of a round; 0 = off)")


@dataclass(frozen=True)
class TapsConfig(TreeConfig):
    # "head": the drafter's learned path head (an error without one); "marginal": the rule on the
    # marginals (gamma, decay); "auto": the head when the drafter has one, else the rule
    estimator: str = "auto"
    candidates: int = 8  # head: the candidates are the ddtree of candidates * budget nodes ...
    max_candidates: int = 512  # ... but at most this many (and at least budget), re-scored by the head
    gamma: float = 0.25  # rule: exponent of the rank-ratio factor q_j(y) / q_j(top) per deviation (0 = off)
    decay: float = 1.0  # rule: constant factor per deviation (1 = off); gamma = 0, decay = 1 is ddtree

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.estimator not in TAPS_ESTIMATORS:
            raise ValueError(f"estimator must be one of {', '.join(TAPS_ESTIMATORS)}, got {self.estimator!r}")
        check_int("candidates", self.candidates, 1, hint=" (candidate nodes per budget node for the path head)")
        check_int("max_candidates", self.max_candidates, 1, hint=" (candidate nodes for the path head)")
        check_number("gamma", self.gamma, low=0.0, finite=True, hint=" (0 = no rank-ratio penalty)")
        check_number("decay", self.decay, low=0.0, high=1.0, low_open=True, hint=" (1 = no constant penalty)")



def tokens_only(spec: str) -> str:
    """The refusal of a tree builder ``spec`` over a drafter that returns tokens only."""
    return (f"tree builder {spec!r} builds trees from the drafter's per-position distributions, but this "
            f"drafter returns tokens only (Draft.logits is None); use a drafter that gives them (dflash) or no tree")

class TreeBuilder(Configurable):
    """Base class: ``build(log_probs [R, K, V], paths) -> Tree`` from the drafter's per-depth
    log-marginals (and, for builders that use them, the drafter's path-conditioned estimates
    ``paths``, a ``path_head.PathScorer`` or None)."""

    kind: ClassVar[str] = "tree builder"
    Config: ClassVar[type] = TreeConfig

    @property
    def uses_paths(self) -> bool:
        """Whether ``build`` reads the drafter's path estimates (so the drafter loads its path head)."""
        return False

    def build(self, log_probs: torch.Tensor, paths: Optional["PathScorer"] = None) -> Tree:
        raise NotImplementedError(f"{type(self).__name__} must implement build")

    def check_drafter(self, drafter: Any) -> None:
        """ValueError when this builder cannot work with ``drafter`` (called before a call runs): one whose
        drafts carry no per-position distributions (``Drafter.gives_distributions`` False)."""
        if getattr(drafter, "gives_distributions", None) is False:
            raise ValueError(tokens_only(self.spec))

    def tree_for(self, log_probs: torch.Tensor, paths: Optional["PathScorer"] = None) -> Tree:
        """``build``, then the budget rule when ``cost_per_node`` > 0 (what the loop calls)."""
        tree = self.build(log_probs, paths)
        if self.config.cost_per_node > 0:
            from dllm.drafters.trees.budget import prune_for_cost

            tree = prune_for_cost(tree, log_probs, self.config.cost_per_node)
        return tree


tree_builders: Registry[type[TreeBuilder]] = Registry("tree builder", base=TreeBuilder)
register_tree_builder = tree_builders.register_class  # class decorator: @register_tree_builder("name")

TreeBuilderSpec = Union[str, TreeBuilder, Mapping[str, Any]]


def load_builders() -> Registry[type[TreeBuilder]]:
    """The registry with every built-in builder: those registered beside their drafter (``jetspec``)
    come with the built-in drafters' modules, so the names never depend on what was imported before."""
    from dllm.drafters.base import load_builtin_drafters

    load_builtin_drafters()
    return tree_builders


def make_tree_builder(spec: TreeBuilderSpec, **options: Any) -> TreeBuilder:
    """A tree builder from a name (``"ddtree"``), a spec string (``"ddtree:budget=8"``), a mapping
    with a ``"name"`` key, or an instance (returned as is)."""
    return load_builders().make(spec, **options)


def list_tree_builders() -> list[tuple[str, str]]:
    """(name, one-line description) of every registered tree builder."""
    return load_builders().describe()


def _check_log_probs(log_probs: torch.Tensor) -> None:
    if not isinstance(log_probs, torch.Tensor) or log_probs.dim() != 3 or not log_probs.is_floating_point():
        shape = tuple(log_probs.shape) if isinstance(log_probs, torch.Tensor) else type(log_probs).__name__
        raise ValueError(f"log_probs must be a float tensor [R, K, V] of per-depth log-marginals, got {shape}")
    if log_probs.shape[1] < 1 or log_probs.shape[2] < 1:
        raise ValueError(f"log_probs needs K >= 1 depths and V >= 1 tokens, got shape {tuple(log_probs.shape)}")


def _deviation_penalty(lp_depth: list[float], rank: int, gamma: float, log_decay: float) -> float:
    """log of the factor a deviation (a node of rank > 0 with sorted log-probs ``lp_depth``) puts on
    every acceptance estimate below it: ``log(decay) + gamma * log(q(rank) / q(top))`` (0 at rank 0)."""
    if rank == 0:
        return 0.0
    if gamma == 0.0:
        return log_decay
    if lp_depth[rank] == -math.inf:  # -inf - -inf would be NaN
        return -math.inf
    return log_decay + gamma * (lp_depth[rank] - lp_depth[0])


def best_first_tree(log_probs: torch.Tensor, budget: int, gamma: float = 0.0, decay: float = 1.0) -> Tree:
    """The prefix-closed subtree of ``budget`` nodes with the largest scores, best first.

    Candidates: at depth d, the top-``min(budget, V)`` tokens of ``log_probs[:, d-1]`` (rank 0 =
    most likely). log P(node) = log P(parent) + log q_d(token) + pen(parent's path), where pen sums
    ``log(decay) + gamma * (log q_j(y_j) - log q_j(top_j))`` over the path's nodes y_j (root
    excluded) with rank > 0; ``gamma = 0, decay = 1`` is DDTree's surrogate.

    Heap: start with (depth 1, rank 0); each pop appends the node (so a parent always precedes its
    children) and pushes its next sibling (rank + 1) and its first child (depth + 1, rank 0; only
    below depth K), until ``budget`` nodes or no candidate is left (then padding). This is exact,
    not a heuristic: siblings share ``pen``, so a sibling never scores above its lower rank, and a
    child never scores above its parent (each factor <= 1), so every unpicked candidate has a
    representative in the heap scoring at least as much (its first unpicked ancestor or earlier
    sibling); the top-``budget`` candidates by score are then prefix-closed and maximise the sum.

    Runs a Python heap per row on host lists: one device->host copy of the top-k values per call
    (a sync); tokens are gathered on the input's device."""
    _check_log_probs(log_probs)
    r, k_all, v = log_probs.shape
    depth_cap, width = min(k_all, budget), min(v, budget)  # deeper / lower-ranked nodes never fit
    top = torch.topk(log_probs[:, :depth_cap].float(), width, dim=-1)  # values/indices [R, D, W]
    values = top.values.cpu().tolist()  # the one host sync
    log_decay = math.log(decay)
    node_depth = [[0] * budget for _ in range(r)]  # 0 = padding
    node_rank = [[0] * budget for _ in range(r)]
    node_parent = [[-1] * budget for _ in range(r)]
    for row in range(r):
        lp, depth_of, rank_of, parent_of = values[row], node_depth[row], node_rank[row], node_parent[row]
        # heap entries: (-score, tie order, depth, rank, parent index, parent score, pen of the parent's path)
        heap = [(-lp[0][0], 0, 1, 0, -1, 0.0, 0.0)]
        order, n = 1, 0
        while heap and n < budget:
            neg, _, d, rank, parent, parent_score, pen = heapq.heappop(heap)
            depth_of[n], rank_of[n], parent_of[n] = d, rank, parent
            if rank + 1 < width:  # next sibling: same parent, same pen
                heapq.heappush(heap, (-(parent_score + lp[d - 1][rank + 1] + pen), order, d, rank + 1, parent,
                                      parent_score, pen))
                order += 1
            if d < depth_cap:  # first child of this node
                child_pen = pen + _deviation_penalty(lp[d - 1], rank, gamma, log_decay)
                heapq.heappush(heap, (-(-neg + lp[d][0] + child_pen), order, d + 1, 0, n, -neg, child_pen))
                order += 1
            n += 1
    device = log_probs.device
    depths = torch.tensor(node_depth, dtype=torch.long).view(r, budget).to(device)
    ranks = torch.tensor(node_rank, dtype=torch.long).view(r, budget).to(device)
    parents = torch.tensor(node_parent, dtype=torch.long).view(r, budget).to(device)
    valid = depths > 0
    flat = top.indices.reshape(r, depth_cap * width)  # [R, D * W]
    tokens = flat.gather(1, (depths - 1).clamp(min=0) * width + ranks)  # [R, N]
    return Tree(tokens=torch.where(valid, tokens, torch.zeros_like(tokens)), parents=parents,
                depths=depths, valid=valid)


@register_tree_builder("chain")
class ChainBuilder(TreeBuilder):
    """The arg-max token per depth: a path of min(budget, K) nodes (plain DFlash drafting)."""

    def build(self, log_probs: torch.Tensor, paths: Optional["PathScorer"] = None) -> Tree:
        _check_log_probs(log_probs)
        return chain_tree(log_probs[:, :self.config.budget].argmax(dim=-1))


@register_tree_builder("ddtree")
class DDTreeBuilder(TreeBuilder):
    """DDTree (arXiv 2604.12989): best-first heap over path products of the drafter's marginals."""

    def build(self, log_probs: torch.Tensor, paths: Optional["PathScorer"] = None) -> Tree:
        return best_first_tree(log_probs, self.config.budget)


@register_tree_builder("taps")
class TapsBuilder(TreeBuilder):
    """TAPS (arXiv 2606.00487): path-conditioned acceptance estimates, the best prefix-closed subtree
    under the budget. P(node) = P(parent) * a(node | path); two estimators of a (``estimator``):

    **head** (``path_head.PathScorer``, when the drafter ships a path head): candidates are the
    ddtree of ``candidates * budget`` nodes (at most ``max_candidates``, at least ``budget``: the
    marginals propose; 8 beat 2 and 4 teacher-forced on held-out prompts), each scored by the learned
    head from the drafter's state at its depth and its path (parent token, the drafter's arg-max at
    the parent's depth, deviations above); ``select_subtree`` keeps the best ``budget``.

    **marginal** (no head needed): the drafter's marginal q_d is a mixture over the tokens above
    it, ``q_d(x) = sum_y q_j(y) q(x | y, ...)`` (j < d), in which the branch of a depth-j token y
    weighs q_j(y). On the drafter's most likely path the marginal is dominated by that path's own
    branch and is a fair estimate; below a *deviation* (a node y_j that is not its parent's
    top-ranked child) the marginal mostly describes the top branch, and the smaller y_j's weight
    relative to the top token's, the less it says about y_j's continuation. So:

        a(y_d | path) = q_d(y_d) * prod_{deviations y_j above y_d} decay * (q_j(y_j) / q_j(top_j)) ** gamma

    Both factors are <= 1 and depend only on the parent's path, so siblings keep the order of q: the
    best-first heap (``best_first_tree``) picks the best subtree exactly. ``gamma = 0, decay = 1`` is
    ``ddtree``. Default gamma = 0.25: on synthetic order-1/2 Markov targets the most robust of those
    tried (+0.1..0.2% expected tokens over ddtree at budgets 16-64; a constant decay of 0.5 alone lost
    0.3-0.5%, so decay is off by default). On the tiny pair this rule ties with ddtree; the head wins.

    ``estimator="auto"`` (default) takes the head when the drafter gives one, else the rule.
    """

    Config = TapsConfig

    NO_HEAD = ("taps:estimator=head needs a drafter with a path head (path_head.json and path_head.safetensors "
               "beside its checkpoint; train one with dllm train path-head), and this drafter "
               "has none; use taps:estimator=marginal or ddtree")

    @property
    def uses_paths(self) -> bool:
        return self.config.estimator != "marginal"

    def check_drafter(self, drafter: Any) -> None:
        super().check_drafter(drafter)
        if self.config.estimator == "head" and getattr(drafter, "path_head", None) is None:
            raise ValueError(self.NO_HEAD)

    def build(self, log_probs: torch.Tensor, paths: Optional["PathScorer"] = None) -> Tree:
        cfg = self.config
        if cfg.estimator == "head" and paths is None:
            raise ValueError(self.NO_HEAD)
        if paths is None or cfg.estimator == "marginal":
            return best_first_tree(log_probs, cfg.budget, gamma=cfg.gamma, decay=cfg.decay)
        candidates = best_first_tree(log_probs, max(cfg.budget, min(cfg.budget * cfg.candidates, cfg.max_candidates)))
        jumps = path_jumps(candidates, log_probs.shape[1])  # K bounds the depth of any tree
        return select_subtree(candidates, paths.node_log_accept(candidates, log_probs, jumps), cfg.budget, jumps)


__all__ = ["ChainBuilder", "DDTreeBuilder", "TAPS_ESTIMATORS", "TapsBuilder", "TapsConfig", "TreeBuilder",
           "TreeBuilderSpec", "TreeConfig", "best_first_tree", "list_tree_builders", "make_tree_builder",
           "register_tree_builder", "tree_builders"]
