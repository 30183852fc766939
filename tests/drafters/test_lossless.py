"""Greedy losslessness end to end: ``speculative_generate`` returns exactly transformers' own
``generate(do_sample=False)`` (float32, tiny random Qwen3 and Llama targets), whatever the drafter,
at batch 1 and in ragged batches; EOS inside an accepted block, ``max_new_tokens`` mid-block, stop
strings, full acceptance with its bonus, and the hidden-state contract of tapping drafters."""

import pytest
import torch

from dllm.drafters import loop as loop_module
from dllm.drafters.base import make_drafter
from dllm.drafters.loop import speculative_generate
from dllm.models import tiny
from tests.drafters.speculative_helpers import EOS, PAD, OracleDrafter, hf_greedy, tiny_target

PROMPTS = [[5, 6, 7, 8, 9], [10, 11], [12, 13, 14, 15, 16, 17, 18, 19]]
NEW = 24


@pytest.fixture(scope="module", params=["qwen3", "llama"])
def target(request):
    return tiny_target(request.param, seed=1)


@pytest.fixture(scope="module")
def truth(target):
    """Per prompt, transformers' greedy continuation of the prompt alone."""
    return [hf_greedy(target, p, NEW) for p in PROMPTS]


@pytest.fixture(scope="module")
def llada():
    return tiny("llada", seed=3)


def _drafter(name, target, llada):
    return {
        "ngram": lambda: "ngram",
        "dlm": lambda: make_drafter("dlm", model=llada),
        "dlm-threshold": lambda: make_drafter("dlm", model=llada, sampler="threshold:threshold=0.5"),
        "oracle": lambda: OracleDrafter(target),
        "oracle-ragged": lambda: OracleDrafter(target, wrong_every=3),
    }[name]()


DRAFTERS = ["ngram", "dlm", "dlm-threshold", "oracle", "oracle-ragged"]


@pytest.mark.parametrize("name", DRAFTERS)
def test_batch_one_equals_transformers_greedy(target, truth, llada, name):
    for p, want in zip(PROMPTS, truth):
        out = speculative_generate(target, _drafter(name, target, llada), [p], max_new_tokens=NEW, plan=5)
        assert out.generated == [want]
        assert out.target_forwards == out.rounds + 1


@pytest.mark.parametrize("name", DRAFTERS)
def test_ragged_batch_equals_each_prompt_alone(target, truth, llada, name):
    out = speculative_generate(target, _drafter(name, target, llada), PROMPTS, max_new_tokens=NEW, plan=4)
    assert out.generated == truth
    # transformers' batch layout: prompts left-padded, pad after a row's EOS
    lp = max(map(len, PROMPTS))
    for j, (p, want) in enumerate(zip(PROMPTS, truth)):
        row = out.sequences[j].tolist()
        assert row[:lp] == [PAD] * (lp - len(p)) + p
        assert row[lp:lp + len(want)] == want and set(row[lp + len(want):]) <= {PAD}


@pytest.mark.parametrize("block", [1, 2, 7])
def test_block_sizes_including_plain_decoding(target, truth, block):
    out = speculative_generate(target, "ngram", PROMPTS, max_new_tokens=NEW, plan=block)
    assert out.generated == truth
    if block == 1:  # the AR baseline through the same loop: one token per forward, no drafter
        assert out.tau == 1.0 and out.drafter_forwards == 0


def test_full_acceptance_draws_the_bonus(target, truth):
    """An oracle drafter is always right: every round commits K drafts + the bonus = B tokens."""
    b = 4
    out = speculative_generate(target, OracleDrafter(target), PROMPTS[:1], max_new_tokens=NEW, plan=b)
    assert out.generated == truth[:1]
    body = out.acceptance[0][:-1]  # the last round may be cut by the stop
    assert body and all(n == b for n in body)


def test_ragged_acceptance_rows_advance_by_their_own_counts(target, truth):
    out = speculative_generate(target, OracleDrafter(target, wrong_every=3), PROMPTS, max_new_tokens=NEW,
                               plan=5)
    assert out.generated == truth
    firsts = {tuple(a[:3]) for a in out.acceptance}
    assert len(firsts) > 1  # rows accepted different amounts in the same rounds


