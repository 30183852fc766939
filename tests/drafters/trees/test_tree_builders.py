"""Draft trees: the Tree structure, ancestor_mask, and the chain / ddtree / taps builders."""

from __future__ import annotations

import itertools
import math

import pytest
import torch

from dllm.drafters.trees import (Tree, TreeBuilder, ancestor_mask, best_first_tree, chain_tree, expected_accepted,
                                list_tree_builders, make_tree_builder)


def random_log_probs(seed: int, r: int = 3, k: int = 5, v: int = 7, scale: float = 2.0) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return (torch.randn((r, k, v), generator=g) * scale).log_softmax(-1)


def check_structure(tree: Tree) -> None:
    """Topological order, depth = parent's + 1, padding last and inert."""
    r, n = tree.tokens.shape
    for t in (tree.tokens, tree.parents, tree.depths, tree.valid):
        assert t.shape == (r, n)
    assert tree.size == n
    assert tree.tokens.dtype == tree.parents.dtype == tree.depths.dtype == torch.long
    assert tree.valid.dtype == torch.bool
    for row in range(r):
        valid = tree.valid[row].tolist()
        used = sum(valid)
        assert valid == [True] * used + [False] * (n - used)  # padding last
        for i in range(used):
            p, d = int(tree.parents[row, i]), int(tree.depths[row, i])
            assert -1 <= p < i  # topological
            assert d == (1 if p < 0 else int(tree.depths[row, p]) + 1)
        for i in range(used, n):
            assert int(tree.parents[row, i]) == -1 and int(tree.depths[row, i]) == 0


def node_paths(tree: Tree, row: int) -> set[tuple[int, ...]]:
    """The valid nodes of a row as token paths from the root (a node set independent of order)."""
    paths: list[tuple[int, ...]] = []
    for i in range(tree.size):
        if not tree.valid[row, i]:
            break
        p = int(tree.parents[row, i])
        paths.append((paths[p] if p >= 0 else ()) + (int(tree.tokens[row, i]),))
    assert len(set(paths)) == len(paths)  # no two siblings share a token
    return set(paths)


# ---- the structure ---------------------------------------------------------------------------------
def hand_tree() -> Tree:
    #  root -> 0 -> 1 -> 3
    #            -> 2
    #       -> 4 -> 5           (slot 6: padding)
    parents = torch.tensor([[-1, 0, 0, 1, -1, 4, -1]])
    depths = torch.tensor([[1, 2, 2, 3, 1, 2, 0]])
    valid = torch.tensor([[True] * 6 + [False]])
    return Tree(tokens=torch.tensor([[10, 11, 12, 13, 14, 15, 0]]), parents=parents, depths=depths, valid=valid)


def test_ancestor_mask_of_a_hand_built_tree():
    expected = torch.tensor([
        [1, 0, 0, 0, 0, 0, 0],
        [1, 1, 0, 0, 0, 0, 0],
        [1, 0, 1, 0, 0, 0, 0],
        [1, 1, 0, 1, 0, 0, 0],
        [0, 0, 0, 0, 1, 0, 0],
        [0, 0, 0, 0, 1, 1, 0],
        [0, 0, 0, 0, 0, 0, 1],
    ], dtype=torch.bool)
    tree = hand_tree()
    check_structure(tree)
    assert torch.equal(ancestor_mask(tree)[0], expected)


def test_ancestor_mask_of_a_long_path_and_of_one_node():
    tree = chain_tree(torch.arange(13).view(1, 13))
    assert torch.equal(ancestor_mask(tree)[0], torch.ones(13, 13, dtype=torch.bool).tril())
    one = chain_tree(torch.tensor([[5]]))
    assert torch.equal(ancestor_mask(one), torch.ones(1, 1, 1, dtype=torch.bool))


def test_chain_tree_is_a_path():
    tokens = torch.tensor([[4, 5, 6], [7, 8, 9]])
    tree = chain_tree(tokens)
    check_structure(tree)
    assert torch.equal(tree.tokens, tokens)
    assert tree.parents.tolist() == [[-1, 0, 1]] * 2
    assert tree.depths.tolist() == [[1, 2, 3]] * 2
    assert bool(tree.valid.all())


def test_expected_accepted_of_a_hand_built_tree():
    log_probs = torch.full((1, 3, 16), -math.inf)
    q = {(0, 10): 0.5, (0, 14): 0.25, (1, 11): 0.4, (1, 12): 0.3, (1, 15): 0.2, (2, 13): 0.5}
    for (d, tok), p in q.items():
        log_probs[0, d, tok] = math.log(p)
    want = 0.5 + 0.5 * 0.4 + 0.5 * 0.3 + 0.5 * 0.4 * 0.5 + 0.25 + 0.25 * 0.2  # padding adds nothing
    assert expected_accepted(hand_tree(), log_probs).item() == pytest.approx(want)


