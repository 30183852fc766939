"""Learn2PD's decode step in few ATen calls (``dllm.samplers.learn2pd``), the same bits: the folded filter
against ``Learn2PDFilter.forward``, ``top_confidence`` against the gathered confidence, the one-arg-max
end of text against the rule step by step (its calls per cached step:
``tests/samplers/test_step_calls.py``)."""

from __future__ import annotations

import pytest
import torch

from dllm.samplers.learn2pd import (block_confidence, end_of_text, fold_filter, load_filter, text_end,
                                    top_confidence)


@pytest.mark.parametrize("name", ["learn2pd-tiny", "learn2pd-tiny-surprisal"])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float32, torch.float64])
def test_the_folded_filter_gives_the_filters_bits(name, dtype):
    f = load_filter(name)
    folded = fold_filter(f)
    g = torch.Generator().manual_seed(1)
    for w in (1, 5, 8, 32):
        conf = torch.rand(4, w, generator=g)
        conf[0] = 1.0  # the surprisal's cap
        conf[1] = torch.rand(w, generator=g) * 1e-6
        conf = conf.to(dtype)
        with torch.no_grad():
            want, got = f(conf), folded(conf)
        assert torch.equal(want, got) and torch.equal(want.signbit(), got.signbit()), (w, dtype)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
def test_top_confidence_is_the_probability_of_the_argmax(dtype):
    g = torch.Generator().manual_seed(2)
    for _ in range(50):
        logits = (torch.randn(2, 6, 40, generator=g) * 4).to(dtype)
        logits[0, 0, 9] = logits[0, 0, 3] = logits[0, 0].max() + 1  # tied maxima
        assert torch.equal(top_confidence(logits), block_confidence(logits, logits.argmax(dim=-1)))


def _end_of_text_stepwise(accepted, x0, conf, active, eos):
    """The rule as written: (a) after the first accepted EOS proposal, else (b) after the likeliest one."""
    w = x0.shape[1]
    col = torch.arange(w)
    eos_mask = active & (x0 == eos)
    by_filter = accepted & (x0 == eos)
    first = torch.where(by_filter, col, w).amin(dim=1)
    likeliest = conf.masked_fill(~eos_mask, float("-inf")).argmax(dim=1)
    end = torch.where(by_filter.any(dim=1), first, torch.where(eos_mask.any(dim=1), likeliest, w))
    return active & (col[None, :] > end[:, None])


def test_end_of_text_in_one_argmax_is_the_rule():
    g = torch.Generator().manual_seed(3)
    for t in range(500):
        b, w = 3, 1 + t % 9
        x0 = torch.randint(0, 4, (b, w), generator=g)
        conf = (torch.randint(0, 5, (b, w), generator=g) / 4).to([torch.bfloat16, torch.float32][t % 2])  # ties
        active = torch.rand(b, w, generator=g) < 0.7
        hi = torch.rand(b, w, generator=g) < 0.3  # the filter's yes, masks or not
        want = _end_of_text_stepwise(active & hi, x0, conf, active, 2)
        assert torch.equal(end_of_text(active & hi, x0, conf, active, 2), want)
        assert torch.equal(active & (torch.arange(w) > text_end(hi, x0, conf, active, 2)), want)
