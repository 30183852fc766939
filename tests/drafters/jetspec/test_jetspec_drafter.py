"""The ``jetspec`` drafter: the authors' checkpoint layout, the causal head, options and their errors,
and greedy losslessness (chain and tree plans) against ``target.generate``."""

import json

import pytest
import torch

from dllm.drafters.base import make_drafter
from dllm.drafters.dflash.io import load_dflash, random_dflash, save_dflash
from dllm.drafters.dflash.model import draft_block, make_block
from dllm.drafters.dflash.cache import DraftKVCache
from dllm.drafters.jetspec.drafter import JetSpecDrafter
from dllm.drafters.jetspec.io import causal_copy, load_jetspec, random_jetspec, save_jetspec
from dllm.drafters.loop import speculative_generate
from dllm.drafters.plan import Plan
from tests.drafters.speculative_helpers import EOS, VOCAB, tiny_target

EMBEDDED = "tiny-ar-jetspec"


@pytest.fixture(scope="module")
def small():
    target = tiny_target(seed=1)
    return target, random_jetspec(target.config, 2, 6, VOCAB - 1, seed=3, target_layer_ids=(0, 1))


def test_the_authors_layout_round_trips(small, tmp_path):
    target, head = small
    save_jetspec(head, tmp_path / "head")
    hf = json.loads((tmp_path / "head" / "config.json").read_text())
    assert hf["architectures"] == ["DFlashDraftModel"] and hf["dflash_config"]["causal_head"] is True
    assert "is_causal" not in hf and hf["block_size"] == 6 and hf["dflash_config"]["mask_token_id"] == VOCAB - 1
    loaded = load_jetspec(tmp_path / "head")
    assert loaded.config.is_causal is True and loaded.config == head.config
    for key, value in head.state_dict().items():
        assert torch.equal(loaded.state_dict()[key], value), key
    d = make_drafter(f"jetspec:model={tmp_path / 'head'}")
    assert isinstance(d, JetSpecDrafter) and d.block_size == 6 and d.target_layers == head.target_layer_ids


def test_the_head_is_causal_inside_the_block(small):
    """Position i's logits never read block positions after i: changing the block's later inputs
    (through its own embeddings) leaves earlier positions unchanged; a bidirectional head does not."""
    target, head = small
    embed = target.get_input_embeddings().weight
    features = torch.randn((1, 5, len(head.target_layer_ids) * target.config.hidden_size),
                           generator=torch.Generator().manual_seed(0))
    block = make_block(torch.tensor([3]), 6, head.mask_token_id)
    changed = block.clone()
    changed[0, 4] = 7  # an input at block position 4
    for model, causal in ((head, True), (random_dflash(target.config, 2, 6, VOCAB - 1, seed=3, target_layer_ids=(0, 1)), False)):
        a = draft_block(model, DraftKVCache(2), features, block, embed_tokens=embed, lm_head=target.lm_head)
        b = draft_block(model, DraftKVCache(2), features, changed, embed_tokens=embed, lm_head=target.lm_head)
        # logits rows are block positions 1..5: rows 0..2 are positions 1..3 (before the change)
        assert torch.allclose(a.logits[:, :3], b.logits[:, :3]) is causal
        assert not torch.allclose(a.logits[:, 3:], b.logits[:, 3:])


