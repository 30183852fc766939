"""DUS's decode step in few ATen calls (``dllm.samplers.dus``): the round table and its scores made
once per block width (``chunked.constant``), and the calls its own file issues per cached step."""

from __future__ import annotations

import pytest
import torch

from dllm.eval.bench.counters import count_generate
from dllm.models.tiny import tiny
from dllm.samplers.dus import dilated_rounds, round_tables

OWN_CALLS = 4  # per cached step from dllm/samplers/dus.py (defaults, T = 0); was 23


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
    assert own_calls_per_step("dus", "dllm/samplers/dus.py") <= OWN_CALLS


@pytest.mark.parametrize("block,base", [(1, 2), (6, 2), (8, 2), (10, 3), (32, 2)])
def test_round_tables_are_the_rounds(block, base):
    rounds, score = round_tables(block, base, torch.device("cpu"))
    assert torch.equal(rounds, dilated_rounds(block, base))
    assert score.shape == (1, block) and score.dtype == torch.float32
    assert torch.equal(score[0], -rounds.float())
    assert round_tables(block, base, torch.device("cpu"))[0] is rounds  # made once
