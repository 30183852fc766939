"""The path head and the taps builder's learned estimator: select_subtree, path_inputs, the head's
files, the trainer, and taps with the shipped head on the tiny pair (lossless, more accepted)."""

import itertools
import json

import pytest
import torch

from dllm.drafters.trees.path_head import PathHead, PathScorer, has_path_head, load_path_head, path_inputs
from dllm.drafters.trees import (Tree, best_first_tree, make_tree_builder, path_reduce, path_reduce_reference,
                                path_scores, select_subtree)


def random_log_probs(r=1, k=3, v=3, seed=0):
    g = torch.Generator().manual_seed(seed)
    return torch.log_softmax(torch.randn(r, k, v, generator=g) * 2, dim=-1)


def node_paths(tree: Tree, row: int = 0) -> dict:
    """Each valid node's index -> its path of tokens from the root (an order-free identity of a node)."""
    paths, parents, tokens = {}, tree.parents[row].tolist(), tree.tokens[row].tolist()
    for i, ok in enumerate(tree.valid[row].tolist()):
        if ok:
            paths[i] = (paths[parents[i]] if parents[i] >= 0 else ()) + (tokens[i],)
    return paths


def node_keys(tree: Tree, row: int = 0) -> set:
    """The set of a row's node paths (equal sets = the same tree, whatever the node order)."""
    return set(node_paths(tree, row).values())


def check_tree(tree: Tree) -> None:
    """Topological order, depths = parent's + 1, padding last."""
    for row in range(tree.tokens.shape[0]):
        par, dep, val = tree.parents[row].tolist(), tree.depths[row].tolist(), tree.valid[row].tolist()
        assert val == sorted(val, reverse=True)
        for i, ok in enumerate(val):
            if ok:
                assert par[i] < i and dep[i] == (1 if par[i] < 0 else dep[par[i]] + 1)
            else:
                assert (par[i], dep[i]) == (-1, 0)


@pytest.mark.parametrize("seed", range(4))
@pytest.mark.parametrize("budget", [1, 3, 5])
def test_select_subtree_is_the_best_prefix_closed_subtree_by_brute_force(seed, budget):
    cand = best_first_tree(random_log_probs(seed=seed), 9)
    node_lp = -torch.rand(1, 9, generator=torch.Generator().manual_seed(seed + 10)) * 3  # any estimates <= 0
    chosen = select_subtree(cand, node_lp, budget)
    check_tree(chosen)
    score = path_scores(cand, node_lp)[0].exp().tolist()
    parents = cand.parents[0].tolist()
    best = max(sum(score[i] for i in subset) for subset in itertools.combinations(range(9), budget)
               if all(parents[i] < 0 or parents[i] in subset for i in subset))
    index_of = {path: i for i, path in node_paths(cand).items()}  # a candidate's token path -> its index
    kept = node_keys(chosen)
    assert len(kept) == budget
    assert sum(score[index_of[key]] for key in kept) == pytest.approx(best, rel=1e-6)


def test_ties_keep_the_parent_first():
    cand = best_first_tree(random_log_probs(k=4, v=2, seed=3), 8)
    zero = torch.zeros(1, 8)  # every node certain: all scores tie at 0
    for budget in range(1, 9):
        chosen = select_subtree(cand, zero, budget)
        check_tree(chosen)
        assert int(chosen.valid.sum()) == budget


def test_path_scores_never_rise_down_a_path():
    cand = best_first_tree(random_log_probs(r=3, k=5, v=4, seed=1), 20)
    node_lp = -torch.rand(3, 20) * torch.tensor([0.0, 1e-9, 1.0])[:, None]  # exact ties, near-ties, spread
    score = path_scores(cand, node_lp)
    parent = score.gather(1, cand.parents.clamp(min=0))
    assert bool(((score <= parent) | (cand.parents < 0)).all())


def test_padding_candidates_stay_padding():
    cand = best_first_tree(random_log_probs(k=1, v=2), 6)  # only 2 real nodes
    chosen = select_subtree(cand, torch.zeros(1, 6), 4)
    assert chosen.valid[0].tolist() == [True, True, False, False]
    check_tree(chosen)