def test_max_new_tokens_mid_block(target, truth):
    """Prefill 1 + one full round of 4 = 5 tokens; max_new_tokens = 7 cuts the next round at 2."""
    out = speculative_generate(target, OracleDrafter(target), PROMPTS[:1], max_new_tokens=7, plan=4)
    assert out.generated == [truth[0][:7]]
    assert out.acceptance == [[4, 2]] and out.stop_reasons == ["length"]


def test_eos_inside_an_accepted_block(target, truth):
    """Make the 6th greedy token the EOS id: transformers stops there, and so must the loop, even
    though the oracle drafts past it; nothing after the EOS is emitted."""
    want = truth[1]
    cut = next(i for i in range(4, len(want)) if want[i] not in want[:i])
    eos = want[cut]
    ref = hf_greedy(target, PROMPTS[1], NEW, eos=eos)
    assert ref == want[:cut + 1]
    out = speculative_generate(target, OracleDrafter(target), PROMPTS, max_new_tokens=NEW, plan=8,
                               eos_token_id=eos)
    assert out.generated[1] == ref and out.stop_reasons[1] == "eos"
    assert out.acceptance[1][-1] < 8  # the EOS round was cut inside the block
    for j in (0, 2):  # the other rows stop alone, at their own EOS (if any) or the length
        assert out.generated[j] == hf_greedy(target, PROMPTS[j], NEW, eos=eos)


def test_stop_strings_end_a_row(target, truth, llada):
    tok = llada.tokenizer
    want = truth[2]
    i = next(i for i in range(3, len(want)) if want[i] < len(tok) and tok.decode([want[i]]).strip()
             and tok.decode([want[i]]) not in tok.decode(want[:i]))
    word = tok.decode([want[i]])
    out = speculative_generate(target, "ngram", PROMPTS, max_new_tokens=NEW, plan=4, stop=word, tokenizer=tok)
    assert out.generated[2] == want[:i + 1] and out.stop_reasons[2] == "stop"
    assert out.texts[2] == tok.decode(want[:i + 1], skip_special_tokens=True)


def test_string_prompts_and_texts(target, llada):
    tok = llada.tokenizer
    prompts = ["the sum of 3 and 4", "hello"]
    out = speculative_generate(target, "ngram", prompts, max_new_tokens=8, tokenizer=tok)
    for p, g in zip(prompts, out.generated):
        assert g == hf_greedy(target, tok.encode(p), 8)
    assert out.texts == [tok.decode(g, skip_special_tokens=True) for g in out.generated]


def test_compaction_keeps_outputs(target, monkeypatch):
    """A long ragged run leaves holes; compaction fires and every row still equals its truth."""
    calls = []
    real = loop_module.compact

    def counting(cache, valid, width=None):
        calls.append(valid.shape[1])
        return real(cache, valid, width)

    monkeypatch.setattr(loop_module, "compact", counting)
    prompts = [[20, 21, 22], [23], [24, 25, 26, 27, 28, 29, 30, 31, 32, 33]]
    n = 60
    out = speculative_generate(target, OracleDrafter(target, wrong_every=4), prompts, max_new_tokens=n,
                               plan=6, eos_token_id=[])
    assert calls, "no compaction happened; the test needs more ragged acceptance"
    assert out.generated == [hf_greedy(target, p, n, eos=None) for p in prompts]


def test_sliding_window_target_at_batch_one():
    target = tiny_target("qwen3", seed=2, use_sliding_window=True, sliding_window=5, max_window_layers=0)
    p = PROMPTS[2]
    want = hf_greedy(target, p, 30)
    for drafter in (OracleDrafter(target), "ngram", OracleDrafter(target, wrong_every=2)):
        assert speculative_generate(target, drafter, [p], max_new_tokens=30, plan=4).generated == [want]


