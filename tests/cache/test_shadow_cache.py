"""WINO's shadow block under KV caches (``ShadowCacheView``): a cached shadow forward's real rows
are the plain cached forward's, and right after the refresh (buffers of the same canvas) its
leave-one-out rows equal the full shadow forward's; wino decodes under every policy."""

import pytest
import torch

import dllm
from dllm.models import tiny
from dllm.models.core.shadow import shadow_attn_mask

PROMPTS = [[7, 8, 9, 10, 11], [12, 13], [14, 15, 16]]  # left-padded batch


def _canvas(m, padded: bool):
    g = torch.Generator().manual_seed(1)
    x = torch.randint(5, 50, (2, 16), generator=g)
    x[:, 10:] = m.mask_id
    x[0, 11] = 9  # one committed token inside the block [8, 12)
    kpm = None
    if padded:
        kpm = torch.ones_like(x, dtype=torch.bool)
        kpm[1, :3] = False
    pos = (torch.arange(16).expand(2, 16) if kpm is None else (kpm.long().cumsum(1) - 1).clamp(min=0))
    return x, kpm, pos


@pytest.mark.parametrize("family", ["llada", "dream"])
@pytest.mark.parametrize("padded", [False, True], ids=["plain", "left-padded"])
@pytest.mark.parametrize("policy", ["dual", "prefix"])
def test_cached_shadow_equals_the_full_shadow_on_fresh_buffers(family, padded, policy):
    m = tiny(family, seed=6, n_layers=3).eval()
    x, kpm, pos = _canvas(m, padded)
    s, e, shift, length = 8, 12, m.logit_shift, x.shape[1]
    q0, q1 = s - shift, (e if policy == "dual" else length)
    with torch.no_grad():
        full_logits, full_loo = m.shadow_forward(x, start=s, end=e, positions=pos, key_padding_mask=kpm)
        kv = m.new_kv_cache(2, length)
        m(x, positions=pos, key_padding_mask=kpm, cache=kv.view(0, length))  # the block-start refresh
        plain = m(x[:, q0:q1], positions=pos[:, q0:q1], key_padding_mask=kpm, cache=kv.view(q0, length)).logits
        logits, loo = m.shadow_forward(x[:, q0:q1], start=s, end=e, positions=pos[:, q0:q1],
                                       key_padding_mask=kpm, cache=kv.view(q0, length))
    assert loo.shape == (2, e - s, m.vocab_size) and logits.shape == (2, q1 - q0, m.vocab_size)
    torch.testing.assert_close(logits, plain, atol=1e-5, rtol=1e-5)  # real rows never see the shadow
    torch.testing.assert_close(logits[:, shift:], full_logits[:, q0 + shift:q1], atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(loo, full_loo, atol=1e-5, rtol=1e-5)
    # the shadow's K/V are not stored: the buffers still serve a plain cached forward unchanged
    with torch.no_grad():
        again = m(x[:, q0:q1], positions=pos[:, q0:q1], key_padding_mask=kpm, cache=kv.view(q0, length)).logits
    torch.testing.assert_close(again, plain, atol=0, rtol=0)


def test_cached_shadow_leaves_the_predicted_token_out():
    """One layer: shadow k does not change when column s + k changes (the cached keys of the block
    are refreshed by the query itself)."""
    m = tiny("llada", seed=3, n_layers=1).eval()
    x, kpm, pos = _canvas(m, padded=True)
    kv = m.new_kv_cache(2, 16)
    with torch.no_grad():
        m(x, positions=pos, key_padding_mask=kpm, cache=kv.view(0, 16))
        _, loo = m.shadow_forward(x[:, 8:12], start=8, end=12, positions=pos[:, 8:12], key_padding_mask=kpm,
                                  cache=kv.view(8, 16))
        for j in range(4):
            y = x.clone()
            y[:, 8 + j] = 33
            _, loo2 = m.shadow_forward(y[:, 8:12], start=8, end=12, positions=pos[:, 8:12],
                                       key_padding_mask=kpm, cache=kv.view(8, 16))
            torch.testing.assert_close(loo2[:, j], loo[:, j], atol=1e-5, rtol=1e-5)
            assert (loo2[:, (j + 1) % 4] - loo[:, (j + 1) % 4]).abs().max() > 1e-4


def test_full_view_mask_is_the_uncached_mask():
    kpm = torch.tensor([[True] * 6, [False, False] + [True] * 4])
    a = shadow_attn_mask(kpm, 2, 6, 3, 5, torch.device("cpu"))
    b = shadow_attn_mask(kpm, 2, 6, 3, 5, torch.device("cpu"), n_queries=6, key_end=6)
    assert torch.equal(a, b) and a.shape == (2, 1, 8, 8)
    c = shadow_attn_mask(kpm, 2, 6, 3, 5, torch.device("cpu"), n_queries=2, key_end=6)
    assert c.shape == (2, 1, 4, 8)
    assert not c[:, 0, :2, 6:].any()  # real queries never see a shadow key
    assert not c[1, 0, 2:, :2].any() and c[:, 0, 2:, 6:].all()  # shadow rows: no pads, every shadow key
    assert not c[:, 0, 2, 3].any() and not c[:, 0, 3, 4].any() and c[:, 0, 2, 4].all()


def test_cached_shadow_errors():
    m = tiny("dream", seed=0)
    x, kpm, pos = _canvas(m, padded=False)
    kv = m.new_kv_cache(2, 16)
    with torch.no_grad():
        m(x, positions=pos, cache=kv.view(0, 16))
        with pytest.raises(ValueError, match=r"not inside the query columns \[8, 12\)"):
            m.shadow_forward(x[:, 8:12], start=8, end=12, positions=pos[:, 8:12], cache=kv.view(8, 16))
        with pytest.raises(ValueError, match="needs positions"):
            m.shadow_forward(x[:, 7:12], start=8, end=12, cache=kv.view(7, 16))


@pytest.mark.parametrize("cache", ["prefix", "dual", "window", "dual:look_back=2,warmup=1", "prefix:refresh=2"])
@pytest.mark.parametrize("family", ["llada", "dream"])
def test_wino_decodes_under_every_policy(family, cache):
    m = tiny(family, seed=4, n_layers=2)
    kw = dict(gen_length=12, block_length=4, sampler="wino", seed=0)
    out = dllm.generate(m, PROMPTS, cache=cache, return_trace=True, **kw)
    assert (out.generated != m.mask_id).all() and (out.trace >= 0).all()
    none = dllm.generate(m, PROMPTS, cache="none", **kw)
    # a cached step forwards the query plus the shadow block, never the whole canvas
    assert out.forwarded_tokens < none.forwarded_tokens * out.nfe / none.nfe


def test_wino_with_guidance_under_dual():
    m = tiny("llada", seed=2, n_layers=2)
    out = dllm.generate(m, PROMPTS, sampler="wino", cache="dual", cfg_scale=1.0, gen_length=8, block_length=4)
    assert (out.generated != m.mask_id).all()
