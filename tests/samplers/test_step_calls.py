"""What every registered sampler's cached step issues outside the transformer layers, bounded: on a GPU
each ATen call issued from Python costs ~20 us of host time, so a change that adds calls to a step
fails here (benchmarks/results/step-counts.txt lists the counts; issue 44's bar is 30).

Counted as ``benchmarks/step_counts.py`` counts its second table: tiny LLaDA in bfloat16, the fused
layer with its one-launch operators (as on CUDA), the dual cache, one prompt of 24 tokens, 16
positions in blocks of 8, means over the cached steps. Each bound is the count measured when it was
set with a little slack (a tiny model's bfloat16 logits may take a step more or less on another CPU).
``apd`` is left out: most of its calls are its autoregressive verifier's, a ``transformers`` model.
"""

from __future__ import annotations

import pytest
import torch

from dllm.eval.bench.counters import DispatchCounter, count_generate
from dllm.models.tiny import tiny
from dllm.samplers import samplers

# spec -> the most ATen calls outside the layers per cached step (measured, then rounded up with slack)
OUTSIDE = {
    "cover": 92, "credit": 30, "dawn": 146, "dmax": 69, "dus": 17, "eb": 26, "entropy": 24, "factor": 23,
    "fast:compact=False": 70, "fastdllm_v2": 22, "hierarchy": 29, "klass": 31, "learn2pd": 40, "localleap": 22,
    "lopa:compact=False": 90, "low_confidence": 21, "maskgit_plus": 23, "origin": 30, "prophet": 31, "random": 19,
    "sdar": 24, "spec_threshold": 56, "ssd": 60, "threshold": 19, "topk_margin": 24, "wino": 66,
}
LEFT_OUT = {"apd"}


@pytest.fixture(scope="module")
def model():
    m = tiny("llada", dtype=torch.bfloat16)
    m.transformer.set_fused(True, ops=True)
    return m


def test_every_registered_sampler_has_a_bound():
    named = {spec.split(":")[0] for spec in OUTSIDE} | LEFT_OUT
    assert named == set(samplers.names())


@pytest.mark.parametrize("spec", sorted(OUTSIDE))
def test_calls_outside_the_layers_per_cached_step(model, spec):
    prompt = torch.randint(10, 40, (1, 24), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        steps = count_generate(model, prompt, sampler=spec, cache="dual", gen_length=16,
                               block_length=8).cached_steps(40)
    assert steps, "the cached steps forward fewer columns than the canvas"
    stats = DispatchCounter.mean(steps)
    assert stats["aten_outside"] <= OUTSIDE[spec], stats
