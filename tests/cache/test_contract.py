"""Every registered sampler runs with every registered cache policy on both model families and
finishes with no masks; forwarded-token and NFE counts per policy are exact."""

import pytest
import torch

import dllm
from dllm.cache import caches
from dllm.models import tiny
from dllm.samplers import samplers

SAMPLERS = [e.name for e in samplers]
POLICIES = [e.name for e in caches] + ["dual:look_back=2,look_ahead=2,warmup=1", "window:buffer=4,refresh=2",
            "drift:threshold=1e-30,max_extra=3"]
PROMPTS = [[7, 8, 9, 10, 11], [12, 13], [14, 15, 16]]


@pytest.fixture(scope="module", params=["llada", "dream"])
def model(request):
    return tiny(request.param, seed=5, n_layers=4)  # attention samplers (DAWN) read the last 4 layers


@pytest.mark.parametrize("cache", POLICIES)
@pytest.mark.parametrize("sampler", SAMPLERS)
def test_every_sampler_runs_with_every_cache(model, sampler, cache):
    cls = samplers.get(sampler)
    if cache in ("block", "subblock"):  # block-causal models only (tests/cache/test_block_cache.py,
        #   tests/models/families/test_fastdllm_v2.py run them)
        with pytest.raises(ValueError, match="of a block-causal model|for a block-causal model"):
            dllm.generate(model, PROMPTS, sampler=sampler, cache=cache, gen_length=8, block_length=4)
        return
    refused = (cls.needs_variants and "refresh" in cache) or (cls.shadow_block and cache.startswith("drift"))
    if refused and not cache.startswith("none"):
        # verifying samplers under mid-block refreshes, shadow blocks under drift's extra columns
        with pytest.raises(ValueError, match=f"cache policy '{cache.partition(':')[0]}' cannot serve"):
            dllm.generate(model, PROMPTS, sampler=sampler, cache=cache, gen_length=8, block_length=4)
        return
    out = dllm.generate(model, PROMPTS, sampler=sampler, cache=cache, gen_length=8, block_length=4,
                        return_trace=True, seed=0)
    assert out.sequences.shape == (3, 13)
    assert (out.generated != model.mask_id).all()
    assert (out.trace >= 0).all()
    for j, p in enumerate(PROMPTS):
        assert out.sequences[j, 5 - len(p):5].tolist() == p


def _expected_forwarded(model, cache, *, lp, gen, bl, steps_per_block, rows):
    """Sum over forwards of rows x query length, from each policy's documented query ranges."""
    length, shift = lp + gen, model.logit_shift
    total = 0
    for b in range(gen // bl):
        s, e = lp + b * bl, lp + (b + 1) * bl
        for i in range(steps_per_block):
            name, _, opts = cache.partition(":")
            refresh = 2 if "refresh=2" in opts else None
            if name == "none" or i == 0 or (refresh and i % refresh == 0):
                q = length
            elif name == "prefix":
                q = length - s + shift
            elif name == "dual":
                q = e - s + shift
            else:  # window with buffer 6
                q = min(length, s + 6) - s + shift
            total += rows * q
    return total


@pytest.mark.parametrize("cfg_scale", [0.0, 1.0], ids=["plain", "cfg"])
@pytest.mark.parametrize("cache", ["none", "prefix", "dual", "window:buffer=6", "prefix:refresh=2"])
def test_forwarded_tokens_and_nfe(model, cache, cfg_scale):
    out = dllm.generate(model, PROMPTS, sampler="low_confidence", cache=cache, gen_length=12,
                        block_length=4, steps=9, cfg_scale=cfg_scale)
    rows = 3 * (2 if cfg_scale else 1)
    assert out.nfe == 9  # one forward per step, the block-start full forward included
    assert out.forwarded_tokens == _expected_forwarded(model, cache, lp=5, gen=12, bl=4,
                                                       steps_per_block=3, rows=rows)


def test_cached_steps_forward_fewer_tokens(model):
    counts = {c: dllm.generate(model, PROMPTS, cache=c, gen_length=16, block_length=4).forwarded_tokens
              for c in ("none", "prefix", "window", "dual")}
    assert counts["dual"] < counts["window"] < counts["prefix"] < counts["none"]
