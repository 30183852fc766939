"""Near ``max_new_tokens`` the ``dflash`` package shortens its last block (``verify_size =
min(block_size, max_length - start)`` in ``dflash.model.dflash_generate``); ours drafts
min(B - 1, tokens left) too, so the acceptance per round equals the package's, not only the tokens."""

import time

import pytest
import torch

from dllm.drafters.loop import speculative_generate
from dllm.tasks.vocab import EOS, word_id
from tests.drafters.speculative_helpers import long_answer_prompts

pytestmark = pytest.mark.slow


@pytest.mark.parametrize("max_new", [7, 20, 37])
def test_acceptance_per_round_equals_the_dflash_package_near_the_cap(tiny_pair, monkeypatch, max_new):
    reference = pytest.importorskip("dflash.model", reason="the reference package `dflash` is not installed")
    monkeypatch.setattr(reference, "_cuda_time", time.perf_counter)  # its stats timer syncs CUDA
    target, tok, drafter = tiny_pair
    from dllm.models.loading import locate

    ref = reference.DFlashDraftModel.from_pretrained(locate("tiny-ar-dflash"), dtype=torch.float32).eval()
    _, ids = long_answer_prompts(tok)
    capped = 0
    for prompt in ids[::2]:
        ours = speculative_generate(target, drafter, [prompt], max_new_tokens=max_new, tokenizer=tok)
        theirs = reference.dflash_generate(ref, target, torch.tensor([prompt]), max_new, [word_id(EOS)],
                                           return_stats=True)
        assert ours.generated[0] == theirs.output_ids[0, len(prompt):].tolist()
        # the package counts the prefill's token apart; each later round's produced tokens match ours
        assert ours.acceptance[0] == theirs.acceptance_lengths, (max_new, prompt)
        capped += ours.stop_reasons[0] == "length"
    assert capped > 0  # the cap was reached (the rule under test ran)


def test_a_row_drafts_no_more_than_it_can_emit(tiny_pair):
    """The last round's block is cut to the tokens left: K = min(B - 1, left) drafts."""
    target, tok, drafter = tiny_pair
    seen = []
    session_propose = type(drafter).begin

    def begin(self, setup):
        session = session_propose(self, setup)
        propose = session.propose

        def spy(ctx):
            seen.append(ctx.num_draft)
            return propose(ctx)

        session.propose = spy
        return session

    _, ids = long_answer_prompts(tok)
    import unittest.mock as mock

    with mock.patch.object(type(drafter), "begin", begin):
        out = speculative_generate(target, drafter, [ids[0]], max_new_tokens=10, plan=16)
    left = 10 - 1  # after the prefill's token
    for k, emitted in zip(seen, out.acceptance[0]):
        assert k == min(15, left)
        left -= emitted


def test_in_a_batch_each_row_drafts_its_own_last_block(tiny_pair):
    """Rows of a batch reach the cap at different rounds; each row's drafter block is hidden past its
    own length (``DraftContext.lengths``), so its acceptance per round is the one it has alone."""
    target, tok, drafter = tiny_pair
    _, ids = long_answer_prompts(tok)
    ids = ids[:6]
    batch = speculative_generate(target, drafter, ids, max_new_tokens=23)
    for row, prompt in enumerate(ids):
        alone = speculative_generate(target, drafter, [prompt], max_new_tokens=23)
        assert batch.generated[row] == alone.generated[0]
        assert batch.acceptance[row] == alone.acceptance[0], row
