"""The ``stats=`` sampler option (``dllm.samplers.stats``): validation and the CPU default path.

Token equality of the fused path with the reference is tested in
``tests/kernels/test_fused_sampler_stats.py`` (it needs the Triton interpreter or a GPU)."""

from __future__ import annotations

import pytest
import torch

import dllm
from dllm.models import tiny
from dllm.samplers import make_sampler
from dllm.samplers.stats import STATS_CHOICES, check_stats, use_fused


@pytest.mark.parametrize("sampler", ["low_confidence", "threshold", "factor"])
def test_unknown_stats_choice_names_the_valid_ones(sampler):
    with pytest.raises(ValueError, match=r"stats must be one of 'torch', 'fused', 'auto', got 'gpu'"):
        make_sampler(sampler, stats="gpu")


def test_random_remasking_refuses_a_stats_choice():
    with pytest.raises(ValueError, match="'random' computes no probabilities"):
        make_sampler("random", stats="fused")
    assert make_sampler("random").config.stats == "torch"


def test_fused_refuses_eos_masked_confidence():
    with pytest.raises(ValueError, match="confidence_eos_eot_inf"):
        make_sampler("low_confidence", stats="fused", confidence_eos_eot_inf=True)
    make_sampler("low_confidence", stats="auto", confidence_eos_eot_inf=True)  # auto falls back


def test_auto_is_the_reference_path_on_cpu():
    logits = torch.zeros(1, 2, 8)
    assert not use_fused("auto", logits) and not use_fused("torch", logits)
    assert [check_stats(c) for c in STATS_CHOICES] == list(STATS_CHOICES)
    model = tiny("llada", seed=3)
    kw = dict(gen_length=8, block_length=4, sampler="threshold")
    ref = dllm.generate(model, [[11, 12, 13]], **kw).generated
    assert torch.equal(dllm.generate(model, [[11, 12, 13]], stats="auto", **kw).generated, ref)
