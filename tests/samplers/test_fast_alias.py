"""``fast`` (``dllm/samplers/fast.py``): a preset of the measured choice, nothing else."""

import pytest
import torch

import dllm
from dllm.models import tiny
from dllm.samplers import make_sampler, samplers
from dllm.samplers.fast import CHOICE, preset


@pytest.mark.parametrize("family", ["llada", "dream"])
def test_fast_equals_its_choice(family):
    base, options = CHOICE
    m = tiny(family, seed=4)
    prompts = [[7, 8, 9, 10], [11, 12]]
    a = dllm.generate(m, prompts, sampler="fast", gen_length=12, block_length=4)
    b = dllm.generate(m, prompts, sampler=base, gen_length=12, block_length=4, **options)
    assert torch.equal(a.sequences, b.sequences) and a.nfe == b.nfe


def test_fast_config_defaults_and_overrides():
    base, options = CHOICE
    s = make_sampler("fast")
    assert isinstance(s, samplers.get(base))
    for k, v in options.items():
        assert getattr(s.config, k) == v
    assert "chosen by measurement" in samplers.get("fast").__doc__
    assert "fast" in dict(dllm.list_samplers())


def test_preset_rejects_unknown_or_invalid_defaults():
    with pytest.raises(ValueError, match="has no options"):
        preset("x", "threshold", {"gamma": 0.1}, "")
    with pytest.raises(ValueError, match="threshold must be in"):
        preset("x", "threshold", {"threshold": 2.0}, "")
