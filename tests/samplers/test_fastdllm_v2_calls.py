"""Fast-dLLM v2's decode step in few ATen calls (``dllm.samplers.fastdllm_v2``), the same bits: a greedy
step whose query lies in one sub-block (no rows gathered) against the gathered path, and the calls its
own file issues per cached step."""

from __future__ import annotations

import pytest
import torch

import dllm
from dllm.eval.bench.counters import count_generate
from dllm.models.tiny import tiny
from dllm.samplers import fastdllm_v2

OWN_CALLS = 11  # per cached step from dllm/samplers/fastdllm_v2.py (LLaDA, sub-block = block, T = 0); was 46


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
    assert own_calls_per_step("fastdllm_v2", "dllm/samplers/fastdllm_v2.py") <= OWN_CALLS


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
