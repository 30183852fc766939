"""EB-Sampler's decode step in few ATen calls (``dllm.samplers.eb``), the same decisions: the prefix
with +inf at the inactive entries and a running minimum against the masked ``cumprod`` form, and the
calls its own file issues per cached step."""

from __future__ import annotations

import math

import pytest
import torch

from dllm.eval.bench.counters import count_generate
from dllm.models.tiny import tiny
from dllm.samplers.eb import entropy_prefix, prefix_within

OWN_CALLS = 12  # per cached step from dllm/samplers/eb.py (defaults, T = 0); was 26


def own_calls_per_step(spec: str, path: str) -> float:
    """ATen calls per cached step issued from ``path`` (tiny LLaDA, bfloat16, dual cache)."""
    model = tiny("llada", dtype=torch.bfloat16)
    model.transformer.set_fused(True, ops=True)
    prompt = torch.randint(10, 40, (1, 24), generator=torch.Generator().manual_seed(0))
    steps = count_generate(model, prompt, sampler=spec, cache="dual", gen_length=16, block_length=8,
                           trace=True).cached_steps(40)
    assert steps
    return sum(n for s in steps for site, n in s.outside_ops.items() if f" @ {path}:" in site) / len(steps)


def test_own_calls_per_cached_step():
    assert own_calls_per_step("eb", "dllm/samplers/eb.py") <= OWN_CALLS


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
