"""Token identity with the authors' JetSpec decoding, transcribed in
``tests/reference/decoders/jetspec_generate.py`` (their head mask by key index, their accum_logp tree
with the root in the budget, their arg-max walk; no caches), on the shipped weights in their layout:
27 long-answer prompts x 3 tree settings, every generated token and every round's commit count equal."""

import pytest
import torch

from dllm.drafters.base import make_drafter
from dllm.drafters.jetspec.io import load_jetspec
from dllm.drafters.loop import speculative_generate
from dllm.drafters.plan import Plan
from dllm.models.targets import load_target
from tests.drafters.speculative_helpers import long_answer_prompts
from tests.reference.decoders.jetspec_generate import jetspec_generate

pytestmark = pytest.mark.slow
SETTINGS = [(63, 7), (15, 3), (127, 7)]  # (our budget: draft nodes; width); the authors' budget is ours + 1


@pytest.fixture(scope="module")
def pair():
    target, tok = load_target("tiny-ar")
    return target, tok, load_jetspec("tiny-ar-jetspec")


@pytest.mark.parametrize("budget,width", SETTINGS)
def test_the_rounds_equal_the_authors(pair, budget, width):
    target, tok, head = pair
    d = make_drafter("jetspec", model=head)
    _, ids = long_answer_prompts(tok, per_size=3)
    assert len(ids) >= 20
    eos = [target.config.eos_token_id]
    taus = []
    for prompt in ids:
        theirs, commits = jetspec_generate(target, head, prompt, 66, budget=budget + 1, width=width, eos_ids=eos)
        out = speculative_generate(target, d, [prompt], max_new_tokens=66, tokenizer=tok,
                                   plan=Plan(tree=f"jetspec:budget={budget},width={width}"))
        assert out.generated[0] == theirs
        assert out.acceptance[0] == commits  # the same tree and the same accepted path every round
        taus.append(len(theirs) / len(commits))
    assert sum(taus) / len(taus) > 2.0  # the trees are accepted deep, so the comparison has power


def test_the_reference_head_mask_is_the_causal_head(pair):
    """The transcription's index mask and ``DFlashConfig(is_causal=True)``'s position mask give the same logits."""
    target, tok, head = pair
    from dllm.drafters.dflash.cache import DraftKVCache
    from dllm.drafters.dflash.model import draft_block, make_block
    from tests.reference.decoders.jetspec_generate import head_logits

    _, ids = long_answer_prompts(tok)
    prompt = ids[0]
    with torch.no_grad():
        out = target(input_ids=torch.tensor([prompt[:-1]]), output_hidden_states=True)
        feats = torch.cat([out.hidden_states[i + 1] for i in head.target_layer_ids], dim=-1)
        theirs = head_logits(head, target, feats, prompt[-1])
        ours = draft_block(head, DraftKVCache(head.config.num_layers), feats,
                           make_block(torch.tensor([prompt[-1]]), head.block_size, head.mask_token_id),
                           embed_tokens=target.get_input_embeddings(), lm_head=target.lm_head).logits[0]
    assert torch.allclose(ours, theirs, atol=1e-5)
