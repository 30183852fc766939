"""One speculative Plan (block size + tree, or "auto") given by ``plan=``; the older ``block_size=`` /
``tree=`` read into it; the chain is the width-1 tree of the one round body."""

import pytest

from dllm.drafters.loading import load_target
from dllm.drafters.loop import speculative_generate
from dllm.drafters.plan import Plan, as_plan, resolve_plan
from spec_helpers import long_answer_prompts


@pytest.fixture(scope="module")
def ar():
    return load_target("tiny-ar")


def test_plan_forms():
    assert as_plan(8) == Plan(block_size=8) and as_plan("auto") == Plan(head="auto") == Plan.auto()
    assert resolve_plan(None, 8, "ddtree") == Plan(block_size=8, tree="ddtree")
    assert resolve_plan(Plan(block_size=8, tree="ddtree"), 8, "ddtree") == Plan(block_size=8, tree="ddtree")
    assert resolve_plan(None, "auto", None) == Plan.auto()
    with pytest.raises(ValueError, match="give head= alone"):
        Plan(block_size=8, head="auto")
    with pytest.raises(ValueError, match=r"block_size='auto' \(a block head\) does not combine with a draft tree"):
        resolve_plan(None, "auto", "ddtree")


def test_plan_and_the_older_keywords_agree_or_fail(ar):
    target, tok = ar
    prompt = "[BOS] copy_long A B C [SEP]"
    with pytest.raises(ValueError, match=r"plan=8 and block_size=4 disagree"):
        speculative_generate(target, "ngram", prompt, max_new_tokens=4, tokenizer=tok, plan=8, block_size=4)
    with pytest.raises(ValueError, match=r"and tree='ddtree' disagree"):
        speculative_generate(target, "ngram", prompt, max_new_tokens=4, tokenizer=tok, plan=Plan(block_size=8),
                             tree="ddtree")
    with pytest.raises(ValueError, match=r"plan must be a Plan, 'auto', a BlockHead or a positive int"):
        speculative_generate(target, "ngram", prompt, max_new_tokens=4, tokenizer=tok, plan="big")
    same = speculative_generate(target, "ngram", prompt, max_new_tokens=4, tokenizer=tok, plan=8, block_size=8)
    assert same.block_size == 8


@pytest.mark.slow
def test_the_chain_is_the_width_1_tree(tiny_pair):
    """Greedy, the chain builder's tree (the arg-max path) through the tree walk commits exactly what
    the chain's verification commits, round by round; plan= and block_size= are the same call."""
    target, tok, drafter = tiny_pair
    _, ids = long_answer_prompts(tok)
    ids = ids[:4]
    chain = speculative_generate(target, drafter, ids, max_new_tokens=40, block_size=8)
    tree = speculative_generate(target, drafter, ids, max_new_tokens=40, plan=Plan(block_size=8, tree="chain:budget=7"))
    same = speculative_generate(target, drafter, ids, max_new_tokens=40, plan=8)
    assert tree.generated == chain.generated == same.generated
    assert tree.acceptance == chain.acceptance == same.acceptance
