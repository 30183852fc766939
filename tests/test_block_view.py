"""The block view (``Sampler.reads_block_only``): the engine computes logits for the block's columns
only and hands the sampler a StepInput whose query is the block. It must decide exactly as the
reference path (the full query's logits), for every sampler that declares it."""

import pytest
import torch

import dllm
from dllm.models.tiny import tiny
from dllm.samplers import samplers

BLOCK_ONLY = sorted(e.name for e in samplers if e.obj.reads_block_only)


def test_the_fast_ones_declare_it():
    assert {"threshold", "factor", "lopa", "spec_threshold", "ssd", "fast"} <= set(BLOCK_ONLY)
    assert "low_confidence" not in BLOCK_ONLY  # its T > 0 noise is drawn over the whole query
    assert "dawn" not in BLOCK_ONLY and "prophet" not in BLOCK_ONLY  # they read the whole query


def _both(monkeypatch, model, prompts, name, **kw):
    fast = dllm.generate(model, prompts, sampler=name, return_trace=True, **kw)
    with monkeypatch.context() as m:
        m.setattr(samplers.get(name), "reads_block_only", False)
        ref = dllm.generate(model, prompts, sampler=name, return_trace=True, **kw)
    return fast, ref


@pytest.mark.parametrize("family", ["llada", "dream"])
@pytest.mark.parametrize("cache", ["none", "prefix", "dual"])
def test_block_view_equals_the_full_query(monkeypatch, family, cache):
    model = tiny(family, seed=5)
    prompts = [[7, 8, 9, 10, 11, 12], [13, 14, 15]]  # ragged: left padding
    for name in BLOCK_ONLY:
        for temperature in (0.0, 0.7):
            if samplers.get(name).greedy_only and temperature > 0:
                continue
            kw = dict(gen_length=12, block_length=4, cache=cache, temperature=temperature, seed=3)
            fast, ref = _both(monkeypatch, model, prompts, name, **kw)
            assert torch.equal(fast.sequences, ref.sequences), (name, temperature)
            assert torch.equal(fast.trace, ref.trace), (name, temperature)
            if getattr(samplers.get(name).Config(), "reuse", False):  # the full view forwards anew
                assert fast.nfe <= ref.nfe, name  # (tests/test_carried_logits.py: the reused logits)
            else:
                assert fast.nfe == ref.nfe and fast.forwarded_tokens == ref.forwarded_tokens, name


def test_the_head_runs_on_the_block_rows_only(monkeypatch):
    model = tiny("llada", seed=2)
    rows = []
    hook = model.transformer.lm_head.register_forward_hook(lambda m, a, out: rows.append(out.shape[1]))
    try:
        dllm.generate(model, [[7, 8, 9, 10, 11, 12, 13, 14]], sampler="threshold", gen_length=8, block_length=4)
    finally:
        hook.remove()
    assert rows and set(rows) == {4}  # not the 16-column canvas


def test_logits_rows_refuses_rows_a_shifted_family_does_not_have():
    model = tiny("dream", seed=1)
    x = torch.randint(10, 40, (1, 8))
    assert torch.equal(model(x, logits_rows=(1, 5)).logits, model(x).logits[:, 1:5])
    with pytest.raises(ValueError, match="1 <= a < b <= 8"):
        model(x, logits_rows=(0, 5))
    with pytest.raises(ValueError, match="1 <= a < b <= 8"):
        model(x, logits_rows=(3, 9))
