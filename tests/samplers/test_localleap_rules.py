"""LocalLeap's decode step in few ATen calls (``dllm.samplers.localleap``), the same decisions: the anchor
neighbourhood as a running window maximum against the window counts of a cumsum, the step against
``threshold_commit`` with the per-position bar (its calls per cached step:
``tests/samplers/test_step_calls.py``)."""

from __future__ import annotations

import pytest
import torch

from dllm.samplers import make_sampler
from dllm.samplers._ops import threshold_commit
from dllm.samplers.localleap import near_anchor

from builders import MASK, V, step_input


def _window_counts(anchor, radius):
    n = anchor.shape[1]
    csum = torch.nn.functional.pad(anchor.long().cumsum(dim=1), (1, 0))
    i = torch.arange(n)
    return (csum[:, (i + radius + 1).clamp(max=n)] - csum[:, (i - radius).clamp(min=0)]) > 0


@pytest.mark.parametrize("radius", [0, 1, 2, 4, 9, 40])
def test_near_anchor_is_the_window_count(radius):
    g = torch.Generator().manual_seed(radius)
    for width in (1, 2, 7, 32):
        anchor = torch.rand(32, width, generator=g) < 0.15
        assert torch.equal(near_anchor(anchor, radius), _window_counts(anchor, radius))


@pytest.mark.parametrize("radius,tau,relaxed", [(0, 0.9, 0.75), (2, 0.6, 0.3), (4, 0.5, 0.5), (20, 0.8, 0.2)])
def test_step_is_threshold_commit_with_the_per_position_bar(radius, tau, relaxed):
    sampler = make_sampler("localleap", radius=radius, threshold=tau, relaxed_threshold=relaxed)
    g = torch.Generator().manual_seed(3)
    for _ in range(20):
        logits = torch.randn(6, 12, V, generator=g) * 4
        active = torch.rand(6, 12, generator=g) < 0.7
        active[0] = False  # a row without active masks
        out = sampler.step(step_input(logits, active, window=(2, 10), mask_id=MASK), None)
        conf = out.score  # the active masks' confidences, -inf elsewhere
        anchor = conf >= tau
        bar = torch.where(_window_counts(anchor, radius), conf.new_tensor(relaxed), conf.new_tensor(tau))
        assert torch.equal(out.commit, threshold_commit(conf, active, bar))