def test_path_inputs_of_a_hand_built_tree():
    # root(anchor 7) -> a:1 (top at depth 1 is 1) -> b:2 (top at depth 2 is 3: deviation) -> c:5
    #               -> d:4 (deviation at depth 1) -> e:3
    tree = Tree(tokens=torch.tensor([[1, 2, 4, 5, 3]]), parents=torch.tensor([[-1, 0, -1, 1, 2]]),
                depths=torch.tensor([[1, 2, 1, 3, 2]]), valid=torch.ones(1, 5, dtype=torch.bool))
    top = torch.tensor([[1, 3, 5]])
    depth_idx, parent, parent_top, deviations = path_inputs(tree, top, torch.tensor([7]))
    assert depth_idx.tolist() == [[0, 1, 0, 2, 1]]
    assert parent.tolist() == [[7, 1, 7, 2, 4]]
    assert parent_top.tolist() == [[7, 1, 7, 3, 1]]
    assert deviations.tolist() == [[0, 0, 0, 1, 1]]


@pytest.mark.parametrize("seed", range(3))
def test_path_reduce_equals_the_mask_reference(seed):
    """Pointer doubling (the fast path) against the [R, N, N] ancestor-mask reduction, on trees with
    padding, long chains and depths below and at the bound."""
    g = torch.Generator().manual_seed(seed)
    for k, v, n in ((6, 3, 12), (20, 2, 20), (1, 5, 7)):
        tree = best_first_tree(torch.log_softmax(torch.randn(3, k, v, generator=g), -1), n)
        values = torch.randn(3, n, generator=g)
        ints = torch.randint(0, 2, (3, n), generator=g)
        assert torch.equal(path_reduce(tree, values, "min", k), path_reduce_reference(tree, values, "min"))
        assert torch.equal(path_reduce(tree, ints, "sum", k), path_reduce_reference(tree, ints, "sum"))
        assert torch.allclose(path_reduce(tree, values, "sum"), path_reduce_reference(tree, values, "sum"), atol=1e-6)
    with pytest.raises(ValueError, match="op must be 'sum' or 'min', got 'max'"):
        path_reduce(tree, values, "max")


def test_a_fresh_head_is_the_marginals_so_taps_equals_ddtree():
    """W2 starts at zero: the corrected states are the drafter's, so taps scores nodes by the
    marginals and keeps ddtree's tree."""
    g = torch.Generator().manual_seed(4)
    r, k, v, d = 2, 5, 6, 16
    states = torch.randn(r, k, d, generator=g)
    read = torch.randn(d, v, generator=g)
    log_probs = (states @ read).log_softmax(-1)
    scorer = PathScorer(PathHead(d, width=4).eval(), states, torch.tensor([0, 1]), torch.randn(v, d, generator=g),
                        lambda h: h @ read)
    for budget in (1, 4, 9):
        dd = make_tree_builder(f"ddtree:budget={budget}").build(log_probs)
        tp = make_tree_builder(f"taps:budget={budget}").build(log_probs, scorer)
        check_tree(tp)
        for row in range(r):
            assert node_keys(tp, row) == node_keys(dd, row)


def test_a_trained_like_head_changes_the_tree_but_keeps_it_valid():
    g = torch.Generator().manual_seed(5)
    r, k, v, d = 3, 6, 7, 16
    states = torch.randn(r, k, d, generator=g)
    read = torch.randn(d, v, generator=g)
    head = PathHead(d, width=8).eval()
    torch.nn.init.normal_(head.fc2.weight, std=2.0, generator=g)
    scorer = PathScorer(head, states, torch.tensor([0, 1, 2]), torch.randn(v, d, generator=g), lambda h: h @ read)
    log_probs = (states @ read).log_softmax(-1)
    tp = make_tree_builder("taps:budget=10").build(log_probs, scorer)
    check_tree(tp)
    assert int(tp.valid.sum()) == r * 10
    dd = make_tree_builder("ddtree:budget=10").build(log_probs)
    assert any(node_keys(tp, row) != node_keys(dd, row) for row in range(r))
    marginal = make_tree_builder("taps:budget=10,estimator=marginal").build(log_probs, scorer)
    assert torch.equal(marginal.tokens, make_tree_builder("taps:budget=10").build(log_probs).tokens)


def test_taps_options_and_errors(tiny_pair):
    from dllm.drafters.base import make_drafter
    from dllm.drafters.loop import speculative_generate
    from dllm.drafters.plan import Plan

    with pytest.raises(ValueError, match="estimator=head needs a drafter with a path head"):
        make_tree_builder("taps:estimator=head").build(random_log_probs())
    target, tok, _ = tiny_pair
    headless = make_drafter("dflash", model="tiny-ar-dflash-mixed")
    assert headless.path_head is None
    with pytest.raises(ValueError, match="estimator=head needs a drafter with a path head"):  # before any forward
        speculative_generate(target, headless, [[5, 6, 7]], max_new_tokens=4,
                             plan=Plan(tree="taps:estimator=head"))
    with pytest.raises(ValueError, match="estimator must be one of auto, head, marginal, got 'learned'"):
        make_tree_builder("taps:estimator=learned")
    with pytest.raises(ValueError, match="candidates"):
        make_tree_builder("taps:candidates=0")
    with pytest.raises(ValueError, match="PathHead needs"):
        PathHead(0)


