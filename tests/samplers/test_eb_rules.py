"""EB-Sampler's decode step in few ATen calls (``dllm.samplers.eb``), the same decisions: the prefix with
+inf at the inactive entries and a running minimum against the masked ``cumprod`` form (its calls per
cached step: ``tests/samplers/test_step_calls.py``)."""

from __future__ import annotations

import math

import pytest
import torch

from dllm.samplers.eb import entropy_prefix, prefix_within


def _literal_prefix(entropy_sorted, valid_sorted, gamma):
    h = entropy_sorted.masked_fill(~valid_sorted, 0.0)
    ok = (h.cumsum(dim=1) - h.cummax(dim=1).values <= gamma) & valid_sorted
    ok[:, 0] = valid_sorted[:, 0]
    return ok.long().cumprod(dim=1)


@pytest.mark.parametrize("gamma", [0.0, 0.1, 1.0, math.inf])
def test_prefix_is_the_masked_cumprod_rule(gamma):
    g = torch.Generator().manual_seed(0)
    for width in (1, 3, 8, 32):
        h = torch.rand(128, width, generator=g, dtype=torch.float64) * (torch.rand(128, width, generator=g) < 0.7)
        h = h.sort(dim=1).values  # as the entropy order gives them; zeros (determined positions) first
        valid = torch.arange(width) < torch.randint(0, width + 1, (128, 1), generator=g)  # valid entries first
        want = _literal_prefix(h, valid, gamma)
        assert torch.equal(entropy_prefix(h, valid, gamma), want.sum(dim=1))
        assert torch.equal(prefix_within(h.masked_fill(~valid, math.inf), gamma), want.bool())
