"""The registered drafters on their own: n-gram lookup rules, the dlm drafter's context and counts."""

import pytest
import torch

from dllm.drafters.base import DraftContext, make_drafter
from dllm.drafters.loop import speculative_generate
from dllm.drafters.ngram import lookup
from dllm.drafters.verify import SamplingParams
from dllm.models import tiny
from tests.drafters.speculative_helpers import tiny_target


def test_lookup_copies_what_followed_the_latest_match():
    seq = [1, 2, 3, 9, 1, 2, 4, 7, 1, 2]
    assert lookup(seq, 2, 3, 1) == [4, 7]  # "1 2" last seen before at 4..5, followed by 4 7


def test_lookup_prefers_the_longest_ngram():
    seq = [5, 1, 2, 8, 3, 2, 6, 5, 1, 2]
    assert lookup(seq, 1, 3, 1) == [8]  # "5 1 2" matches at 0; the 1-gram "2" alone would give 6
    assert lookup(seq, 1, 1, 1) == [6]


def test_lookup_continues_a_loop_past_the_end():
    seq = [7, 3, 4, 3, 4]
    assert lookup(seq, 5, 2, 1) == [3, 4, 3, 4, 3]  # period 2, copied from its own output


def test_lookup_without_a_match():
    assert lookup([1, 2, 3], 4, 3, 1) is None
    assert lookup([1], 4, 3, 1) is None


def _ctx(tokens, k):
    return DraftContext(tokens=tokens, rows=torch.arange(len(tokens)),
                        anchor=torch.tensor([t[-1] for t in tokens]),
                        anchor_position=torch.tensor([len(t) - 1 for t in tokens]), num_draft=k, round=0,
                        params=SamplingParams(), generator=None)


def test_ngram_drafter_marks_rows_without_a_match():
    d = make_drafter("prompt_lookup")  # the alias
    out = d.propose(_ctx([[1, 2, 1], [4, 5, 6]], 3))
    assert out.tokens.tolist() == [[2, 1, 2], [6, 6, 6]]
    assert out.lengths.tolist() == [3, 0] and out.probs is None and out.forwards == 0


def test_ngram_accepts_on_a_looping_target():
    target = tiny_target(seed=1)
    out = speculative_generate(target, "ngram", [[5, 6, 7, 8, 9]], max_new_tokens=40, plan=6, eos_token_id=[])
    assert out.tau > 1.0  # random targets fall into loops; the lookup continues them


def test_dlm_context_fits_the_positions_and_hides_the_mask_id():
    llada = tiny("llada", max_positions=16)
    d = make_drafter("dlm", model=llada, max_context=10)
    seq = list(range(20, 40))
    seq[-2] = llada.mask_id
    ctx = d.context(seq, 8)
    assert len(ctx) == 8 and ctx[-2] == llada.pad_id and ctx[-1] == seq[-1]  # 16 positions - 8 drafts
    assert len(make_drafter("dlm", model=llada, max_context=5).context(seq, 8)) == 5


def test_dlm_counts_its_forwards_and_reads_any_sampler():
    llada = tiny("llada", seed=3)
    target = tiny_target(seed=1)
    for spec, steps, per_round in [("low_confidence", 1, 1), ("low_confidence", 3, 3), ("random", None, 3)]:
        d = make_drafter("dlm", model=llada, sampler=spec, steps=steps)
        out = speculative_generate(target, d, [[5, 6, 7]], max_new_tokens=6, plan=4)
        assert out.drafter_forwards == per_round * out.rounds
    spec = make_drafter("dlm:sampler=threshold:threshold=0.7,steps=2", model=llada)
    assert spec.config.sampler == "threshold:threshold=0.7" and spec.config.steps == 2


def test_dlm_drafts_at_its_own_temperature_with_the_call_seed():
    llada = tiny("llada", seed=3)
    target = tiny_target(seed=1)
    d = make_drafter("dlm", model=llada, temperature=1.0)
    kw = dict(max_new_tokens=12, plan=4, seed=3)
    a = speculative_generate(target, d, [[5, 6, 7]], **kw)
    b = speculative_generate(target, d, [[5, 6, 7]], **kw)
    assert a.generated == b.generated and a.acceptance == b.acceptance


@pytest.mark.slow
def test_dlm_loads_an_embedded_model_by_name():
    d = make_drafter("dlm:model=tiny-random-llada")
    assert d.vocab_size == d.model.vocab_size