# ---- builders ------------------------------------------------------------------------------------
def test_chain_builder_is_the_top1_path():
    log_probs = random_log_probs(0)
    tree = make_tree_builder("chain:budget=32").build(log_probs)
    check_structure(tree)
    assert torch.equal(tree.tokens, log_probs.argmax(-1))
    short = make_tree_builder("chain", budget=2).build(log_probs)
    assert short.size == 2 and torch.equal(short.tokens, log_probs[:, :2].argmax(-1))


def two_depth_example() -> torch.Tensor:
    # depth 1: token 2 -> .7, 0 -> .2, 1 -> .1 ; depth 2: token 1 -> .6, 2 -> .3, 0 -> .1
    q = torch.tensor([[[0.2, 0.1, 0.7], [0.1, 0.6, 0.3]]])
    return q.log()


def test_ddtree_hand_example():
    # path scores: A=(2) .7, (2,1) .42, (2,2) .21, B=(0) .2, (0,1) .12, (1) .1, (2,0) .07, ...
    tree = make_tree_builder("ddtree:budget=4").build(two_depth_example())
    check_structure(tree)
    assert tree.tokens.tolist() == [[2, 1, 2, 0]]  # pop order
    assert tree.parents.tolist() == [[-1, 0, 0, -1]]
    assert tree.depths.tolist() == [[1, 2, 2, 1]]
    five = make_tree_builder("ddtree", budget=5).build(two_depth_example())
    assert node_paths(five, 0) == {(2,), (2, 1), (2, 2), (0,), (0, 1)}
    assert expected_accepted(five, two_depth_example()).item() == pytest.approx(0.7 + 0.42 + 0.21 + 0.2 + 0.12)


@pytest.mark.slow  # seconds: the default run leaves it to -m slow (CI runs both)
def test_ddtree_is_the_best_prefix_closed_subtree_by_brute_force():
    k, v, budget = 3, 3, 5
    for seed in range(5):
        log_probs = random_log_probs(seed, r=1, k=k, v=v)
        got = expected_accepted(make_tree_builder("ddtree", budget=budget).build(log_probs), log_probs).item()
        # every path of length 1..K; the best prefix-closed set of `budget` of them
        paths = [p for d in range(1, k + 1) for p in itertools.product(range(v), repeat=d)]
        value = {p: math.exp(sum(log_probs[0, i, t].item() for i, t in enumerate(p))) for p in paths}
        best = max(sum(value[p] for p in subset) for subset in itertools.combinations(paths, budget)
                   if all(len(p) == 1 or p[:-1] in subset for p in subset))
        assert got == pytest.approx(best, rel=1e-5)


def test_ddtree_with_one_hot_marginals_at_budget_k_is_the_chain():
    tokens = torch.tensor([[3, 1, 4, 1, 5], [2, 7, 1, 8, 2]])
    log_probs = torch.full((2, 5, 9), -30.0).scatter(-1, tokens.unsqueeze(-1), 0.0).log_softmax(-1)
    tree = make_tree_builder("ddtree", budget=5).build(log_probs)
    check_structure(tree)
    chain = chain_tree(tokens)
    for name in ("tokens", "parents", "depths", "valid"):
        assert torch.equal(getattr(tree, name), getattr(chain, name))


@pytest.mark.parametrize("budget", [1, 3, 8, 20])
def test_ddtree_surrogate_beats_chain_and_taps(budget):
    ddtree = make_tree_builder("ddtree", budget=budget)
    chain = make_tree_builder("chain", budget=budget)
    taps = make_tree_builder("taps", budget=budget, gamma=0.5, decay=0.7)
    for seed in range(40):
        log_probs = random_log_probs(seed)
        best = expected_accepted(ddtree.build(log_probs), log_probs)
        assert bool((best >= expected_accepted(chain.build(log_probs), log_probs) - 1e-6).all())
        assert bool((best >= expected_accepted(taps.build(log_probs), log_probs) - 1e-6).all())


@pytest.mark.parametrize("budget", [1, 6, 25])
def test_taps_without_penalty_equals_ddtree(budget):
    ddtree = make_tree_builder("ddtree", budget=budget)
    taps = make_tree_builder(f"taps:budget={budget},gamma=0,decay=1")
    for seed in range(20):
        log_probs = random_log_probs(seed, scale=3.0)
        a, b = ddtree.build(log_probs), taps.build(log_probs)
        for row in range(log_probs.shape[0]):
            assert node_paths(a, row) == node_paths(b, row)


