"""dInfer's hierarchy and credit rules: hand-built logits, option checks, end-to-end decoding."""

import math

import pytest
import torch

import dllm
import dllm.samplers.dinfer  # noqa: F401  (registers hierarchy, credit)
from dllm import tasks as T
from dllm.models import tiny
from dllm.models.oracle import OracleLM, oracle_prompts, score_generation
from dllm.samplers import make_sampler
from dllm.samplers.dinfer import run_argmax
from dllm.state import DecodeState, StepInput

MASK, V = 9, 10


def _row(p_top, tok):
    row = [(1 - p_top) / (V - 1)] * V
    row[tok] = p_top
    return row


def _input(rows, active):
    """rows: [B][Q] probability rows; active: [B][Q] bools (the whole query is the block)."""
    logits = torch.log(torch.tensor(rows, dtype=torch.float64)).float()  # [B, Q, V]
    bsz, q, _ = logits.shape
    return StepInput(logits=logits, tokens=torch.full((bsz, q), MASK), active=torch.tensor(active),
                     query_start=0, window=(0, q), step=0, steps=None, mask_id=MASK, temperature=0.0,
                     generator=None)


def _state(bsz, width):
    x = torch.full((bsz, width), MASK)
    return DecodeState(
        x=x, key_padding_mask=torch.ones_like(x, dtype=torch.bool), positions=torch.arange(width).expand(bsz, -1),
        prompt_mask=torch.zeros_like(x, dtype=torch.bool), prompt_length=0, gen_length=width, mask_id=MASK,
        temperature=0.0, generator=None, trace=torch.full((bsz, width), -1), padded=False,
        block_start=0, block_end=width,
    )


# ---- hierarchy -------------------------------------------------------------------------------------
def test_run_argmax_one_per_run_leftmost_on_ties():
    score = torch.tensor([[0.1, 0.5, 0.3, 0.9, 0.7, 0.7, 0.2, 0.6]])
    active = torch.tensor([[True, True, False, True, False, True, True, True]])
    # runs {0, 1} -> 1, {3} -> 3, {5, 6, 7} -> 5
    assert run_argmax(score, active)[0].tolist() == [False, True, False, True, False, True, False, False]
    tie = torch.tensor([[0.4, 0.4, 0.4]])
    assert run_argmax(tie, torch.ones(1, 3, dtype=torch.bool))[0].tolist() == [True, False, False]


def test_hierarchy_rule_at_batch_three():
    sampler = make_sampler("hierarchy")  # low 0.4, threshold 0.9
    rows = [
        # one run of 4: its best (0.6) only; 0.5 is not the run's best; nothing > 0.9
        [_row(0.5, 1), _row(0.6, 2), _row(0.45, 3), _row(0.3, 4), _row(0.99, 5)],
        # runs {0, 1} and {3, 4}: best of each (0.5, 0.97); plus 0.95 (> threshold, not a run best)
        [_row(0.5, 1), _row(0.45, 2), _row(0.99, 3), _row(0.95, 4), _row(0.97, 5)],
        # every confidence <= 0.4: only the global top-1
        [_row(0.2, 1), _row(0.3, 2), _row(0.4, 3), _row(0.35, 4), _row(0.15, 5)],
    ]
    active = [
        [True, True, True, True, False],
        [True, True, False, True, True],
        [True, True, True, True, True],
    ]
    out = sampler.step(_input(rows, active), _state(3, 5))
    assert out.commit.tolist() == [
        [False, True, False, False, False],
        [True, False, False, True, True],
        [False, False, True, False, False],
    ]
    assert out.tokens.tolist() == [[1, 2, 3, 4, 5]] * 3


def test_hierarchy_spreads_commits_over_runs_and_keeps_the_top1():
    rows = [[_row(0.8, 1), _row(0.3, 2), _row(0.6, 3)]]
    inp = _input(rows, [[True, False, True]])  # two runs: {0}, {2}

    def commits(**options):
        return make_sampler("hierarchy", **options).step(inp, _state(1, 3)).commit[0].tolist()

    assert commits() == [True, False, True]  # the best of each run
    assert commits(low_threshold=0.7) == [True, False, False]
    assert commits(low_threshold=0.85) == [True, False, False]  # nothing passes: the top-1 alone
    assert commits(low_threshold=0.7, threshold=0.5) == [True, False, True]


