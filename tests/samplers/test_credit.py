"""dInfer's credit decoding (``credit``): the credit trace against a scalar reference, alpha = 0 is the
threshold rule, option checks, and the exact-posterior oracle."""

import pytest
import torch

import dllm
from dllm import tasks as T
from dllm.models.oracle import OracleLM, oracle_prompts, score_generation
from dllm.samplers import make_sampler

from builders import V, decode_state, log_probs, prob_row, step_input


def _fused_conf_trace(p, steps, alpha=0.7, gamma=0.2, beta=0.8):
    """Reference: fused confidence of a position whose raw distribution is prob_row(p, tok), repeated."""
    q = (1 - p) / (V - 1)
    credit, out = 0.0, []
    for _ in range(steps):
        credit = beta * credit + p ** gamma
        top = p * (1 + credit) ** alpha  # exp(l + alpha log(1 + C)) = p (1 + C)^alpha
        out.append(top / (top + (V - 1) * q))
    return out


def test_credit_accumulates_and_commits_when_fused_confidence_passes():
    sampler = make_sampler("credit")
    state = decode_state((1, 3))
    sampler.begin_block(state)
    # pos 0 raw 0.8 (needs credit), pos 1 raw 0.85 (the top-1, always committed), pos 2 inactive
    rows = [[prob_row(0.8, 1), prob_row(0.85, 2), prob_row(0.99, 3)]]
    inp = step_input(log_probs(rows), [[True, True, False]])
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
    rows = [[prob_row(0.95, 1), prob_row(0.5, 2), prob_row(0.91, 3), prob_row(0.89, 4)]]
    inp = step_input(log_probs(rows), [[True] * 4])
    out = make_sampler("credit", alpha=0.0).step(inp, decode_state((1, 4)))
    ref = make_sampler("threshold").step(inp, None)
    assert torch.equal(out.commit, ref.commit | (ref.score == ref.score.max()))
    assert out.commit[0].tolist() == [True, False, True, False]


@pytest.mark.parametrize("options,match", [
    (dict(alpha=-1.0), r"alpha must be a finite number >= 0, got -1.0"),
    (dict(gamma=float("nan")), r"gamma must be a finite number >= 0, got nan"),
    (dict(beta=1.2), r"beta must be a number in \[0, 1\], got 1.2"),
    (dict(threshold=0.0), r"threshold must be a number in \(0, 1\], got 0.0"),
])
def test_out_of_range(options, match):
    with pytest.raises(ValueError, match=match):
        make_sampler("credit", **options)


def test_unknown_option_lists_valid_ones():
    with pytest.raises(TypeError, match="Valid options: alpha, gamma, beta, threshold"):
        make_sampler("credit", tau=0.9)


def test_oracle_copy_is_exact_in_one_forward_per_block():
    exs = T.test_split("copy", 8, 4)
    out = dllm.generate(OracleLM(), oracle_prompts(exs), sampler="credit", gen_length=8, block_length=4)
    assert all(score_generation(exs, out))
    assert out.nfe == 2 < 8  # C = 0: every position is certain, each block in one step
