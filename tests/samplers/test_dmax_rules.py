"""DMax's decode step in few ATen calls (``dllm.samplers.dmax``), the same bits: the left-to-right rule as
one cumsum against its literal form, the probability of the arg-max from one ``max`` against the gather
(its calls per cached step: ``tests/samplers/test_step_calls.py``)."""

from __future__ import annotations

import pytest
import torch

from dllm.samplers.chunked import argmax_excluding
from dllm.samplers.dmax import left_to_right, top1_prob


def _literal_left_to_right(masks, conf, threshold):
    failed = (masks & (conf < threshold)).long().cumsum(dim=1) > 0
    chosen = masks & ~failed
    first = masks & (masks.long().cumsum(dim=1) == 1)
    return torch.where(chosen.any(dim=1, keepdim=True), chosen, first)


@pytest.mark.parametrize("threshold", [0.0, 0.25, 0.5, 1.0])
def test_left_to_right_is_the_literal_rule(threshold):
    g = torch.Generator().manual_seed(0)
    for width in (1, 2, 5, 8, 33):
        masks = torch.rand(64, width, generator=g) < 0.6
        conf = torch.randint(0, 5, (64, width), generator=g).float() / 4  # values on the threshold too
        assert torch.equal(left_to_right(masks, conf, threshold), _literal_left_to_right(masks, conf, threshold))


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float32, torch.float64])
@pytest.mark.parametrize("mask_id", [0, 5, 15, 40])
def test_top1_prob_is_the_gathered_softmax(dtype, mask_id):
    g = torch.Generator().manual_seed(1)
    logits = torch.randint(-4, 5, (3, 7, 16), generator=g).to(dtype)  # many ties at the maximum
    logits[0, 0, 3:] = float("-inf")
    x0, conf = top1_prob(logits, mask_id)
    want = argmax_excluding(logits, mask_id)
    z = logits.float()
    assert torch.equal(x0, want)
    assert torch.equal(conf, torch.exp(z.gather(-1, want[..., None]).squeeze(-1) - torch.logsumexp(z, dim=-1)))