def test_hidden_states_of_each_committed_token_reach_the_drafter_once(target):
    """The DFlash contract: features of every committed token but the current anchor, each once,
    at its position, equal to the tapped layers of a full forward."""
    d = OracleDrafter(target, wrong_every=3, taps=(0, 1))
    out = speculative_generate(target, d, PROMPTS, max_new_tokens=12, plan=4, eos_token_id=[])
    for j, p in enumerate(PROMPTS):
        seq = p + out.generated[j]
        with torch.no_grad():
            states = target(torch.tensor([seq]), output_hidden_states=True).hidden_states
        full = torch.cat([states[1][0], states[2][0]], dim=-1)  # [T, 2D]
        seen: dict[int, torch.Tensor] = {}
        for ctx in d.seen:
            rows = ctx.rows.tolist()
            if j not in rows:
                continue
            r = rows.index(j)
            assert ctx.tokens[r][-1] == ctx.anchor[r].item()
            assert ctx.anchor_position[r].item() == len(ctx.tokens[r]) - 1
            for pos, h in zip(ctx.hidden_positions[r][ctx.hidden_mask[r]].tolist(), ctx.hidden[r][ctx.hidden_mask[r]]):
                assert pos not in seen
                seen[pos] = h
            assert sorted(seen) == list(range(len(ctx.tokens[r]) - 1))  # all but the anchor
        for pos, h in seen.items():
            torch.testing.assert_close(h, full[pos], rtol=1e-4, atol=1e-4)


def test_repeated_calls_share_no_state(target, truth, llada):
    d = make_drafter("dlm", model=llada)
    a = speculative_generate(target, d, PROMPTS, max_new_tokens=NEW, plan=4)
    b = speculative_generate(target, d, PROMPTS, max_new_tokens=NEW, plan=4)
    assert a.generated == b.generated == truth and a.acceptance == b.acceptance


def test_seeded_sampling_is_reproducible(target):
    kw = dict(max_new_tokens=16, plan=4, temperature=1.0, top_k=20, seed=5)
    a = speculative_generate(target, "ngram", PROMPTS, **kw)
    b = speculative_generate(target, "ngram", PROMPTS, **kw)
    assert a.generated == b.generated
    assert speculative_generate(target, "ngram", PROMPTS, **kw, return_stats=False).equal(a.sequences)


def test_statistics(target, truth):
    out = speculative_generate(target, OracleDrafter(target, wrong_every=3), PROMPTS, max_new_tokens=NEW,
                               plan=4)
    commits = sum(map(sum, out.acceptance))
    assert commits + len(PROMPTS) == out.generated_tokens  # + the prefill token of each row
    assert 1.0 <= out.tau <= 4 and out.rounds == max(map(len, out.acceptance))
    assert out.drafter_forwards == 3 * out.rounds  # the oracle counts K forwards per proposal
    s = out.summary()
    assert s["target_forwards"] == out.rounds + 1 and s["tokens_per_second"] > 0
    assert len(out.acceptance_by_position()) == 3
    assert out.stop_reasons == ["eos" if EOS in t else "length" for t in truth]


def test_one_new_token_is_the_prefill_alone(target, truth):
    out = speculative_generate(target, "ngram", PROMPTS, max_new_tokens=1)
    assert out.generated == [t[:1] for t in truth] and out.rounds == 0 and out.target_forwards == 1
    assert out.tau == 0.0 and out.stop_reasons == ["length"] * 3



@pytest.mark.parametrize("fast_path", [True, False])
def test_callback_gets_snapshots_it_may_keep_or_edit(target, truth, fast_path):
    """The callback's lists are its own: a kept one stays the ids of its round, and editing one
    changes nothing in the call (the loop's live lists were passed: every kept list ended as the
    final output, and a callback appending to one put its token into the output)."""
    prompts = PROMPTS[:1] if fast_path else PROMPTS
    kept: list[list[list[int]]] = []
    out = speculative_generate(target, "ngram", prompts, max_new_tokens=NEW, plan=4, fast_path=fast_path,
                               callback=kept.append)
    assert [len(rows[0]) for rows in kept] == [1 + sum(out.acceptance[0][:i + 1]) for i in range(len(kept))]
    assert kept[-1] == out.generated and len(kept) > 1

    def edit(rows):
        for r in rows:
            r.append(PAD)  # the callback's own list: not the call's

    edited = speculative_generate(target, "ngram", prompts, max_new_tokens=NEW, plan=4, fast_path=fast_path,
                                  callback=edit)
    assert edited.generated == out.generated == truth[:len(prompts)]
