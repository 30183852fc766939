"""``auto`` (dllm/cache/auto.py): a preset of the measured choice, nothing else."""

import pytest
import torch

import dllm
from dllm.cache import caches, make_cache
from dllm.cache.auto import CHOICE
from dllm.models import tiny
from dllm.registry import format_spec, preset_class

PROMPTS = [[7, 8, 9, 10, 11, 12], [13, 14]]


@pytest.mark.skipif(CHOICE is None, reason="no cache policy passed the rule: auto is not registered")
def test_auto_is_the_chosen_policy_with_its_defaults():
    base, defaults = CHOICE
    auto = make_cache("auto")
    assert isinstance(auto, caches.get(base)) and auto.name == "auto"
    for key, value in defaults.items():
        assert getattr(auto.config, key) == value
    model = tiny("llada", seed=3)
    kw = dict(sampler="threshold", threshold=0.5, gen_length=12, block_length=4, return_trace=True)
    a = dllm.generate(model, PROMPTS, cache="auto", **kw)
    b = dllm.generate(model, PROMPTS, cache=format_spec(base, defaults), **kw)
    assert torch.equal(a.sequences, b.sequences) and (a.nfe, a.forwarded_tokens) == (b.nfe, b.forwarded_tokens)
    # a caller's option overrides the preset's default
    assert make_cache("auto", **{next(iter(defaults)): 0}).config != auto.config or not defaults


def test_preset_refuses_unknown_or_invalid_defaults():
    with pytest.raises(ValueError, match=r"preset 'x': 'dual' has no options \['gamma'\]"):
        preset_class(caches, "x", "dual", {"gamma": 0.1}, "")
    with pytest.raises(ValueError, match="look_back"):
        preset_class(caches, "x", "dual", {"look_back": -1}, "")
