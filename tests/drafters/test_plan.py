"""One speculative Plan (block size + tree, or "auto") given by ``plan=``, the one way to say it; the
chain is the width-1 tree of the one round body."""

import pytest

from dllm.models.targets import load_target
from dllm.drafters.loop import speculative_generate
from dllm.drafters.plan import Plan, as_plan
from tests.drafters.speculative_helpers import long_answer_prompts


@pytest.fixture(scope="module")
def ar():
    return load_target("tiny-ar")


def test_plan_forms():
    assert as_plan(8) == Plan(block_size=8) and as_plan("auto") == Plan(head="auto") == Plan.auto()
    assert as_plan(None) == Plan() and as_plan(Plan(block_size=8, tree="ddtree")) == Plan(block_size=8, tree="ddtree")
    with pytest.raises(ValueError, match="give head= alone"):
        Plan(block_size=8, head="auto")
    with pytest.raises(ValueError, match="a Plan with a block head picks each row's block size and tree itself"):
        Plan(head="auto", tree="ddtree")
    for bad in (0, True, 2.0, "big"):
        with pytest.raises(ValueError, match=r"plan must be a Plan, 'auto', a BlockHead or a positive int"):
            as_plan(bad)


@pytest.mark.parametrize("keyword", ["block_size", "tree"])
def test_the_block_size_and_the_tree_are_given_as_the_plan(ar, keyword):
    """``block_size=`` and ``tree=`` are not keywords of speculative_generate: a TypeError that points
    at ``plan=``; any other unknown keyword is a TypeError naming it."""
    target, tok = ar
    prompt = "[BOS] copy_long A B C [SEP]"
    with pytest.raises(TypeError, match=rf"unexpected keyword argument '{keyword}'.*plan=8, "
                                        r"plan=Plan\(block_size=16, tree='ddtree:budget=16'\) or plan='auto'"):
        speculative_generate(target, "ngram", prompt, max_new_tokens=4, tokenizer=tok, **{keyword: 8})
    with pytest.raises(TypeError, match=r"unexpected keyword argument 'colour'$"):
        speculative_generate(target, "ngram", prompt, max_new_tokens=4, tokenizer=tok, colour="red")
    with pytest.raises(ValueError, match=r"plan must be a Plan, 'auto', a BlockHead or a positive int"):
        speculative_generate(target, "ngram", prompt, max_new_tokens=4, tokenizer=tok, plan="big")
    assert speculative_generate(target, "ngram", prompt, max_new_tokens=4, tokenizer=tok, plan=8).block_size == 8


@pytest.mark.slow
def test_the_chain_is_the_width_1_tree(tiny_pair):
    """Greedy, the chain builder's tree (the arg-max path) through the tree walk commits exactly what
    the chain's verification commits, round by round; plan=8 and Plan(block_size=8) are the same call."""
    target, tok, drafter = tiny_pair
    _, ids = long_answer_prompts(tok)
    ids = ids[:4]
    chain = speculative_generate(target, drafter, ids, max_new_tokens=40, plan=8)
    tree = speculative_generate(target, drafter, ids, max_new_tokens=40,
                                plan=Plan(block_size=8, tree="chain:budget=7"))
    same = speculative_generate(target, drafter, ids, max_new_tokens=40, plan=Plan(block_size=8))
    assert tree.generated == chain.generated == same.generated
    assert tree.acceptance == chain.acceptance == same.acceptance
