"""``prefix`` / ``dual`` with their real schedules reproduce Fast-dLLM's cached drivers token for token.

Reference: ``tests/reference/decoders/fastdllm_generate.py`` (NVlabs/Fast-dLLM ``llada/generate.py``, later
version f6b35ec, with the cache semantics of its modified LLaDA modelling restated over the weights
of a tiny float32 ``dllm`` LLaDA model). Batch 1 and an equal-length batch (Fast-dLLM has no
padding). Cases where the reference would commit the mask id itself (``dllm`` never proposes it)
are skipped by seed, as in ``tests/samplers/test_reference_equality.py``.

``threshold`` is Fast-dLLM's own rule (float64 confidence); ``low_confidence`` is LLaDA's fixed
schedule, which Fast-dLLM also runs, but with a float64 confidence where LLaDA (and ``dllm``) use
the logits dtype: equal here unless two float32 confidences round together (not seen on these
seeds).
"""

from __future__ import annotations

import functools

import pytest
import torch

import dllm
from dllm.models import tiny

from tests.reference.decoders.fastdllm_generate import (  # noqa: E402
    FastDLLMLLaDA,
    fastdllm_generate,
    generate_with_dual_cache,
    generate_with_prefix_cache,
)
from tests.reference.decoders.llada_generate import MaskCommitError  # noqa: E402

DRIVERS = {"none": fastdllm_generate, "prefix": generate_with_prefix_cache, "dual": generate_with_dual_cache}
SEEDS = range(4)


@functools.lru_cache(maxsize=None)
def _model(seed):
    return tiny("llada", seed=seed)


def _prompt(seed, batch, length=7):
    g = torch.Generator().manual_seed(100 + seed)
    return torch.randint(10, 60, (batch, length), generator=g)


def _pair(cache, seed, batch, sampler, threshold=None, steps=None, gen_length=16, block_length=4, **driver):
    model = _model(seed)
    prompt = _prompt(seed, batch)
    ref_steps = steps if steps is not None else -(-gen_length // block_length)  # unused in threshold mode
    ref, ref_nfe = DRIVERS[cache](FastDLLMLLaDA(model), prompt, steps=ref_steps, gen_length=gen_length,
                                  block_length=block_length, mask_id=model.mask_id,
                                  remasking="low_confidence", threshold=threshold, forbid_mask_commit=True,
                                  **driver)
    opts = {"threshold": threshold} if sampler == "threshold" else {"steps": steps}
    out = dllm.generate(model, prompt, sampler=sampler, gen_length=gen_length, block_length=block_length,
                        cache=cache, **opts)
    return ref, ref_nfe, out


def _check(cache, batch, sampler, **kw):
    compared = 0
    for seed in SEEDS:
        try:
            ref, ref_nfe, out = _pair(cache, seed, batch, sampler, **kw)
        except MaskCommitError:
            continue
        assert torch.equal(out.sequences, ref), (cache, seed)
        assert out.nfe == ref_nfe, (cache, seed)
        compared += 1
    assert compared >= 2


@pytest.mark.parametrize("batch", [1, 3], ids=["b1", "b3"])
@pytest.mark.parametrize("threshold", [0.9, 0.3], ids=["t0.9", "t0.3"])
@pytest.mark.parametrize("cache", ["prefix", "dual", "none"])
def test_threshold_matches_fastdllm(cache, threshold, batch):
    _check(cache, batch, "threshold", threshold=threshold)


@pytest.mark.parametrize("batch", [1, 3], ids=["b1", "b3"])
@pytest.mark.parametrize("cache", ["prefix", "dual"])
def test_fixed_schedule_matches_fastdllm(cache, batch):
    _check(cache, batch, "low_confidence", steps=8)


@pytest.mark.parametrize("batch", [1, 3], ids=["b1", "b3"])
@pytest.mark.parametrize("cache", ["prefix", "dual"])
def test_a_partial_last_block_matches_the_engine(cache, batch):
    """The drivers' ``partial_last_block`` (used by benchmarks/e2e_driver.py and frontier_driver.py on
    answers that are not a multiple of the block) decodes 10 positions in blocks of 4, 4, 2 exactly as
    the engine does."""
    _check(cache, batch, "threshold", threshold=0.5, gen_length=10, partial_last_block=True)
    with pytest.raises(AssertionError):  # the original's rule stays the default
        _pair(cache, 0, 1, "threshold", threshold=0.5, gen_length=10)


def test_the_comparison_is_not_vacuous():
    """On these seeds the cached drivers decode differently from no cache, and the threshold lets
    several tokens through in one step."""
    differs, parallel = False, False
    for seed in SEEDS:
        try:
            none, none_nfe, _ = _pair("none", seed, 1, "threshold", threshold=0.3)
            for cache in ("prefix", "dual"):
                ref, nfe, _ = _pair(cache, seed, 1, "threshold", threshold=0.3)
                differs |= not torch.equal(ref, none)
        except MaskCommitError:
            continue
        parallel |= none_nfe < 16
    assert differs and parallel
