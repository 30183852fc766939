"""Draft trees verified in one target forward: the walk, losslessness against target.generate
(batch 1 and ragged, greedy), and the errors."""

import pytest
import torch

from dllm.drafters.base import make_drafter
from dllm.drafters.dflash.io import random_dflash
from dllm.drafters.loop import speculative_generate
from dllm.drafters.plan import Plan
from dllm.drafters.trees import Tree
from dllm.drafters.trees.verify import tree_inputs, walk_tree
from dllm.drafters.verify import SamplingParams
from tests.drafters.speculative_helpers import hf_greedy, tiny_target


def hand_tree() -> Tree:
    """root -> a(5) -> c(7); root -> b(6) -> d(8) -> e(9)   (node indices 1..5 in [root, nodes])."""
    return Tree(tokens=torch.tensor([[5, 6, 7, 8, 9]]), parents=torch.tensor([[-1, -1, 0, 1, 3]]),
                depths=torch.tensor([[1, 1, 2, 2, 3]]), valid=torch.ones(1, 5, dtype=torch.bool))


def logits_choosing(choices: list[int], vocab: int = 12) -> torch.Tensor:
    """[1, 6, V] logits whose arg-max at [root, nodes...][i] is choices[i]."""
    out = torch.zeros(1, len(choices), vocab)
    out[0, torch.arange(len(choices)), torch.tensor(choices)] = 5.0
    return out


def test_walk_follows_the_target_through_the_tree_and_emits_its_choice():
    tree = hand_tree()
    # root picks 6 (b), b picks 8 (d), d picks 9 (e), e picks 3 (no child): path b, d, e, then 3
    path, acc, nxt = walk_tree(logits_choosing([6, 0, 8, 0, 9, 3]), tree, SamplingParams(0.0), max_depth=3)
    assert path.tolist() == [[2, 4, 5]] and acc.tolist() == [3] and nxt.tolist() == [3]
    # root picks 5 (a), a picks 1 (no child 1): path a, then 1
    path, acc, nxt = walk_tree(logits_choosing([5, 1, 0, 0, 0, 0]), tree, SamplingParams(0.0), max_depth=3)
    assert path.tolist() == [[1, 0, 0]] and acc.tolist() == [1] and nxt.tolist() == [1]
    # root picks 4: nothing accepted
    _, acc, nxt = walk_tree(logits_choosing([4, 0, 0, 0, 0, 0]), tree, SamplingParams(0.0), max_depth=3)
    assert acc.tolist() == [0] and nxt.tolist() == [4]


def test_tree_inputs_positions_and_ancestor_mask():
    ids, pos, mask = tree_inputs(torch.tensor([3]), torch.tensor([10]), hand_tree())
    assert ids.tolist() == [[3, 5, 6, 7, 8, 9]] and pos.tolist() == [[10, 11, 11, 12, 12, 13]]
    expect = [[1, 0, 0, 0, 0, 0], [1, 1, 0, 0, 0, 0], [1, 0, 1, 0, 0, 0], [1, 1, 0, 1, 0, 0],
              [1, 0, 1, 0, 1, 0], [1, 0, 1, 0, 1, 1]]
    assert mask[0].long().tolist() == expect


@pytest.fixture(scope="module")
def pair():
    target = tiny_target(vocab=24, hidden=64, eos=None, init=0.5, seed=1)
    drafter = random_dflash(target.config, 1, 6, 23, seed=2)
    return target, make_drafter("dflash", model=drafter)


PROMPTS = [[1, 5, 3, 9, 2, 7, 4], [2, 8], [6, 6, 1, 3, 11]]


@pytest.mark.parametrize("tree", [None, "chain:budget=5", "ddtree:budget=12", "taps:budget=12"])
def test_greedy_trees_equal_target_generate_on_a_ragged_batch(pair, tree):
    target, drafter = pair
    out = speculative_generate(target, drafter, PROMPTS, max_new_tokens=20, eos_token_id=[], plan=Plan(tree=tree))
    for row, prompt in zip(out.generated, PROMPTS):
        ref = target.generate(torch.tensor([prompt]), max_new_tokens=20, do_sample=False, min_new_tokens=20)
        assert row == ref[0, len(prompt):].tolist()


def test_chain_tree_equals_the_chain_round(pair):
    target, drafter = pair
    chain = speculative_generate(target, drafter, PROMPTS[:1], max_new_tokens=20, eos_token_id=[])
    tree = speculative_generate(target, drafter, PROMPTS[:1], max_new_tokens=20, eos_token_id=[],
                                plan=Plan(tree="chain:budget=5"))
    assert tree.generated == chain.generated and tree.acceptance == chain.acceptance


