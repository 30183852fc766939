"""Verifying samplers under KV caches: a verification variant's forward (a copy of the buffers, the
block's cached query) is exactly the later step it stands for, so ``ssd`` and ``spec_threshold``
stay lossless against their references WITH the same cache policy; refreshing policies are refused."""

import pytest
import torch

import dllm
from dllm.cache import make_cache
from dllm.models import load, tiny

PROMPTS = [[7, 8, 9, 10, 11], [12, 13], [14, 15, 16]]  # left-padded batch
CACHES = ["prefix", "dual", "window", "dual:look_back=2,look_ahead=2", "dual:warmup=1"]
PAIRS = [("ssd", "low_confidence", {}), ("spec_threshold", "threshold", {}),
         ("spec_threshold", "threshold", {"threshold": 0.3})]


@pytest.mark.parametrize("pair", PAIRS, ids=["ssd", "spec_threshold", "spec_threshold-0.3"])
@pytest.mark.parametrize("cache", CACHES)
@pytest.mark.parametrize("family", ["llada", "dream"])
def test_lossless_against_the_reference_with_the_same_cache(family, cache, pair):
    sampler, reference, options = pair
    m = tiny(family, seed=4, n_layers=3)
    kw = dict(gen_length=12, block_length=4, cache=cache, **options)
    ref = dllm.generate(m, PROMPTS, sampler=reference, **kw)
    out = dllm.generate(m, PROMPTS, sampler=sampler, **kw)
    assert torch.equal(out.sequences, ref.sequences), f"{out.generated.tolist()} != {ref.generated.tolist()}"
    assert out.nfe <= ref.nfe + 3  # at most one verification forward more per block, usually fewer


@pytest.mark.parametrize("cache", ["dual", "prefix"])
def test_lossless_with_classifier_free_guidance(cache):
    m = tiny("llada", seed=2, n_layers=2)
    kw = dict(gen_length=8, block_length=4, cache=cache, cfg_scale=1.5)
    ref = dllm.generate(m, PROMPTS, sampler="threshold", **kw)
    out = dllm.generate(m, PROMPTS, sampler="spec_threshold", **kw)
    assert torch.equal(out.sequences, ref.sequences)


@pytest.mark.slow
def test_fast_with_a_cache_on_the_embedded_model_saves_forwards():
    """``fast`` (a verifying sampler) on tiny-llada: under ``dual`` fewer forwards than ``threshold``
    0.9 with the same cache; with the recommended cache (``auto``) also fewer forwards than
    Fast-dLLM's ``threshold`` + ``dual`` and at least as many exact answers on these examples."""
    from dllm import tasks as T

    m = load("tiny-llada")
    runs = [("threshold", "dual"), ("fast", "dual"), ("fast", "auto")]
    nfe = dict.fromkeys(runs, 0)
    right = dict.fromkeys(runs, 0)
    for ex in T.test_split("shuffle", 8, n=3) + T.test_split("insert_random", 8, n=2) + T.test_split("copy", 8, n=3):
        la = T.answer_length(ex.task, 8)
        for name, cache in runs:
            out = dllm.generate(m, [T.prompt_ids(ex)], sampler=name, gen_length=la, block_length=la, cache=cache)
            nfe[name, cache] += out.nfe
            words = T.vocabulary()
            right[name, cache] += T.score(ex, [words[t] for t in out.generated[0].tolist()])
    assert nfe["fast", "dual"] < nfe["threshold", "dual"], nfe
    assert nfe["fast", "auto"] < nfe["threshold", "dual"], nfe
    assert right["fast", "auto"] >= right["threshold", "dual"], right  # 8 vs 4 of 8 when written


def test_verification_leaves_the_call_buffers_untouched():
    """The copy is what a variant writes into: after a verifying step, the next real cached step still
    sees the block-start K/V outside its query (checked through equality with the reference above)
    and the gathered copy is a distinct tensor."""
    m = tiny("llada", seed=1, n_layers=2)
    kv = m.new_kv_cache(2, 10)
    for t in kv.k + kv.v:
        t.normal_()
    copy = kv.gather(torch.tensor([1, 1, 0]))
    assert copy.rows == 3 and copy.length == 10
    assert torch.equal(copy.k[0][0], kv.k[0][1]) and torch.equal(copy.v[1][2], kv.v[1][0])
    copy.k[0].zero_()
    assert kv.k[0].abs().sum() > 0


def test_rows_view_attends_what_the_all_layer_copy_attends():
    """``KVCache.rows_view`` (one layer's copy at a time, the call's buffers never written) hands
    every layer the same keys/values as ``gather`` + ``view`` (the all-layer copy it replaced)."""
    m = tiny("llada", seed=1, n_layers=2)
    kv = m.new_kv_cache(2, 10)
    for t in kv.k + kv.v:
        t.normal_()
    before = [t.clone() for t in kv.k + kv.v]
    rows = torch.tensor([1, 1, 0])
    fresh_k, fresh_v = torch.randn(3, kv.k[0].shape[1], 3, kv.k[0].shape[3]), torch.randn(3, kv.v[0].shape[1], 3, kv.v[0].shape[3])
    for layer in range(kv.n_layers):
        want = kv.gather(rows).view(4, 8).update(layer, fresh_k, fresh_v)
        got = kv.rows_view(rows, 4, 8).update(layer, fresh_k, fresh_v)
        assert all(torch.equal(a, b) for a, b in zip(want, got))
    assert kv.rows_view(rows, 4, 8).rows == 3
    assert all(torch.equal(a, b) for a, b in zip(before, kv.k + kv.v))  # the call's buffers untouched


@pytest.mark.parametrize("cache, option", [("dual:refresh=2", "refresh=2"), ("prefix:refresh=1", "refresh=1"),
                                           ("dual:warmup=2", "warmup=2"), ("window:refresh=3", "refresh=3")])
@pytest.mark.parametrize("sampler", ["ssd", "spec_threshold", "lopa"])
def test_mid_block_refreshes_are_refused_with_the_reason(sampler, cache, option):
    with pytest.raises(ValueError, match=f"cannot serve with these options: {option}"):
        dllm.generate(tiny("llada"), PROMPTS, sampler=sampler, cache=cache, gen_length=8, block_length=4)
    assert make_cache(cache).variant_refusal() is not None
    assert make_cache(cache.partition(":")[0]).variant_refusal() is None
