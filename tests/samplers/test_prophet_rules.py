"""Prophet's decode step in few ATen calls (``dllm.samplers.prophet``), the same bits: the threshold table
against the per-step phase rule, the top-2 gap as one multiply-and-sum against the subtraction in the logits
dtype (its calls per cached step: ``tests/samplers/test_step_calls.py``)."""

from __future__ import annotations

import pytest
import torch

from dllm.samplers import make_sampler
from dllm.samplers.prophet import EARLY_PHASE, MID_PHASE, _plus_minus, thresholds


@pytest.mark.parametrize("gen_length", [1, 3, 10, 100, 256])
def test_the_threshold_table_is_the_phase_rule(gen_length):
    cfg = make_sampler("prophet", early_threshold=7.5, mid_threshold=5.0, late_threshold=float("inf")).config
    committed = torch.arange(gen_length + 1)
    progress = (committed + 1).to(torch.float64) / gen_length
    phase = (progress >= EARLY_PHASE).long() + (progress >= MID_PHASE).long()
    tau = torch.full_like(progress, cfg.late_threshold)
    tau = torch.where(phase == 1, cfg.mid_threshold, tau)
    tau = torch.where(phase == 0, cfg.early_threshold, tau)
    assert torch.equal(thresholds(cfg, gen_length, gen_length, torch.device("cpu")), tau)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float32, torch.float64])
def test_the_gap_as_one_multiply_and_sum_is_the_subtraction_in_the_logits_dtype(dtype):
    """As Prophet's ``top2[0] - top2[1]``: one rounding to the logits dtype (a float32 gap of bfloat16 logits
    is not theirs: ``test_prophet_upstream.py``)."""
    g = torch.Generator().manual_seed(0)
    pair = _plus_minus(dtype, torch.device("cpu"))  # as the sampler makes it
    for _ in range(100):
        scale = torch.exp2(torch.randint(-30, 30, (4, 9, 1), generator=g).float())
        top2 = (torch.randn(4, 9, 2, generator=g) * scale).to(dtype).sort(dim=-1, descending=True).values
        want = top2[..., 0] - top2[..., 1]  # in dtype
        got = (top2 * pair).sum(dim=-1)
        assert got.dtype == dtype
        torch.testing.assert_close(got, want, rtol=0, atol=0, equal_nan=True)  # inf - inf
