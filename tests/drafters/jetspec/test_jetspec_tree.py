"""The ``jetspec`` tree builder (``accum_logp``) against the authors' builder transcribed in
``tests/reference/decoders/jetspec_generate.py``, ties included, and its place among the tree builders
(prefix-closed, the budget rule, options)."""

import pytest
import torch

from dllm.drafters.jetspec.tree import JetSpecTreeBuilder, accum_logp_tree
from dllm.drafters.trees.budget import best_sizes, prune_for_cost
from dllm.drafters.trees.builders import make_tree_builder
from dllm.drafters.trees.tree import ancestor_mask
from tests.reference.decoders.jetspec_generate import build_tree


def reference_rows(logits: torch.Tensor, width: int, budget: int) -> list[tuple[list[int], list[int], list[int]]]:
    """The authors' trees of each row (their budget counts the root), as (tokens, parents, depths) of the drafts."""
    out = []
    for row in logits:
        tokens, parents, depths = build_tree(-1, row, width, budget + 1)
        out.append((tokens[1:], [p - 1 for p in parents[1:]], depths[1:]))
    return out


def ours(tree, row: int) -> tuple[list[int], list[int], list[int]]:
    n = int(tree.valid[row].sum())
    assert bool(tree.valid[row, :n].all())  # padding comes last
    return (tree.tokens[row, :n].tolist(), tree.parents[row, :n].tolist(), tree.depths[row, :n].tolist())


@pytest.mark.parametrize("width,budget", [(7, 63), (3, 15), (7, 255), (1, 8), (5, 40)])
@pytest.mark.parametrize("ties", [False, True])
def test_the_tree_is_the_authors_tree(width, budget, ties):
    g = torch.Generator().manual_seed(width * 1000 + budget)
    logits = torch.randn((6, 15, 40), generator=g) * 2.0  # [R, K, V]
    if ties:  # coarse logits: equal log-probs within a depth and equal path scores across depths
        logits = (logits * 1.5).round() / 1.5
    log_probs = torch.log_softmax(logits, dim=-1)
    tree = accum_logp_tree(log_probs, budget, width)
    assert tree.tokens.shape == (6, budget)
    for row, ref in enumerate(reference_rows(logits, width, budget)):
        assert ours(tree, row) == ref


def test_the_tree_stops_at_the_last_depth_and_pads():
    log_probs = torch.log_softmax(torch.randn((2, 2, 10), generator=torch.Generator().manual_seed(0)), dim=-1)
    tree = accum_logp_tree(log_probs, budget=40, width=3)  # 3 + 9 = 12 nodes exist at K = 2
    assert tree.valid.sum(1).tolist() == [12, 12]
    assert (tree.tokens[:, 12:] == 0).all() and (tree.parents[:, 12:] == -1).all() and (tree.depths[:, 12:] == 0).all()
    assert tree.depths[:, :12].max() == 2


def test_prefixes_are_the_trees_of_smaller_budgets_so_the_budget_rule_applies():
    g = torch.Generator().manual_seed(1)
    log_probs = torch.log_softmax(torch.randn((3, 8, 30), generator=g) * 2, dim=-1)
    big = accum_logp_tree(log_probs, 63, 7)
    for budget in (1, 6, 7, 8, 20, 50):
        small = accum_logp_tree(log_probs, budget, 7)
        assert torch.equal(small.tokens, big.tokens[:, :budget]) and torch.equal(small.parents, big.parents[:, :budget])
    mask = ancestor_mask(big)  # parents precede children: ancestors sit at lower indices
    assert not torch.triu(mask, diagonal=1).any()
    builder = make_tree_builder("jetspec:budget=63,cost_per_node=0.05")
    pruned = builder.tree_for(log_probs)
    keep = best_sizes(big, log_probs, 0.05)
    assert pruned.valid.sum(1).tolist() == keep.tolist() and 1 <= int(keep.min()) < 63
    assert torch.equal(pruned.tokens, prune_for_cost(big, log_probs, 0.05).tokens)


def test_registry_alias_defaults_and_clear_errors():
    builder = make_tree_builder("accum_logp")
    assert isinstance(builder, JetSpecTreeBuilder) and builder.config.width == 7 and builder.config.budget == 63
    assert make_tree_builder("jetspec:budget=255,width=7").config.budget == 255
    with pytest.raises(ValueError, match=r"width must be an integer >= 1 .* got 0"):
        make_tree_builder("jetspec:width=0")
    with pytest.raises(TypeError, match=r"Unknown option\(s\) 'widht' for tree builder 'jetspec'. Valid options: "
                                        r"budget, cost_per_node, width"):
        make_tree_builder("jetspec:widht=3")
    with pytest.raises(ValueError, match=r"budget must be an integer >= 1"):
        make_tree_builder("jetspec:budget=0")
    with pytest.raises(ValueError, match=r"log_probs must be a float tensor \[R, K >= 1, V\]"):
        accum_logp_tree(torch.zeros((2, 3), dtype=torch.float32), 4, 2)