def test_sampled_trees_are_reproducible(pair):
    target, drafter = pair
    runs = [speculative_generate(target, drafter, PROMPTS, max_new_tokens=12, temperature=1.0, seed=4, eos_token_id=[],
                                 plan=Plan(tree="ddtree:budget=8")) for _ in range(2)]
    assert runs[0].generated == runs[1].generated


def test_a_tree_needs_a_drafter_with_distributions():
    target = tiny_target(vocab=24, hidden=32, eos=None, seed=1)
    # refused before the call runs (Drafter.gives_distributions), also where no round would build a tree
    for plan, n in ((Plan(block_size=4, tree="ddtree:budget=8"), 8), (Plan(block_size=4, tree="ddtree:budget=8"), 1),
                    (Plan(block_size=1, tree="ddtree:budget=8"), 8)):
        with pytest.raises(ValueError, match="returns tokens only"):
            speculative_generate(target, "ngram", PROMPTS[:1], max_new_tokens=n, plan=plan)
    with pytest.raises(ValueError, match="verify-length policy needs the inner drafter's per-position distributions, "
                                         "but 'ngram' returns tokens only"):
        speculative_generate(target, "scheduled:inner=(ngram)", PROMPTS[:1], max_new_tokens=1)
    with pytest.raises(ValueError, match="budget"):
        speculative_generate(target, "ngram", PROMPTS[:1], max_new_tokens=8,
                             plan=Plan(block_size=4, tree="ddtree:budget=0"))


@pytest.mark.parametrize("seed", range(6))
def test_the_vectorised_walk_equals_the_reference_walk(seed):
    from dllm.drafters.trees import make_tree_builder
    from dllm.drafters.trees.verify import walk_tree_reference

    g = torch.Generator().manual_seed(seed)
    r, k, v = 4, 5, 6
    lp = torch.log_softmax(torch.randn(r, k, v, generator=g) * 2, dim=-1)
    tree = make_tree_builder(f"ddtree:budget={3 + 4 * seed}").build(lp)
    # target logits that often agree with the drafter: at a node of depth d, the marginal of depth d + 1
    nxt = tree.depths.clamp(max=k - 1)[:, :, None].expand(-1, -1, v)  # [R, N, V] index of depth d + 1
    depth_lp = lp.gather(1, nxt)
    logits = torch.cat([lp[:, :1], depth_lp], dim=1) * 3 + torch.randn(r, 1 + tree.size, v, generator=g) * 0.5
    fast = walk_tree(logits, tree, SamplingParams(0.0), k)
    ref = walk_tree_reference(logits, tree, SamplingParams(0.0), k)
    assert all(torch.equal(a, b) for a, b in zip(fast, ref))
    assert ref[1].max() > 0  # some rows accept drafts


def test_a_tree_larger_than_the_cache_allows_is_refused(pair):
    target, drafter = pair  # max_position_embeddings 512
    with pytest.raises(ValueError, match="needs 528 cache slots, more than the target's max_position_embeddings 512"):
        speculative_generate(target, drafter, PROMPTS[:1], max_new_tokens=20, plan=Plan(tree="ddtree:budget=500"))


def test_a_sliding_window_target_refuses_a_tree_and_keeps_the_chain():
    """A sliding-window layer keeps a window of cache slots, so a tree's 4-D mask over every slot does not
    fit it (transformers raised 'The size of tensor a (11) must match the size of tensor b (14)' at the
    first round past the window): refused before the call runs, naming the tree; the chain still runs."""
    target = tiny_target("qwen3", seed=2, use_sliding_window=True, sliding_window=5, max_window_layers=0)
    drafter = make_drafter("dflash", model=random_dflash(target.config, 1, 4, 100, seed=5))
    prompt = [1, 5, 7, 9, 11, 13, 3]
    with pytest.raises(ValueError, match="sliding-window layers, which cannot verify the draft trees of 'ddtree:budget=6'"):
        speculative_generate(target, drafter, [prompt], max_new_tokens=12, plan=Plan(block_size=4, tree="ddtree:budget=6"))
    out = speculative_generate(target, drafter, [prompt], max_new_tokens=12, plan=4, eos_token_id=[])
    assert out.generated[0] == hf_greedy(target, prompt, 12, eos=None)