def test_head_files_round_trip(tmp_path):
    head = PathHead(8, width=4, meta={"drafter": "x"})
    torch.nn.init.normal_(head.fc2.weight)
    assert not has_path_head(tmp_path)
    with pytest.raises(FileNotFoundError, match="path_head.json is missing"):
        load_path_head(tmp_path)
    head.save(tmp_path)
    assert has_path_head(tmp_path)
    back = load_path_head(tmp_path)
    assert back.meta == {"drafter": "x"} and not back.training
    for name, value in head.state_dict().items():
        assert torch.equal(value, back.state_dict()[name])


def test_examples_follow_the_target_path():
    from dllm.train.drafters.path_head_train import Anchors, examples

    # one anchor (token 9), K = 4: truth 1 2 3 -1; drafter arg-max 1 5 3 x
    lp = torch.full((1, 4, 10), -9.0)
    for depth, tok in enumerate([1, 5, 3, 0]):
        lp[0, depth, tok] = 0.0
    data = Anchors(states=torch.arange(4.0)[None, :, None].expand(1, 4, 2), log_probs=lp,
                   truth=torch.tensor([[1, 2, 3, -1]]), anchor=torch.tensor([9]))
    states, parent, parent_top, deviations, label = examples(data)
    assert label.tolist() == [1, 2, 3]
    assert parent.tolist() == [9, 1, 2] and parent_top.tolist() == [9, 1, 5]
    assert deviations.tolist() == [0, 0, 1] and states[:, 0].tolist() == [0.0, 1.0, 2.0]


@pytest.mark.slow  # seconds: the default run leaves it to -m slow (CI runs both)
def test_the_trainer_end_to_end(tmp_path):
    from dllm.train.drafters.path_head_train import main

    assert main(["--prompts", "6", "--epochs", "1", "--eval-n", "1", "--budgets", "4", "8",
                 "--out", str(tmp_path)]) == 0
    head = load_path_head(tmp_path)
    meta = json.loads((tmp_path / "path_head.json").read_text())["meta"]
    assert set(meta["evaluation"]["tau"]) == {"4", "8"} and head.hidden_size == 128
    for row in meta["evaluation"]["tau"].values():
        assert 1.0 <= row["ddtree"] <= 16 and 1.0 <= row["taps"] <= 16


def test_the_shipped_head_makes_taps_lossless_and_accept_more(tiny_pair):
    from dllm.drafters.loop import speculative_generate
    from dllm.drafters.plan import Plan
    from tests.drafters.speculative_helpers import long_answer_prompts

    target, tok, drafter = tiny_pair
    assert drafter.path_head is not None  # shipped beside tiny-ar-dflash
    _, ids = long_answer_prompts(tok)
    chain = speculative_generate(target, drafter, ids, max_new_tokens=66, tokenizer=tok)
    dd = speculative_generate(target, drafter, ids, max_new_tokens=66, tokenizer=tok,
                              plan=Plan(tree="ddtree:budget=16"))
    tp = speculative_generate(target, drafter, ids, max_new_tokens=66, tokenizer=tok,
                              plan=Plan(tree="taps:budget=16"))
    assert tp.generated == chain.generated == dd.generated  # = target.generate (test_tiny_pair)
    assert tp.tau > dd.tau


def test_a_bfloat16_drafter_with_a_float32_head():
    """The head casts its inputs to its own dtype and its correction back to the states' dtype."""
    from dllm.drafters import load_path_head as lazy_load

    assert lazy_load is load_path_head
    g = torch.Generator().manual_seed(6)
    r, k, v, d = 2, 4, 9, 8
    states = torch.randn(r, k, d, generator=g).bfloat16()
    read = torch.randn(d, v, generator=g).bfloat16()
    head = PathHead(d, width=4).eval()
    torch.nn.init.normal_(head.fc2.weight, generator=g)
    scorer = PathScorer(head, states, torch.tensor([0, 1]), torch.randn(v, d, generator=g).bfloat16(),
                        lambda h: h @ read)
    log_probs = (states @ read).float().log_softmax(-1)
    tree = make_tree_builder("taps:budget=6").build(log_probs, scorer)
    check_tree(tree)
    node = scorer.node_log_accept(tree, log_probs)
    assert node.dtype == torch.float32 and bool(torch.isfinite(node).all()) and bool((node <= 0).all())
