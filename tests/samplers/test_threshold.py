"""Fast-dLLM's threshold and factor rules: hand-built logits and end-to-end progress."""

import pytest
import torch

import dllm
from dllm.models import tiny
from dllm.samplers import make_sampler
from dllm.samplers.threshold import factor_prefix
from dllm.state import StepInput

MASK, V = 9, 10


def _input(probs_rows, active=None):
    probs = torch.tensor(probs_rows, dtype=torch.float64)  # [W, V]
    logits = torch.log(probs).float()[None]  # [1, W, V]
    width = logits.shape[1]
    active = torch.ones(1, width, dtype=torch.bool) if active is None else torch.tensor([active])
    return StepInput(logits=logits, tokens=torch.full((1, width), MASK), active=active, query_start=0,
                     window=(0, width), step=0, steps=None, mask_id=MASK, temperature=0.0, generator=None)


def _row(p_top, tok):
    row = [(1 - p_top) / (V - 1)] * V
    row[tok] = p_top
    return row


def test_threshold_commits_confident_masks_only():
    inp = _input([_row(0.95, 1), _row(0.5, 2), _row(0.91, 3), _row(0.89, 4)])
    out = make_sampler("threshold", threshold=0.9).step(inp, None)
    assert out.commit[0].tolist() == [True, False, True, False]
    assert out.tokens[0].tolist() == [1, 2, 3, 4]


def test_threshold_is_inclusive_and_respects_active():
    inp = _input([_row(0.9, 1), _row(0.99, 2)], active=[True, False])
    out = make_sampler("threshold", threshold=0.9).step(inp, None)
    assert out.commit[0].tolist() == [True, False]


@pytest.mark.parametrize("conf,f,n", [
    ([0.99, 0.8, 0.7], 1.0, 2),  # k=2: 3*0.2=0.6 ok; k=3: 4*0.3=1.2 > 1 stop
    ([0.99, 0.5, 0.99], 1.0, 1),  # k=2 fails: the later confident one is not reached
    ([0.99, 0.9, 0.9, 0.9], 1.0, 4),
    ([0.1, 0.1], 1.0, 1),  # top-1 always
    ([0.99, 0.8, 0.7], 1.3, 3),
])
def test_factor_prefix(conf, f, n):
    assert factor_prefix(torch.tensor([conf], dtype=torch.float64), f).tolist() == [n]


def test_factor_commits_the_prefix_in_confidence_order():
    inp = _input([_row(0.7, 1), _row(0.99, 2), _row(0.8, 3)])
    out = make_sampler("factor", factor=1.0).step(inp, None)
    assert out.commit[0].tolist() == [False, True, True]


@pytest.mark.parametrize("name,options,match", [
    ("threshold", dict(threshold=0.0), r"threshold must be in \(0, 1\], got 0.0"),
    ("threshold", dict(threshold=1.5), r"threshold must be in \(0, 1\], got 1.5"),
    ("factor", dict(factor=0.0), r"factor must be > 0, got 0.0"),
    ("factor", dict(factor=-1.0), r"factor must be > 0, got -1.0"),
])
def test_out_of_range(name, options, match):
    with pytest.raises(ValueError, match=match):
        make_sampler(name, **options)


@pytest.mark.parametrize("family", ["llada", "dream"])
@pytest.mark.parametrize("name,options", [("threshold", dict(threshold=1.0)), ("threshold", {}), ("factor", {})])
def test_adaptive_decoding_finishes_and_threshold_one_is_one_token_per_step(family, name, options):
    model = tiny(family, seed=1)
    out = dllm.generate(model, [[5, 6, 7], [8, 9]], sampler=name, gen_length=8, block_length=4,
                        return_trace=True, **options)
    assert (out.generated != model.mask_id).all()
    assert out.nfe <= 8
    if options.get("threshold") == 1.0:  # nothing reaches p = 1: exactly the forced top-1 per step
        assert out.nfe == 8
        ref = dllm.generate(model, [[5, 6, 7], [8, 9]], sampler="low_confidence", gen_length=8, block_length=4)
        assert torch.equal(out.sequences, ref.sequences)
