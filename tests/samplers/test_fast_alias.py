"""``fast`` (``dllm/samplers/fast.py``): a preset of the measured choice, nothing else."""

from dataclasses import asdict

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


OVERRIDE = {"tau_conf": 0.3}  # an option of the chosen sampler that changes its decode below


def test_fast_config_defaults_and_overrides():
    base, options = CHOICE
    base_cls = samplers.get(base)
    s = make_sampler("fast")
    assert isinstance(s, base_cls)
    # the defaults are the chosen preset's: the base sampler's config with the preset's options
    assert asdict(s.config) == asdict(base_cls.Config(**options))
    assert "chosen by measurement" in samplers.get("fast").__doc__
    assert "fast" in dict(dllm.list_samplers())
    # an override replaces the preset's default and reaches the decode: fast with it equals the base
    # sampler with it, and differs from fast without it
    assert set(OVERRIDE) <= set(asdict(s.config)), f"pick an option of {base!r} for OVERRIDE"
    assert asdict(make_sampler("fast", **OVERRIDE).config) == asdict(base_cls.Config(**{**options, **OVERRIDE}))
    m = tiny("llada", seed=4)
    prompts = [[7, 8, 9, 10], [11, 12]]
    kw = dict(gen_length=12, block_length=4)
    default = dllm.generate(m, prompts, sampler="fast", **kw)
    override = dllm.generate(m, prompts, sampler="fast", **OVERRIDE, **kw)
    ref = dllm.generate(m, prompts, sampler=base, **{**options, **OVERRIDE}, **kw)
    assert torch.equal(override.sequences, ref.sequences) and override.nfe == ref.nfe
    assert override.nfe != default.nfe or not torch.equal(override.sequences, default.sequences)


def test_preset_rejects_unknown_or_invalid_defaults():
    with pytest.raises(ValueError, match="has no options"):
        preset("x", "threshold", {"gamma": 0.1}, "")
    with pytest.raises(ValueError, match=r"threshold must be (a number )?in \(0, 1\], got 2.0"):
        preset("x", "threshold", {"threshold": 2.0}, "")
