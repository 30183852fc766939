"""The registered ``dflash`` drafter through ``speculative_generate``: greedy output equals the target's
own and the reference package's ``dflash_generate``; registry and checkpoint paths; T > 0; bad input;
rows that stop at different times (the drafter cache's ``select``)."""

from __future__ import annotations

import copy

import pytest
import torch
from transformers import Qwen3Config

from dllm.drafters.base import Draft, DraftContext, DraftSetup, list_drafters, make_drafter
from dllm.drafters.dflash.drafter import DFlashBlockDrafter
from dllm.drafters.dflash.io import random_dflash, save_dflash
from dllm.drafters.loop import speculative_generate
from dllm.drafters.target import Target
from dllm.drafters.verify import SamplingParams
from tests.drafters.speculative_helpers import dflash_target
from tests.drafters.dflash.test_dflash_generate import CASES, MASK, NEEDS_REFERENCE, PROMPT, VOCAB, pair

GEN = torch.Generator().manual_seed(5)
PROMPTS = [torch.randint(0, MASK, (n,), generator=GEN).tolist() for n in (9, 4, 13)]  # ragged batch


def hf_greedy(target, prompt: list[int], max_new: int) -> list[int]:
    """transformers' greedy continuation of one unpadded prompt, exactly ``max_new`` tokens."""
    ids = torch.tensor([prompt])
    out = target.generate(ids, attention_mask=torch.ones_like(ids), do_sample=False, max_new_tokens=max_new,
                          min_new_tokens=max_new)
    return out[0, len(prompt):].tolist()


# ---- 1. greedy = the target's own greedy output -------------------------------------------------------
@pytest.mark.parametrize("block_size, max_new", CASES)
def test_greedy_equals_target_generate_batch_1(block_size, max_new):
    target, drafter = pair(block_size)
    out = speculative_generate(target, DFlashBlockDrafter(model=drafter), PROMPT, max_new_tokens=max_new,
                               eos_token_id=[])
    plain = target.generate(PROMPT, max_new_tokens=max_new, do_sample=False, min_new_tokens=max_new)
    assert torch.equal(out.sequences, plain)
    assert out.block_size == block_size  # the checkpoint's trained block size is the default
    assert max(out.acceptance[0]) > 1  # drafts were really accepted
    assert out.drafter_forwards == out.rounds


@pytest.mark.parametrize("block_size", [3, 6])
def test_greedy_equals_target_generate_ragged_batch(block_size):
    target, drafter = pair(6)
    out = speculative_generate(target, {"name": "dflash", "model": drafter}, PROMPTS, max_new_tokens=30,
                               plan=block_size, eos_token_id=[])
    for j, p in enumerate(PROMPTS):
        assert out.generated[j] == hf_greedy(target, p, 30), f"row {j}"
    assert max(max(a) for a in out.acceptance) > 1


def test_low_precision_drafter_is_still_lossless():
    target, drafter = pair(4)  # a bfloat16 drafter for a float32 target: the head gets a cast
    bf16 = make_drafter("dflash", model=copy.deepcopy(drafter), dtype="bfloat16")
    assert bf16.model.fc.weight.dtype == torch.bfloat16
    out = speculative_generate(target, bf16, PROMPT, max_new_tokens=20, eos_token_id=[])
    assert out.generated[0] == hf_greedy(target, PROMPT[0].tolist(), 20)


# ---- 2. = the reference package -------------------------------------------------------------------
@pytest.mark.parametrize("block_size, max_new", CASES)  # the second case cuts the last round short
def test_matches_reference_dflash_generate(block_size, max_new, tmp_path, monkeypatch):
    reference = pytest.importorskip("dflash.model", reason=NEEDS_REFERENCE)
    import dllm.drafters.dflash.drafter as dflash_module

    target, drafter = pair(block_size)
    save_dflash(drafter, tmp_path)
    ref = reference.DFlashDraftModel.from_pretrained(tmp_path, dtype=torch.float32).eval()
    theirs: list[torch.Tensor] = []  # per-round draft logits [1, width - 1, V]
    compute_logits = ref.compute_logits
    ref.compute_logits = lambda hidden, head: theirs.append(compute_logits(hidden, head)) or theirs[-1]
    ours: list[torch.Tensor] = []
    draft_block = dflash_module.draft_block
    monkeypatch.setattr(dflash_module, "draft_block",
                        lambda *a, **kw: (lambda out: ours.append(out.logits) or out)(draft_block(*a, **kw)))

    want = reference.dflash_generate(ref, target, PROMPT, max_new, None)
    got = speculative_generate(target, f"dflash:model={tmp_path}", PROMPT, max_new_tokens=max_new,
                               eos_token_id=[])
    assert torch.equal(got.sequences, want)
    assert len(ours) == len(theirs) == got.rounds  # the same rounds, so the same acceptance lengths
    # the reference shortens its last blocks to the tokens left (fewer masks, other drafts); the loop
    # drafts full blocks and cuts the commit. Every full-width round drafts the same logits.
    full = [r for r, t in enumerate(theirs) if t.shape[1] == block_size - 1]
    assert len(full) >= len(theirs) - (block_size - 1)
    for r in full:
        torch.testing.assert_close(ours[r], theirs[r], atol=1e-5, rtol=1e-5, msg=f"round {r}")


