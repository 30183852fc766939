"""Fast-dLLM v2's decode step in few ATen calls (``dllm.samplers.fastdllm_v2``), the same bits: a greedy
step whose query lies in one sub-block (no rows gathered) against the gathered path (its calls per cached
step: ``tests/samplers/test_step_calls.py``)."""

from __future__ import annotations

import pytest
import torch

import dllm
from dllm.models.tiny import tiny
from dllm.samplers import fastdllm_v2


@pytest.mark.parametrize("family,prompts,kw", [
    ("fastdllm_v2", [[5, 6, 7, 8, 9, 10, 11], [12, 13, 14, 15, 16, 17, 18]], dict(cache="subblock", small_block_size=4)),
    ("fastdllm_v2", [[5, 6, 7]], dict(cache="block", small_block_size=8, threshold=0.1)),
    ("fastdllm_v2", [[5, 6, 7, 8, 9]], dict(cache="subblock", small_block_size=2, threshold=0.5)),
    ("llada", [[5, 6, 7, 8], [9, 10]], dict(cache="dual", small_block_size=8)),
    ("llada", [[5, 6, 7, 8], [9, 10]], dict(cache="dual", small_block_size=8, threshold=0.5)),
])
def test_one_sub_block_steps_equal_the_gathered_path(family, prompts, kw, monkeypatch):
    model = tiny(family, dtype=torch.bfloat16, seed=3)
    run = lambda: dllm.generate(model, prompts, sampler="fastdllm_v2", gen_length=16, block_length=8,  # noqa: E731
                                return_trace=True, **kw)
    used = []
    direct = fastdllm_v2._in_one_sub_block
    monkeypatch.setattr(fastdllm_v2, "_in_one_sub_block", lambda *a: used.append(direct(*a)) or used[-1])
    fast = run()
    monkeypatch.setattr(fastdllm_v2, "_in_one_sub_block", lambda *a: False)
    gathered = run()
    assert any(used), "no step took the one-sub-block path"
    assert torch.equal(fast.sequences, gathered.sequences) and torch.equal(fast.trace, gathered.trace)
    assert fast.nfe == gathered.nfe
