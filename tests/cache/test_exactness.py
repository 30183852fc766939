"""Every cache policy with a full forward at every step reproduces ``cache="none"`` token for token
(float32 tiny random models of both families, ragged batches, CFG), and the structural identities
between policies hold under their real schedules."""

import pytest
import torch

import dllm
from dllm.cache import DualCache, PrefixCache, WindowCache
from dllm.models import tiny

PROMPTS = [[7, 8, 9, 10, 11, 12], [13, 14], [15, 16, 17, 18]]  # ragged: left-padded batch
EVERY_STEP = [
    "prefix:refresh=1",
    "dual:refresh=1",
    "window:refresh=1",
    "window:buffer=4,refresh=1",
    "dual:refresh=1,look_back=2,look_ahead=3",
    "dual:warmup=64",  # dInfer warm-up longer than any block: every step is a full forward
    PrefixCache(refresh=1),
]
SAMPLERS = [("low_confidence", {}), ("threshold", {"threshold": 0.5})]


@pytest.fixture(scope="module", params=["llada", "dream"])
def model(request):
    return tiny(request.param, seed=3)


def _gen(model, cache, sampler, options, **kw):
    kw.setdefault("gen_length", 12)
    kw.setdefault("block_length", 4)
    if sampler == "low_confidence":
        kw.setdefault("steps", 6)
    return dllm.generate(model, PROMPTS, sampler=sampler, cache=cache, return_trace=True, **options, **kw)


@pytest.mark.parametrize("cfg_scale", [0.0, 1.5], ids=["plain", "cfg"])
@pytest.mark.parametrize("sampler,options", SAMPLERS, ids=[s for s, _ in SAMPLERS])
@pytest.mark.parametrize("cache", EVERY_STEP, ids=str)
def test_refresh_every_step_equals_no_cache(model, cache, sampler, options, cfg_scale):
    ref = _gen(model, "none", sampler, options, cfg_scale=cfg_scale)
    out = _gen(model, cache, sampler, options, cfg_scale=cfg_scale)
    assert torch.equal(out.sequences, ref.sequences)
    assert torch.equal(out.trace, ref.trace)
    assert out.nfe == ref.nfe and out.forwarded_tokens == ref.forwarded_tokens


@pytest.mark.parametrize("sampler,options", SAMPLERS, ids=[s for s, _ in SAMPLERS])
def test_window_reaching_the_canvas_end_is_prefix(model, sampler, options):
    prefix = _gen(model, "prefix", sampler, options)
    window = _gen(model, WindowCache(buffer=12), sampler, options)
    assert torch.equal(window.sequences, prefix.sequences)
    assert window.forwarded_tokens == prefix.forwarded_tokens


def test_dual_whose_vicinity_covers_the_canvas_is_no_cache(model):
    # queries [0, L) every step: a full forward at every step
    ref = _gen(model, "none", "threshold", {"threshold": 0.5})
    out = _gen(model, DualCache(look_back=64, look_ahead=64), "threshold", {"threshold": 0.5})
    assert torch.equal(out.sequences, ref.sequences)


def test_real_schedules_really_reuse_stale_keys(model):
    """Sanity: the block-approximate caches are approximations (else the tests above prove little)."""
    ref = _gen(model, "none", "low_confidence", {}, gen_length=16, steps=8)
    differs = [not torch.equal(_gen(model, c, "low_confidence", {}, gen_length=16, steps=8).sequences,
                                 ref.sequences)
               for c in ("prefix", "dual", "window")]
    assert any(differs)


def test_buffers_are_allocated_once_and_written_in_place(model):
    seen = []

    def spy(state):
        kv = state.kv
        seen.append((id(kv), kv.k[0].data_ptr(), kv.v[-1].data_ptr(), tuple(kv.k[0].shape)))

    dllm.generate(model, PROMPTS, sampler="low_confidence", gen_length=8, block_length=4, steps=8,
                  cache="dual", cfg_scale=1.0, callback=spy)
    assert len(seen) == 8 and len(set(seen)) == 1
    cfg = model.config
    # [R, Hkv, L, hd] with R = 2B under CFG and L = the padded prompt + gen_length
    assert seen[0][3] == (2 * len(PROMPTS), cfg.n_kv_heads, 6 + 8, cfg.head_dim)


def test_no_cache_allocates_nothing(model):
    kinds = []
    dllm.generate(model, PROMPTS, gen_length=4, callback=lambda st: kinds.append(st.kv))
    assert kinds == [None] * 4


@pytest.mark.parametrize("cfg_scale", [0.0, 1.5], ids=["plain", "cfg"])
@pytest.mark.parametrize("cache", ["prefix", "dual", "window:buffer=6", "dual:look_back=2,look_ahead=2"])
def test_cached_batch_with_padding_equals_each_prompt_alone(model, cache, cfg_scale):
    """Real schedules: left padding (positions, key-padding mask) and the doubled CFG batch line up
    with their own buffer rows, so a row decodes alone as it does in a ragged batch."""
    kw = dict(sampler="low_confidence", gen_length=12, block_length=4, steps=6, cache=cache,
              cfg_scale=cfg_scale)
    batch = dllm.generate(model, PROMPTS, **kw)
    for j, p in enumerate(PROMPTS):
        alone = dllm.generate(model, [p], **kw)
        assert torch.equal(batch.generated[j], alone.generated[0]), (cache, j)