# ---- 3. registry and checkpoints ------------------------------------------------------------------
def test_registry_and_loading_by_path(tmp_path):
    target, drafter = pair(4)
    assert "dflash" in dict(list_drafters())
    made = make_drafter("dflash", model=drafter)
    assert isinstance(made, DFlashBlockDrafter) and made.model is drafter
    assert made.target_layers == drafter.target_layer_ids and made.vocab_size == VOCAB and made.block_size == 4
    save_dflash(drafter, tmp_path)
    loaded = make_drafter(f"dflash:model={tmp_path},dtype=float32")
    assert loaded.model is not drafter and loaded.block_size == 4
    assert DFlashBlockDrafter(model=tmp_path).target_layers == made.target_layers  # a path as model=
    a = speculative_generate(target, loaded, PROMPT, max_new_tokens=12, eos_token_id=[])
    b = speculative_generate(target, made, PROMPT, max_new_tokens=12, eos_token_id=[])
    assert a.generated == b.generated and a.acceptance == b.acceptance  # same weights, same drafts


# ---- 4. T > 0 -------------------------------------------------------------------------------------
@pytest.mark.parametrize("sample", [False, True])
def test_sampling_is_reproducible(sample):
    target, drafter = pair(4)
    spec = make_drafter("dflash", model=drafter, sample=sample)
    kw = dict(max_new_tokens=20, temperature=0.8, top_k=8, top_p=0.95, eos_token_id=[])
    a = speculative_generate(target, spec, PROMPTS, seed=3, **kw)
    b = speculative_generate(target, spec, PROMPTS, seed=3, **kw)
    assert a.generated == b.generated and a.acceptance == b.acceptance
    assert all(len(g) == 20 and all(0 <= t < VOCAB for t in g) for g in a.generated)


def test_sample_returns_draft_distributions():
    target, drafter = pair(4)
    params = SamplingParams(temperature=0.7, top_k=5)
    info = Target(target, taps=drafter.target_layer_ids).info
    outs: dict[bool, Draft] = {}
    for sample in (False, True):
        d = make_drafter("dflash", model=drafter, sample=sample)
        setup = DraftSetup(target=target, info=info, block_size=4, batch_size=1, params=params,
                           generator=torch.Generator().manual_seed(0), device=torch.device("cpu"))
        with torch.no_grad():
            states = target(PROMPT, output_hidden_states=True).hidden_states
        hidden = torch.cat([states[i + 1] for i in drafter.target_layer_ids], dim=-1)  # [1, 9, L*D]
        ctx = DraftContext(tokens=[PROMPT[0].tolist() + [3]], rows=torch.tensor([0]), anchor=torch.tensor([3]),
                           anchor_position=torch.tensor([9]), num_draft=3, round=0, params=params,
                           generator=setup.generator, hidden=hidden, hidden_mask=torch.ones(1, 9, dtype=torch.bool),
                           hidden_positions=torch.arange(9)[None])
        outs[sample] = d.begin(setup).propose(ctx)
    assert outs[False].probs is None and outs[False].tokens.shape == (1, 3)
    q = outs[True].probs  # [1, 3, V]
    assert q.shape == (1, 3, VOCAB) and torch.allclose(q.sum(-1), torch.ones(1, 3))
    assert ((q > 0).sum(-1) <= 5).all()  # top-k applied to the draft distribution
    assert (q.gather(2, outs[True].tokens[..., None]) > 0).all()  # drafts drawn from q


# ---- 5. bad input ---------------------------------------------------------------------------------
def test_bad_input():
    target, drafter = pair(4)
    with pytest.raises(ValueError, match="needs a DFlash checkpoint"):
        make_drafter("dflash")
    with pytest.raises(TypeError, match="must be a DFlashDrafter"):
        make_drafter("dflash", model=torch.nn.Linear(2, 2))
    with pytest.raises(ValueError, match="dtype"):
        make_drafter("dflash", model=drafter, dtype="int8")
    with pytest.raises(ValueError, match=r"block_size 5 exceeds .* trained block size 4"):
        speculative_generate(target, make_drafter("dflash", model=drafter), PROMPT, max_new_tokens=4, plan=5)
    narrow = dflash_target(vocab=VOCAB)  # hidden 64 -> rebuild at hidden 32, same vocabulary and layers
    narrow = type(narrow)(Qwen3Config(**{**narrow.config.to_dict(), "hidden_size": 32, "intermediate_size": 64,
                                         "head_dim": 8})).eval()
    with pytest.raises(ValueError, match=r"hidden size 64 but the target's is 32"):
        speculative_generate(narrow, make_drafter("dflash", model=drafter), PROMPT, max_new_tokens=4)
    wide = random_dflash({**target.config.to_dict(), "vocab_size": VOCAB + 3}, 2, 4, MASK)
    with pytest.raises(ValueError, match=rf"vocabulary of {VOCAB + 3} tokens .* {VOCAB}"):
        speculative_generate(target, make_drafter("dflash", model=wide), PROMPT, max_new_tokens=4)


# ---- 6. rows stopping at different times ----------------------------------------------------------
@pytest.mark.parametrize("block_size", [3, 6])
def test_rows_stopping_at_different_times(block_size):
    target, drafter = pair(6)
    eos = 0  # row 1 emits it after 6 tokens, row 2 after 21, row 0 never (within 30)
    out = speculative_generate(target, make_drafter("dflash", model=drafter), PROMPTS, max_new_tokens=30,
                               plan=block_size, eos_token_id=eos)
    for j, p in enumerate(PROMPTS):
        full = hf_greedy(target, p, 30)
        want = full[:full.index(eos) + 1] if eos in full else full
        assert out.generated[j] == want, f"row {j}"
    assert out.stop_reasons == ["length", "eos", "eos"]
    assert out.acceptance[1][-1] > 1  # row 1's EOS came in a round with accepted drafts
