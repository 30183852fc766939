"""Verifying a draft tree in one target forward (DDTree, arXiv 2604.12989; SpecInfer / EAGLE-2 trees).

The round of ``loop.py`` with a tree plan: a registered tree builder (``builders.py``) turns the drafter's
per-position distributions into a tree of N nodes under the row's anchor (the root: the last
committed token, which has no K/V yet), and the target reads ``[root, n_1..n_N]`` in one forward:

- positions: ``anchor_position + depth`` (siblings share a position, so every root-to-node path looks
  like an ordinary sequence to RoPE);
- attention: every cached slot the row owns, then inside the tree only the node's ancestors and
  itself (``tree_inputs``), as a 4-D boolean mask;
- the walk (``walk_tree``): at node u (the root first) draw y from the target's distribution at u
  (its arg-max when greedy); if a child of u carries y, move there; otherwise emit y and stop. For
  a child set fixed before the target is read (a deterministic function of the drafter's
  distributions) this is lossless: each emitted token is a draw of p(. | prefix) (Chen et al. 2023,
  with one-hot candidates; the EAGLE-2 sequential form is the same law). Greedy, it accepts the
  longest path that equals the target's arg-max continuation, so the output is the target's greedy
  output.

After the walk the accepted path's slots (root + path nodes) stay valid in the loop's batched cache
and every other tree slot becomes a hole: the slots keep the RoPE positions they were computed at,
which are the path's final positions, and ancestors precede descendants in slot order, so no K/V has
to move (the loop's compaction drops the holes later). Host syncs: the loop's one per round.
"""

from __future__ import annotations

from typing import Optional

import torch

from dllm.drafters.trees.tree import Tree, ancestor_mask, on_path
from dllm.drafters.verify import SamplingParams, next_tokens


def tree_inputs(anchor: torch.Tensor, anchor_position: torch.Tensor,
                tree: Tree) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(ids [R, 1+N], positions [R, 1+N], mask [R, 1+N, 1+N] bool) of the tree forward: the root
    (anchor) first, then the nodes; mask[r, i, j] = j is i or an ancestor of i (the root is every
    node's ancestor). Padding nodes repeat the anchor, at the anchor's position, and see the root and
    themselves only; no node sees them."""
    r, n = tree.tokens.shape
    ids = torch.cat([anchor[:, None], torch.where(tree.valid, tree.tokens, anchor[:, None])], dim=1)  # [R, 1+N]
    depth = torch.where(tree.valid, tree.depths, torch.zeros_like(tree.depths))
    positions = anchor_position[:, None] + torch.cat([torch.zeros_like(anchor)[:, None], depth], dim=1)  # [R, 1+N]
    mask = torch.zeros((r, n + 1, n + 1), dtype=torch.bool, device=anchor.device)
    mask[:, :, 0] = True
    mask[:, 1:, 1:] = ancestor_mask(tree)
    return ids, positions, mask


def walk_tree(logits: torch.Tensor, tree: Tree, params: SamplingParams, max_depth: int,
              generator: Optional[torch.Generator] = None) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The walk of ``walk_tree_reference`` without its loop over depths: the same results when
    greedy, the same law at T > 0 (the draws are made in another order).

    The target's choice y at every node is drawn at once ([R, 1+N]: arg-max, or one sample per node:
    the walk reads the draws of the nodes it visits only, each an independent draw of that node's
    distribution, so drawing the others too changes nothing in law). A node is on the accepted path
    iff every node on its own path carries the choice made at its parent (children carry distinct
    tokens, so these nodes form one chain); the row emits the choice at the deepest of them."""
    r, width, _ = logits.shape
    if params.greedy:
        choice = logits.argmax(dim=-1)  # [R, 1+N]
    else:
        choice = next_tokens(logits.reshape(r * width, -1), params, generator).view(r, width)
    at_parent = choice.gather(1, tree.parents + 1)  # [R, N] the choice made at each node's parent
    match = (tree.tokens == at_parent) & tree.valid  # [R, N]
    accepted_nodes = on_path(tree, match)  # [R, N]
    accepted = accepted_nodes.long().sum(dim=1)  # [R]
    depth = torch.where(accepted_nodes, tree.depths, torch.zeros_like(tree.depths))  # [R, N]
    deepest = torch.where(accepted > 0, depth.argmax(dim=1) + 1, torch.zeros_like(accepted))  # [R] in [root, nodes]
    emitted = choice.gather(1, deepest[:, None])[:, 0]
    path = torch.zeros((r, max_depth + 1), dtype=torch.long, device=logits.device)  # a spill column at 0
    nodes = torch.arange(1, tree.size + 1, device=logits.device).expand(r, -1)
    path.scatter_(1, depth, torch.where(accepted_nodes, nodes, torch.zeros_like(nodes)))
    return path[:, 1:], accepted, emitted


def walk_tree_reference(logits: torch.Tensor, tree: Tree, params: SamplingParams, max_depth: int,
                        generator: Optional[torch.Generator] = None) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Walk the verified tree node by node (the reference of ``walk_tree``). logits: [R, 1+N, V] of ``[root, nodes]``.

    Returns (path [R, max_depth] long: the accepted nodes as indices into ``[root, nodes]`` (1..N),
    0 after the row's last one; accepted [R] long: nodes accepted; next [R] long: the token emitted
    at the last accepted node: the target's choice there). No host sync; ``max_depth + 1`` draws
    per row (rows that stopped draw too, so the generator's stream does not depend on the data).
    """
    r = logits.shape[0]
    rows = torch.arange(r, device=logits.device)
    parent = tree.parents + 1  # [R, N] parents in [root, nodes] numbering (root = 0)
    cur = torch.zeros(r, dtype=torch.long, device=logits.device)
    alive = torch.ones(r, dtype=torch.bool, device=logits.device)
    accepted = torch.zeros(r, dtype=torch.long, device=logits.device)
    emitted = torch.zeros(r, dtype=torch.long, device=logits.device)
    path = torch.zeros((r, max_depth), dtype=torch.long, device=logits.device)
    for t in range(max_depth + 1):
        y = next_tokens(logits[rows, cur], params, generator)  # [R] the target's choice at the current node
        hit = (parent == cur[:, None]) & (tree.tokens == y[:, None]) & tree.valid  # [R, N]
        move = alive & hit.any(dim=1)
        child = hit.long().argmax(dim=1) + 1  # [R] (children carry distinct tokens: at most one hit)
        emitted = torch.where(alive & ~move, y, emitted)
        if t < max_depth:
            path[:, t] = torch.where(move, child, torch.zeros_like(child))
        accepted += move.long()
        cur = torch.where(move, child, cur)
        alive &= move
    return path, accepted, emitted


__all__ = ["tree_inputs", "walk_tree", "walk_tree_reference"]
