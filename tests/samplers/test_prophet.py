"""Prophet's early-commit rule: the gap, the progress thresholds, the all-in fill across blocks."""

import re

import pytest
import torch

import dllm
from dllm import tasks as T
from dllm.models import tiny
from dllm.models.oracle import OracleLM, oracle_prompts, score_generation
from dllm.samplers import make_sampler

from builders import MASK, V, decode_state, step_input

LP, G = 2, 10  # prompt width, generated positions: canvas of 12


def _state(committed=0):
    """One row: prompt [1, 2] then G positions, the first ``committed`` of them decided (token 7)."""
    x = torch.full((1, LP + G), MASK)
    x[0, :LP] = torch.tensor([1, 2])
    x[0, LP:LP + committed] = 7
    return decode_state(x, prompt_length=LP)


def _input(state, gaps, window, best=None):
    """Logits whose masked position i has top-1 token (i % 8) with a raw gap ``gaps[i]`` over the
    runner-up (the rest at 0), and the block ``window`` (canvas columns). ``best`` gets the largest
    probability of the block without changing its gap."""
    width = state.x.shape[1]
    logits = torch.zeros(1, width, V)
    for i in range(width):
        logits[0, i, i % 8] = gaps[i]
        logits[0, i, (i + 1) % 8] = 0.0
    if best is not None:  # a more peaked distribution, same top-2 gap
        others = [v for v in range(V) if v not in (best % 8, (best + 1) % 8)]
        logits[0, best, others] = -5.0
    tokens = state.x.clone()
    active = torch.zeros(1, width, dtype=torch.bool)
    active[0, window[0]:window[1]] = tokens[0, window[0]:window[1]] == MASK
    return step_input(logits, active, tokens=tokens, window=window)


@pytest.mark.parametrize("committed,tau", [(0, 7.5), (4, 5.0), (7, 2.5)])
def test_fires_by_progress_phase(committed, tau):
    # progress = (committed + 1) / G: 0.1, 0.5, 0.8
    for gap, fires in [(tau - 0.01, False), (tau, True)]:
        state = _state(committed)
        gaps = [50.0] * LP + [0.0] * committed + [gap] * (G - committed)  # committed ones are not monitored
        window = (LP + committed, LP + committed + 2)
        out = make_sampler("prophet").step(_input(state, gaps, window, best=window[0] + 1), state)
        if fires:  # the block now, every later mask of the query through beyond, with the proposals
            assert out.commit[0, window[0]:window[1]].all() and out.commit.sum() == 2
            assert out.beyond[0].nonzero().flatten().tolist() == list(range(LP + committed, LP + G))
            assert out.tokens[0, LP + committed:].tolist() == [i % 8 for i in range(LP + committed, LP + G)]
            assert state.extras["prophet_fired"].all()
        else:  # a normal one-token step: the most confident active mask
            assert out.commit[0].nonzero().flatten().tolist() == [window[0] + 1]
            assert not state.extras["prophet_fired"].any()


def test_mean_gap_over_all_remaining_masks():
    state = _state(0)
    gaps = [50.0] * LP + [20.0, 20.0] + [4.0] * 8  # mean over the 10 masks: 7.2 < 7.5
    out = make_sampler("prophet").step(_input(state, gaps, (LP, LP + 2)), state)
    assert out.commit.sum() == 1
    gaps = [50.0] * LP + [20.0, 20.0, 20.0] + [4.0] * 7  # mean 8.8 >= 7.5
    state = _state(0)
    out = make_sampler("prophet").step(_input(state, gaps, (LP, LP + 2)), state)
    assert out.commit.sum() == 2


def test_span_monitors_only_its_positions_committed_or_not():
    state = _state(2)  # generated 0, 1 committed
    gaps = [0.0] * LP + [9.0, 9.0] + [0.0] * 8
    out = make_sampler("prophet", span=(0, 2)).step(_input(state, gaps, (LP + 2, LP + 4)), state)
    assert out.commit.sum() == 2  # the span's mean gap 9 >= 7.5 (p = 0.3)
    state = _state(2)
    out = make_sampler("prophet", span=(2, 4)).step(_input(state, gaps, (LP + 2, LP + 4)), state)
    assert out.commit.sum() == 1