# ---- credit ----------------------------------------------------------------------------------------
def _fused_conf_trace(p, steps, alpha=0.7, gamma=0.2, beta=0.8):
    """Reference: fused confidence of a position whose raw distribution is _row(p, tok), repeated."""
    q = (1 - p) / (V - 1)
    credit, out = 0.0, []
    for _ in range(steps):
        credit = beta * credit + p ** gamma
        top = p * (1 + credit) ** alpha  # exp(l + alpha log(1 + C)) = p (1 + C)^alpha
        out.append(top / (top + (V - 1) * q))
    return out


def test_credit_accumulates_and_commits_when_fused_confidence_passes():
    sampler = make_sampler("credit")
    state = _state(1, 3)
    sampler.begin_block(state)
    # pos 0 raw 0.8 (needs credit), pos 1 raw 0.85 (the top-1, always committed), pos 2 inactive
    inp = _input([[_row(0.8, 1), _row(0.85, 2), _row(0.99, 3)]], [[True, True, False]])
    ref = _fused_conf_trace(0.8, 12)
    first_pass = next(t for t, c in enumerate(ref) if c >= 0.9)
    assert 0 < first_pass < 12
    for t in range(12):
        out = sampler.step(inp, state)
        assert out.score[0, 0].item() == pytest.approx(ref[t], abs=1e-5)
        assert out.commit[0].tolist() == [t >= first_pass, True, False]
    assert state.extras["credit"][0, 2].sum().item() == 0.0  # no credit off the active masks
    sampler.begin_block(state)  # reset per block
    assert sampler.step(inp, state).score[0, 0].item() == pytest.approx(ref[0], abs=1e-5)


def test_credit_alpha_zero_is_the_threshold_rule():
    inp = _input([[_row(0.95, 1), _row(0.5, 2), _row(0.91, 3), _row(0.89, 4)]], [[True] * 4])
    out = make_sampler("credit", alpha=0.0).step(inp, _state(1, 4))
    ref = make_sampler("threshold").step(inp, None)
    assert torch.equal(out.commit, ref.commit | (ref.score == ref.score.max()))
    assert out.commit[0].tolist() == [True, False, True, False]


# ---- options ---------------------------------------------------------------------------------------
@pytest.mark.parametrize("name,options,match", [
    ("hierarchy", dict(low_threshold=-0.1), r"low_threshold must be in \[0, 1\], got -0.1"),
    ("hierarchy", dict(threshold=1.5), r"threshold must be in \[0, 1\], got 1.5"),
    ("credit", dict(alpha=-1.0), r"alpha must be a finite number >= 0, got -1.0"),
    ("credit", dict(gamma=float("nan")), r"gamma must be a finite number >= 0, got nan"),
    ("credit", dict(beta=1.2), r"beta must be in \[0, 1\], got 1.2"),
    ("credit", dict(threshold=0.0), r"threshold must be in \(0, 1\], got 0.0"),
])
def test_out_of_range(name, options, match):
    with pytest.raises(ValueError, match=match):
        make_sampler(name, **options)


def test_unknown_option_lists_valid_ones():
    with pytest.raises(TypeError, match="Valid options: alpha, gamma, beta, threshold"):
        make_sampler("credit", tau=0.9)


# ---- end to end ------------------------------------------------------------------------------------
PROMPTS = [[5, 6, 7, 8], [9, 10], [11, 12, 13]]


@pytest.mark.parametrize("family", ["llada", "dream"])
@pytest.mark.parametrize("name", ["hierarchy", "credit"])
def test_decoding_finishes_and_batch_equals_alone(family, name):
    model = tiny(family, seed=1)
    out = dllm.generate(model, PROMPTS, sampler=name, gen_length=8, block_length=4, return_trace=True)
    assert (out.generated != model.mask_id).all() and (out.trace >= 0).all()
    assert out.nfe <= 8
    for j, p in enumerate(PROMPTS):
        alone = dllm.generate(model, [p], sampler=name, gen_length=8, block_length=4)
        assert torch.equal(out.generated[j], alone.generated[0]), (name, j)
    sampled = dllm.generate(model, PROMPTS, sampler=name, gen_length=8, block_length=4, temperature=0.8, seed=3)
    assert (sampled.generated != model.mask_id).all()


@pytest.mark.parametrize("name", ["hierarchy", "credit"])
def test_oracle_copy_is_exact_in_one_forward_per_block(name):
    exs = T.test_split("copy", 8, 4)
    out = dllm.generate(OracleLM(), oracle_prompts(exs), sampler=name, gen_length=8, block_length=4)
    assert all(score_generation(exs, out))
    assert out.nfe == 2 < 8  # C = 0: every position is certain, each block in one step
