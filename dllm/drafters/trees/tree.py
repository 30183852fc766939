"""Draft trees: the ``Tree`` structure and the path math on it (no builders: ``builders.py``).

A ``Tree`` holds N candidate nodes per row after each row's anchor (the root); the target verifies
``[root = anchor, n_1..n_N]`` in one forward (node i at position ``anchor_position + depths[i]``,
attention ``ancestor_mask``) and walks it from the root (``verify.py``). A chain of K drafts is the
width-1 tree (``chain_tree``). Path reductions (``path_reduce``: sums / minima over a node's
ancestors) run by pointer doubling with no host sync; ``path_reduce_reference`` is the mask version.
``expected_accepted`` is DDTree's surrogate (arXiv 2604.12989): the sum over nodes of the product of
the drafter's marginals along the node's path.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Optional

import torch

@dataclass
class Tree:
    """N draft nodes per row (R rows). Nodes are in topological order (a parent's index < its
    child's); a row may use fewer than N nodes: its padding nodes come last, with ``valid`` False,
    token 0, parent -1 and depth 0 (so ``depths > 0`` equals ``valid``)."""

    tokens: torch.Tensor  # [R, N] long, node tokens
    parents: torch.Tensor  # [R, N] long, parent node index in 0..N-1, or -1 for a child of the root (the anchor)
    depths: torch.Tensor  # [R, N] long, 1 = child of the root; a node's depth = its parent's + 1
    valid: torch.Tensor  # [R, N] bool, False on padding nodes

    @property
    def size(self) -> int:
        """N, the node slots per row (padding included)."""
        return self.tokens.shape[1]


def ancestor_mask(tree: Tree) -> torch.Tensor:
    """bool [R, N, N]: ``[r, i, j]`` True iff node j is node i or an ancestor of i (a padding node:
    only itself). Pointer doubling, ceil(log2 N) gathers and no host sync: after step t, ``mask``
    holds the ancestors at distance < 2^t and ``jump`` the ancestor at distance 2^t (-1 past the root)."""
    parents, valid = tree.parents, tree.valid
    r, n = parents.shape
    mask = torch.eye(n, dtype=torch.bool, device=parents.device).expand(r, n, n).clone()  # [R, N, N]
    jump = torch.where(valid, parents, torch.full_like(parents, -1))  # [R, N]
    reach = 1
    while reach < n:  # a depth is at most N, so distances < N cover every ancestor
        has = jump >= 0  # [R, N]
        idx = jump.clamp(min=0)  # [R, N]
        far = mask.gather(1, idx.unsqueeze(-1).expand(r, n, n))  # [R, N, N]: mask row of node jump[i]
        mask |= far & has.unsqueeze(-1)
        jump = torch.where(has, jump.gather(1, idx), jump)  # -1 stays -1
        reach *= 2
    return mask


def chain_tree(tokens: torch.Tensor) -> Tree:
    """The path ``anchor -> tokens[:, 0] -> ... -> tokens[:, K-1]`` as a Tree (tokens [R, K] long)."""
    r, k = tokens.shape
    steps = torch.arange(k, dtype=torch.long, device=tokens.device)  # [K]
    return Tree(tokens=tokens.long(), parents=(steps - 1).expand(r, k).clone(),
                depths=(steps + 1).expand(r, k).clone(),
                valid=torch.ones((r, k), dtype=torch.bool, device=tokens.device))


def on_path(tree: Tree, match: torch.Tensor) -> torch.Tensor:
    """bool [R, N]: the valid nodes whose whole path (the node and its ancestors) has ``match`` [R, N]
    True: the nodes a walk accepts when ``match`` marks the nodes carrying the target's token."""
    return ~(ancestor_mask(tree) & ~match[:, None, :]).any(dim=-1) & tree.valid


def path_probs(tree: Tree, log_probs: torch.Tensor) -> torch.Tensor:
    """float32 [R, N]: per node the product of the drafter's marginals along its path,
    ``exp(sum_{a in path} log_probs[r, depth(a) - 1, token(a)])`` (0 on padding)."""
    r, k, v = log_probs.shape
    depth_idx = (tree.depths - 1).clamp(min=0)  # [R, N]; padding reads depth 1, masked below
    node_lp = log_probs.reshape(r, k * v).gather(1, depth_idx * v + tree.tokens).float()  # [R, N]
    path_lp = path_reduce_reference(tree, node_lp, "sum")  # [R, N]
    return torch.where(tree.valid, path_lp.exp(), torch.zeros_like(path_lp))


def expected_accepted(tree: Tree, log_probs: torch.Tensor) -> torch.Tensor:
    """float32 [R]: sum over the valid nodes of ``path_probs`` -- the expected number of accepted
    drafts if the marginals were the target's path-conditioned acceptance probabilities (a round
    then commits 1 + this many tokens). The surrogate ``ddtree`` maximises."""
    return path_probs(tree, log_probs).sum(-1)


def path_jumps(tree: Tree, max_depth: Optional[int] = None) -> list[torch.Tensor]:
    """Pointer-doubling tables of ``tree``: entry t is [R, N + 1] long, each node's ancestor at
    distance 2^t, or N past the root and on padding; column N is a sentinel pointing to itself.
    ceil(log2(max_depth)) entries, where ``max_depth`` bounds the tree's depth (default N). One
    table serves every ``path_reduce``."""
    r, n = tree.parents.shape
    sentinel = torch.full((r, 1), n, dtype=torch.long, device=tree.parents.device)
    jump = torch.cat([torch.where(tree.valid & (tree.parents >= 0), tree.parents, sentinel), sentinel], dim=1)
    jumps, reach, depth = [], 1, n if max_depth is None else max(1, min(max_depth, n))
    while reach < depth:
        jumps.append(jump)  # [R, N + 1]
        jump = jump.gather(1, jump)  # the ancestor 2^(t+1) up
        reach *= 2
    return jumps


def path_reduce(tree: Tree, values: torch.Tensor, op: str, max_depth: Optional[int] = None,
                jumps: Optional[list[torch.Tensor]] = None) -> torch.Tensor:
    """[R, N]: ``values`` [R, N] reduced over each node's path (itself and its ancestors), ``op``
    "sum" or "min" (float values for "min"); padding nodes keep their own value. Pointer doubling
    (``path_jumps``, or pass ``jumps``): after step t, ``acc`` covers the ancestors at distance
    < 2^t, so ceil(log2(max_depth)) gathers (no [R, N, N] mask, no host sync).
    ``path_reduce_reference`` is the mask version."""
    if op not in ("sum", "min"):
        raise ValueError(f"op must be 'sum' or 'min', got {op!r}")
    combine = torch.add if op == "sum" else torch.minimum
    neutral = torch.full((values.shape[0], 1), 0 if op == "sum" else math.inf, dtype=values.dtype,
                         device=values.device)
    acc = torch.cat([values, neutral], dim=1)  # [R, N + 1]: the sentinel column holds the neutral value
    for jump in path_jumps(tree, max_depth) if jumps is None else jumps:
        acc = combine(acc, acc.gather(1, jump))
    return acc[:, :-1]


def path_reduce_reference(tree: Tree, values: torch.Tensor, op: str) -> torch.Tensor:
    """``path_reduce`` through the [R, N, N] ``ancestor_mask`` (the reference of the doubling)."""
    mask = ancestor_mask(tree)  # [R, N, N]
    if op == "sum":
        return torch.where(mask, values[:, None, :], torch.zeros_like(values)[:, None, :]).sum(-1)
    return torch.where(mask, values[:, None, :], torch.full_like(values, math.inf)[:, None, :]).amin(-1)


def path_scores(tree: Tree, node_lp: torch.Tensor, jumps: Optional[list[torch.Tensor]] = None) -> torch.Tensor:
    """float32 [R, N]: log P(node) = sum of ``node_lp`` [R, N] over the node's path (itself and its
    ancestors), then the minimum over the path, so that a child never scores above its parent even
    by a rounding step (with node_lp <= 0 the sums already decrease down a path); padding nodes
    -inf. ``jumps``: ``path_jumps(tree)`` when the caller has them. No host sync."""
    jumps = path_jumps(tree) if jumps is None else jumps
    score = path_reduce(tree, path_reduce(tree, node_lp.float(), "sum", jumps=jumps), "min", jumps=jumps)
    return torch.where(tree.valid, score, torch.full_like(score, -math.inf))


def select_subtree(tree: Tree, node_lp: torch.Tensor, budget: int, jumps: Optional[list[torch.Tensor]] = None) -> Tree:
    """The ``budget`` nodes of ``tree`` with the largest log P(node) (``path_scores``), as a Tree in
    the same topological order. With ``node_lp`` <= 0 a parent scores at least as high as its child
    and, on a tie, comes first (a stable sort; parents precede children), so the top ``budget`` are
    prefix-closed: the best subtree of the candidates under the budget. No host sync."""
    r, n = tree.tokens.shape
    budget = min(budget, n)
    score = path_scores(tree, node_lp, jumps)  # [R, N]
    order = torch.sort(-score, dim=1, stable=True).indices[:, :budget]  # [R, B] the best, by score
    keep = order.sort(dim=1).values  # [R, B] back in topological order
    valid = tree.valid.gather(1, keep)  # [R, B]
    new_index = torch.full((r, n), -1, dtype=torch.long, device=tree.tokens.device)
    new_index.scatter_(1, keep, torch.arange(budget, device=tree.tokens.device).expand(r, budget).contiguous())
    old_parent = tree.parents.gather(1, keep)  # [R, B]
    parents = torch.where(old_parent >= 0, new_index.gather(1, old_parent.clamp(min=0)), old_parent)
    return Tree(tokens=torch.where(valid, tree.tokens.gather(1, keep), torch.zeros_like(keep)),
                parents=torch.where(valid, parents, torch.full_like(parents, -1)),
                depths=torch.where(valid, tree.depths.gather(1, keep), torch.zeros_like(keep)), valid=valid)


__all__ = ["Tree", "ancestor_mask", "chain_tree", "expected_accepted", "on_path", "path_jumps", "path_probs",
           "path_reduce", "path_reduce_reference", "path_scores", "select_subtree"]