def test_a_fired_row_commits_every_mask_of_a_later_block_with_that_steps_proposals():
    """The masks a firing step's query held are all committed by it (the block through ``commit``, the
    rest through ``beyond``); a mask it did not hold (a cached query stops at its block) is committed
    when its block comes, at once, with the proposal of that step."""
    sampler = make_sampler("prophet")
    state = _state(0)
    out = sampler.step(_input(state, [50.0] * (LP + G), (LP, LP + 5)), state)  # fires
    assert out.commit[0, LP:LP + 5].all() and out.beyond[0, LP + 5:].all()
    state.x[0, LP:LP + 5] = out.tokens[0, LP:LP + 5]  # as if the query had stopped at the block's end
    # next block: new logits propose other tokens (and a gap that would not fire)
    inp = _input(state, [0.5] * (LP + G), (LP + 5, LP + G))
    inp.logits[0, :, 5] = 3.0
    out2 = sampler.step(inp, state)
    assert out2.commit[0, LP + 5:].all() and out2.commit.sum() == 5
    assert out2.tokens[0, LP + 5:].tolist() == [5] * 5


@pytest.mark.parametrize("options,match", [
    (dict(early_threshold=-1.0), r"early_threshold must be a number >= 0 \(inf disables it\), got -1.0"),
    (dict(late_threshold=float("nan")), r"late_threshold must be a number >= 0 \(inf disables it\), got nan"),
    (dict(span=(3, 3)), r"span must be None or \(start, end\) with integers 0 <= start < end"),
    (dict(span=(-1, 2)), r"span must be None or \(start, end\) with integers 0 <= start < end"),
])
def test_out_of_range(options, match):
    with pytest.raises(ValueError, match=match):
        make_sampler("prophet", **options)


# ---- end to end ------------------------------------------------------------------------------------
PROMPTS = [[5, 6, 7, 8], [9, 10], [11, 12, 13]]
NEVER = dict(early_threshold=float("inf"), mid_threshold=float("inf"), late_threshold=float("inf"))
# decoding to the end, and a batch equal to each row alone, at the defaults: the contract tests


@pytest.mark.parametrize("family", ["llada", "dream"])
@pytest.mark.parametrize("temperature", [0.0, 0.7])
def test_never_firing_is_one_token_low_confidence(family, temperature):
    model = tiny(family, seed=1)
    kw = dict(gen_length=8, block_length=4, temperature=temperature, seed=5)
    out = dllm.generate(model, PROMPTS, sampler="prophet", **kw, **NEVER)
    ref = dllm.generate(model, PROMPTS, sampler="low_confidence", steps=8, **kw)
    assert torch.equal(out.sequences, ref.sequences) and out.nfe == ref.nfe == 8


def test_firing_at_once_fills_every_block():
    model = tiny("llada", seed=1)
    out = dllm.generate(model, PROMPTS, sampler="prophet", gen_length=8, block_length=4, early_threshold=0.0,
                        return_trace=True)
    # fires at the first step and commits every block at once (StepOutput.beyond): one forward
    assert out.nfe == 1 and (out.trace == 0).all()
    assert (out.generated != model.mask_id).all()


def test_firing_with_a_short_cached_query_fills_later_blocks_from_the_stored_proposals():
    model = tiny("llada", seed=1)
    full = dllm.generate(model, PROMPTS, sampler="prophet", gen_length=8, block_length=4, early_threshold=0.0)
    dual = dllm.generate(model, PROMPTS, sampler="prophet", gen_length=8, block_length=4, early_threshold=0.0,
                         cache="dual", return_trace=True)
    # the block-start forward of block 0 is a full forward: same proposals, committed at step 0
    assert torch.equal(dual.sequences, full.sequences) and dual.nfe == 1


def test_oracle_copy_goes_all_in_at_the_first_step():
    exs = T.test_split("copy", 8, 4)
    out = dllm.generate(OracleLM(), oracle_prompts(exs), sampler="prophet", gen_length=8, block_length=4)
    assert all(score_generation(exs, out))
    assert out.nfe == 1 < 8  # one forward decides everything, all blocks at once
    out = dllm.generate(OracleLM(), oracle_prompts(exs), sampler="prophet", gen_length=8)
    assert all(score_generation(exs, out)) and out.nfe == 1


@pytest.mark.parametrize("span", [(8, 10), (20, 30)])
def test_a_span_past_the_generated_region_is_refused(span):
    """A span that starts at or past gen_length monitors nothing: prophet would silently never fire
    (plain one-token decoding); the call is refused naming the span and gen_length."""
    model = tiny("llada", seed=1)
    with pytest.raises(ValueError, match=rf"span={re.escape(str(span))} .*gen_length=8"):
        dllm.generate(model, PROMPTS, sampler="prophet", gen_length=8, block_length=4, span=span)
    out = dllm.generate(model, PROMPTS, sampler="prophet", gen_length=8, block_length=4, span=(6, 12))
    assert (out.generated != model.mask_id).all()  # a span that overlaps the region is clipped to it