def test_bad_options_and_models_get_clear_errors(small, tmp_path):
    target, head = small
    with pytest.raises(TypeError, match=r"Unknown option\(s\) 'modle' for drafter 'jetspec'. Valid options: model, "
                                        r"dtype, device, sample, quantization"):
        make_drafter("jetspec:modle=x")
    with pytest.raises(ValueError, match="needs a JetSpec head"):
        make_drafter("jetspec")
    with pytest.raises(ValueError, match="sample must be True or False, got 'maybe'"):
        make_drafter("jetspec:sample=maybe")
    with pytest.raises(ValueError, match="dtype 'float13' is not supported"):
        make_drafter("jetspec", model=head, dtype="float13")
    with pytest.raises(TypeError, match="must be a DFlashDrafter with a causal head"):
        make_drafter("jetspec", model=torch.nn.Linear(2, 2))
    bidirectional = random_dflash(target.config, 2, 6, VOCAB - 1, target_layer_ids=(0, 1))
    with pytest.raises(ValueError, match="needs a causal draft head .* use the dflash drafter"):
        make_drafter("jetspec", model=bidirectional)
    save_dflash(bidirectional, tmp_path / "dflash")
    with pytest.raises(ValueError, match=r"is not a JetSpec causal draft head: dflash_config.causal_head is None, "
                                         r"expected true"):
        make_drafter(f"jetspec:model={tmp_path / 'dflash'}")
    with pytest.raises(ValueError, match=r"block_size 7 exceeds the jetspec head's trained block size 6"):
        speculative_generate(target, make_drafter("jetspec", model=head), [[1, 2]], max_new_tokens=4, plan=7)
    with pytest.raises(ValueError, match=r"the jetspec head has hidden size 64 but the target's is 32"):
        speculative_generate(tiny_target(hidden=32), make_drafter("jetspec", model=head), [[1, 2]], max_new_tokens=4)


@pytest.mark.parametrize("plan", [6, Plan(tree="jetspec:budget=20,width=3"), Plan(tree="jetspec:budget=63"),
                                  Plan(block_size=4, tree="jetspec:budget=12,width=7,cost_per_node=0.02")])
def test_greedy_equals_target_generate_on_a_ragged_batch(small, plan):
    target, head = small
    d = make_drafter("jetspec", model=head)
    prompts = [[1, 5, 3, 9], [2, 4], [7, 7, 7, 1, 2, 3]]
    out = speculative_generate(target, d, prompts, max_new_tokens=20, plan=plan, eos_token_id=EOS)
    for row, p in enumerate(prompts):
        ref = target.generate(torch.tensor([p]), max_new_tokens=20, do_sample=False, eos_token_id=EOS,
                              pad_token_id=0)[0, len(p):].tolist()
        assert out.generated[row] == ref
        solo = speculative_generate(target, d, [p], max_new_tokens=20, plan=plan, eos_token_id=EOS)
        assert solo.generated[0] == ref


def test_a_warm_start_keeps_the_weights():
    base = load_dflash("tiny-ar-dflash")
    head = causal_copy(base)
    assert head.config.is_causal is True and base.config.is_causal is None
    assert all(torch.equal(a, b) for a, b in zip(head.state_dict().values(), base.state_dict().values()))


@pytest.mark.slow
def test_the_shipped_head_is_lossless_and_its_tree_pays_on_tiny_ar():
    from dllm.models.targets import load_target
    from tests.drafters.speculative_helpers import long_answer_prompts

    target, tok = load_target("tiny-ar")
    d = make_drafter(f"jetspec:model={EMBEDDED}")
    assert d.model.config.is_causal is True and d.block_size == 16
    _, ids = long_answer_prompts(tok)
    ref = [target.generate(torch.tensor([p]), max_new_tokens=66, do_sample=False)[0, len(p):].tolist() for p in ids]
    chain = speculative_generate(target, d, ids, max_new_tokens=66, tokenizer=tok)
    tree = speculative_generate(target, d, ids, max_new_tokens=66, tokenizer=tok, plan=Plan(tree="jetspec:budget=255"))
    assert chain.generated == ref and tree.generated == ref
    assert chain.tau > 5.0 and tree.tau > chain.tau  # batch rounds; 11.6 / 12.8 per prompt at batch 1
    # width 7 and 63 nodes reach depth 9 at most (each expansion adds 7 children): a confident head's
    # chain of 15 goes deeper, so this tree accepts less than the chain here
    shallow = speculative_generate(target, d, ids, max_new_tokens=66, tokenizer=tok,
                                   plan=Plan(tree="jetspec:budget=63"))
    assert shallow.generated == ref and max(a for row in shallow.acceptance for a in row) <= 10
