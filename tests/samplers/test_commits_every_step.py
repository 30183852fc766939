"""Samplers that declare ``commits_every_step`` (the engine then skips its progress rule) commit at
least one mask of every row that has one, at every step: on random models, greedy and sampled,
batched and ragged, with and without a cache."""

from __future__ import annotations

import pytest
import torch

import dllm
from dllm.models.tiny import tiny
from dllm.samplers import make_sampler

CANDIDATES = ("threshold", "threshold:threshold=1.0", "threshold:threshold=0.5", "fast", "fast:compact=False",
              "lopa", "lopa:branches=1,bonus=False", "lopa:reuse=True,tau_conf=1.0", "lopa:verify_variants=False",
              "credit", "credit:threshold=1.0,alpha=0.0", "factor", "factor:factor=0.01", "factor:factor=4.0",
              "prophet", "fastdllm_v2", "hierarchy", "dmax", "sdar", "sdar:strategy=low_confidence_static",
              "klass", "klass:unmask=min_kl", "dus", "ssd", "ssd:draft=1", "spec_threshold",
              "spec_threshold:draft=1,threshold=1.0", "cover",
              "cover:threshold=0.05,verify_threshold=1.0,same_argmax_passes=False",
              "eb", "eb:gamma=0.0", "eb:proxy=confidence", "eb:proxy=margin", "localleap",
              "localleap:threshold=1.0,relaxed_threshold=1.0,radius=0")
DECLARED = [spec for spec in CANDIDATES if make_sampler(spec).commits_every_step]


def test_the_declarations():
    assert DECLARED == list(CANDIDATES)
    assert not make_sampler("threshold:schedule_steps=4").commits_every_step  # a capped step may commit none
    assert not make_sampler("low_confidence").commits_every_step


@pytest.mark.parametrize("cache", ["none", "dual"])
@pytest.mark.parametrize("spec", DECLARED)
@pytest.mark.parametrize("family", ["llada", "dream"])
def test_every_step_commits_in_every_unfinished_row(family, spec, cache):
    model = tiny(family, seed=7)
    prompts = [list(range(10, 22)), list(range(14, 22))]
    greedy_only = make_sampler(spec).greedy_only
    for temperature, seed in ((0.0, None),) + (() if greedy_only else ((1.0, 5),)):
        seen = []

        def check(state):
            block = state.x[:, state.block_start:state.block_end] == state.mask_id  # [B, W]
            seen.append(block.sum(dim=1).tolist())

        dllm.generate(model, prompts, sampler=spec, cache=cache, gen_length=16, block_length=8,
                      temperature=temperature, seed=seed, callback=check)
        before = [8, 8]  # a block's masks when it starts
        for counts in seen:
            assert all(c < b for c, b in zip(counts, before) if b > 0), (seen, spec)
            before = counts if any(counts) else [8, 8]
