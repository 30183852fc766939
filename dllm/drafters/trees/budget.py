"""The budget rule of draft trees: stop growing a tree when the next node no longer pays for its
verification cost.

A round costs ``1 + c * N`` (in units of a round with an empty tree: the drafter's forward plus the
target's fixed cost) when the target verifies N tree nodes, ``c`` being the target's cost per node
relative to that (measure it: ``dllm bench trees`` fits ``t(N) = a + b N`` to the target's
forward time over tree sizes; c = b / a). It commits ``1 + S_N`` tokens in expectation, S_N the sum of
the first N nodes' path probabilities under the drafter's marginals (``node_path_probs``, the
surrogate DDTree maximises). The rule keeps, per row, the N in 1..budget that maximises
``(1 + S_N) / (1 + c N)``, the expected tokens per unit of cost. Builders emit nodes best first, so
every prefix of a tree is itself a tree (prefix-closed), and a shorter prefix is the tree the
builder would have built with that budget.

The forward's width is the widest row's N (one host sync per round reads it); narrower rows pad.
"""

from __future__ import annotations

import torch

from dllm.drafters.trees.tree import Tree, path_probs


def node_path_probs(tree: Tree, log_probs: torch.Tensor) -> torch.Tensor:
    """[R, N] float32: per node the product of the drafter's marginals along its path (0 on padding)."""
    return path_probs(tree, log_probs)


def best_sizes(tree: Tree, log_probs: torch.Tensor, cost_per_node: float) -> torch.Tensor:
    """[R] long: the number of leading nodes that maximises (1 + S_N) / (1 + c N), N in 1..size."""
    s = node_path_probs(tree, log_probs).cumsum(dim=1)  # [R, N] S_1..S_N
    n = torch.arange(1, tree.size + 1, device=s.device, dtype=s.dtype)
    value = (1.0 + s) / (1.0 + cost_per_node * n)  # [R, N]
    value = torch.where(tree.valid, value, torch.full_like(value, -1.0))  # padding never chosen
    return value.argmax(dim=1) + 1


def prune_for_cost(tree: Tree, log_probs: torch.Tensor, cost_per_node: float) -> Tree:
    """The tree cut to each row's best size (``best_sizes``), narrowed to the widest row's."""
    keep_n = best_sizes(tree, log_probs, cost_per_node)  # [R]
    width = int(keep_n.max())  # host sync: the forward's width
    keep = torch.arange(width, device=keep_n.device)[None, :] < keep_n[:, None]  # [R, width]
    valid = tree.valid[:, :width] & keep
    zeros = torch.zeros_like(tree.tokens[:, :width])
    return Tree(tokens=torch.where(valid, tree.tokens[:, :width], zeros),
                parents=torch.where(valid, tree.parents[:, :width], zeros - 1),
                depths=torch.where(valid, tree.depths[:, :width], zeros), valid=valid)


__all__ = ["best_sizes", "node_path_probs", "prune_for_cost"]