@pytest.mark.parametrize("spec", ["taps", "taps:gamma=1", "taps:decay=0.3", "taps:gamma=0.5,decay=0.5"])
def test_taps_trees_are_prefix_closed_and_penalise_deviations(spec):
    builder = make_tree_builder(spec, budget=12)
    for seed in range(10):
        log_probs = random_log_probs(seed)
        tree = builder.build(log_probs)
        check_structure(tree)  # parents precede children: prefix-closed
        for row in range(tree.tokens.shape[0]):
            paths = node_paths(tree, row)
            assert len(paths) == 12 and all(len(p) == 1 or p[:-1] in paths for p in paths)
    # ddtree: (0) .6, (0,0) .42, (1) .4, (1,0) .28, (0,1) .18; taps gamma=2: (1,0) -> .28 * (.4/.6)**2 = .124
    log_probs = torch.tensor([[[0.6, 0.4], [0.7, 0.3]]]).log()
    dd = make_tree_builder("ddtree", budget=4).build(log_probs)
    assert node_paths(dd, 0) == {(0,), (0, 0), (1,), (1, 0)}
    strict = make_tree_builder("taps", budget=4, gamma=2.0).build(log_probs)
    assert node_paths(strict, 0) == {(0,), (0, 0), (1,), (0, 1)}


def test_batch_rows_get_independent_trees():
    log_probs = random_log_probs(3, r=4)
    for spec in ("chain:budget=4", "ddtree:budget=9", "taps:budget=9"):
        builder = make_tree_builder(spec)
        batch = builder.build(log_probs)
        for row in range(4):
            alone = builder.build(log_probs[row:row + 1])
            for name in ("tokens", "parents", "depths", "valid"):
                assert torch.equal(getattr(batch, name)[row:row + 1], getattr(alone, name)), (spec, row, name)


@pytest.mark.parametrize("name", ["ddtree", "taps"])
def test_padding_when_fewer_nodes_than_budget(name):
    log_probs = random_log_probs(1, r=2, k=2, v=2)  # at most 2 + 4 = 6 nodes
    tree = make_tree_builder(name, budget=10).build(log_probs)
    check_structure(tree)
    assert tree.size == 10
    assert tree.valid.tolist() == [[True] * 6 + [False] * 4] * 2
    assert tree.tokens[:, 6:].eq(0).all() and len(node_paths(tree, 0)) == 6
    mask = ancestor_mask(tree)
    assert torch.equal(mask[:, 6:, :], torch.eye(10, dtype=torch.bool)[6:].expand(2, 4, 10))


def test_budget_larger_than_k_and_v_and_deep_chains():
    log_probs = random_log_probs(2, r=1, k=1, v=3)
    tree = make_tree_builder("ddtree", budget=2).build(log_probs)
    assert tree.depths.tolist() == [[1, 1]]
    assert tree.tokens[0].tolist() == log_probs[0, 0].argsort(descending=True)[:2].tolist()
    log_probs = random_log_probs(2, r=1, k=12, v=1)  # V = 1: the only tree is the path
    assert torch.equal(best_first_tree(log_probs, 12).parents, chain_tree(torch.zeros(1, 12).long()).parents)


@pytest.mark.parametrize("bad", [0, -3, 2.5, True, "8", None])
def test_bad_budget_names_it(bad):
    for name in ("chain", "ddtree", "taps"):
        with pytest.raises(ValueError, match="budget must be an integer >= 1.*got"):
            make_tree_builder(name, budget=bad)


def test_bad_taps_options_name_them():
    with pytest.raises(ValueError, match="decay"):
        make_tree_builder("taps:decay=0")
    with pytest.raises(ValueError, match="gamma"):
        make_tree_builder("taps:gamma=-1")
    with pytest.raises(TypeError, match="Valid options"):
        make_tree_builder("ddtree:gamma=1")


def test_registry():
    builder = make_tree_builder("ddtree:budget=8")
    assert isinstance(builder, TreeBuilder) and builder.config.budget == 8 and builder.spec == "ddtree:budget=8"
    assert make_tree_builder(builder) is builder
    assert make_tree_builder({"name": "taps", "budget": 3}).config.budget == 3
    assert {"chain", "ddtree", "taps"} <= {name for name, _ in list_tree_builders()}
    with pytest.raises(KeyError, match="Unknown tree builder 'bogus'.*chain.*ddtree.*taps"):
        make_tree_builder("bogus")


def test_bad_log_probs():
    with pytest.raises(ValueError, match=r"\[R, K, V\]"):
        make_tree_builder("ddtree").build(torch.zeros(3, 4))
    with pytest.raises(ValueError, match="K >= 1"):
        make_tree_builder("ddtree").build(torch.zeros(2, 0, 4))
