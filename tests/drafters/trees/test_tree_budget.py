"""The budget rule: a tree is cut where expected tokens per unit of verification cost peak, every
cut is the builder's own tree at that budget, and decoding stays lossless."""

import pytest
import torch

from dllm.drafters.trees import make_tree_builder
from dllm.drafters.trees.budget import best_sizes, node_path_probs, prune_for_cost


def random_log_probs(seed: int, r: int = 3, k: int = 5, v: int = 7) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return torch.log_softmax(torch.randn(r, k, v, generator=g) * 2.0, dim=-1)


def test_no_cost_keeps_the_budget_and_a_large_cost_keeps_one_node():
    lp = random_log_probs(0)
    tree = make_tree_builder("ddtree:budget=12").build(lp)
    assert best_sizes(tree, lp, 0.0).tolist() == [12, 12, 12]
    assert best_sizes(tree, lp, 1e6).tolist() == [1, 1, 1]


def test_the_chosen_size_maximises_tokens_per_cost():
    lp = random_log_probs(1)
    tree = make_tree_builder("ddtree:budget=16").build(lp)
    p = node_path_probs(tree, lp)
    for c in (0.01, 0.05, 0.2):
        n = best_sizes(tree, lp, c)
        for row in range(3):
            values = [(1 + float(p[row, :m].sum())) / (1 + c * m) for m in range(1, 17)]
            assert int(n[row]) == 1 + max(range(16), key=values.__getitem__)


@pytest.mark.parametrize("name", ["ddtree", "taps"])
def test_a_cut_tree_is_the_builder_tree_at_that_budget(name):
    lp = random_log_probs(2, r=1)
    full = make_tree_builder(f"{name}:budget=20")
    cut = prune_for_cost(full.build(lp), lp, 0.05)
    m = int(cut.valid.sum())
    small = make_tree_builder(f"{name}:budget={m}").build(lp)
    assert cut.tokens[:, :m].tolist() == small.tokens.tolist() and cut.parents[:, :m].tolist() == small.parents.tolist()


def test_cost_option_is_validated_and_reaches_the_loop():
    with pytest.raises(ValueError, match="cost_per_node"):
        make_tree_builder("ddtree:cost_per_node=-1")
    from dllm.drafters.base import make_drafter
    from dllm.drafters.dflash.io import random_dflash
    from dllm.drafters.loop import speculative_generate
    from dllm.drafters.plan import Plan
    from tests.drafters.speculative_helpers import tiny_target

    target = tiny_target(vocab=24, hidden=64, eos=None, init=0.5, seed=1)
    drafter = make_drafter("dflash", model=random_dflash(target.config, 1, 6, 23, seed=2))
    prompts = [[1, 5, 3, 9, 2], [2, 8]]
    out = speculative_generate(target, drafter, prompts, max_new_tokens=15, eos_token_id=[],
                               plan=Plan(tree="ddtree:budget=24,cost_per_node=0.05"))
    for row, prompt in zip(out.generated, prompts):
        ref = target.generate(torch.tensor([prompt]), max_new_tokens=15, do_sample=False, min_new_tokens=15)
        assert row == ref[0, len(prompt):].tolist()
