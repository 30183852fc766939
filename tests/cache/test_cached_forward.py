"""The model-level cached forward (``DiffusionLM.forward(..., cache=CacheView)``)."""

import pytest
import torch

from dllm.cache import KVCache
from dllm.models import tiny
from dllm.models.inputs import default_positions
from dllm.models.core.transformer import rope_cos_sin


def _canvas(model, seed=0):
    """Two left-padded rows (pad 3 / 0) of ordinary tokens: ids [2, 12], real mask [2, 12]."""
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(10, 60, (2, 12), generator=g)
    real = torch.ones(2, 12, dtype=torch.bool)
    real[0, :3] = False
    ids[0, :3] = model.pad_id
    ids[:, 8:] = model.mask_id
    return ids, real


@pytest.fixture(params=["llada", "dream"])
def model(request):
    model = tiny(request.param, seed=1)
    model.packs_padded_rows = False  # the plain forward compared here is the padded one, pad columns too (a
    return model  # cached forward is never packed; tests/models/core/test_packed_tokens.py compares the two)


def test_full_view_is_exactly_a_plain_forward_and_fills_the_buffers(model):
    ids, real = _canvas(model)
    kv = model.new_kv_cache(2, 12)
    assert isinstance(kv, KVCache) and kv.n_layers == model.config.n_layers
    with torch.no_grad():
        plain = model(ids, key_padding_mask=real)
        cached = model(ids, key_padding_mask=real, cache=kv.view(0))
    assert torch.equal(plain.logits, cached.logits)
    # layer 0's buffers hold its keys after RoPE (at the canvas positions) and its values
    tr = model.transformer
    cos, sin = rope_cos_sin(default_positions(ids, real), model.config.head_dim, model.config.rope_theta)
    with torch.no_grad():
        _, k, v = tr.layers[0].attn.qkv(tr.layers[0].attn_norm(tr.embed(ids)), cos, sin)
    assert torch.equal(kv.k[0], k) and torch.equal(kv.v[0], v)
    assert torch.isfinite(kv.k[-1]).all() and torch.isfinite(kv.v[-1]).all()


@pytest.mark.parametrize("start", [8, 5])
def test_cached_query_on_a_fresh_cache_matches_the_full_forward(model, start):
    ids, real = _canvas(model)
    kv = model.new_kv_cache(2, 12)
    shift = model.logit_shift
    q0 = start - shift
    with torch.no_grad():
        full = model(ids, key_padding_mask=real, cache=kv.view(0)).logits
        part = model(ids[:, q0:], key_padding_mask=real, cache=kv.view(q0)).logits
    # rows predicting columns start.. agree (same keys, same values; only the query set differs)
    assert torch.allclose(part[:, shift:], full[:, start:], atol=1e-5, rtol=0)


def test_positions_default_to_the_canvas_positions(model):
    ids, real = _canvas(model)
    kv = model.new_kv_cache(2, 12)
    pos = default_positions(ids, real)
    with torch.no_grad():
        model(ids, key_padding_mask=real, cache=kv.view(0))
        a = model(ids[:, 6:], key_padding_mask=real, cache=kv.view(6)).logits
        b = model(ids[:, 6:], positions=pos[:, 6:], key_padding_mask=real, cache=kv.view(6)).logits
    assert torch.equal(a, b)


def test_pruned_columns_are_not_attended(model):
    ids, real = _canvas(model)
    kv = model.new_kv_cache(2, 12)
    with torch.no_grad():
        model(ids, key_padding_mask=real, cache=kv.view(0))
        a = model(ids[:, 6:10], key_padding_mask=real, cache=kv.view(6, 10)).logits
        kv.k[0][:, :, 10:].fill_(1e4)  # garbage in the far field of every buffer
        kv.v[0][:, :, 10:].fill_(float("nan"))
        b = model(ids[:, 6:10], key_padding_mask=real, cache=kv.view(6, 10)).logits
    assert torch.equal(a, b)


def test_dual_style_query_reads_stale_rows_outside_itself(model):
    ids, real = _canvas(model)
    kv = model.new_kv_cache(2, 12)
    with torch.no_grad():
        model(ids, key_padding_mask=real, cache=kv.view(0))
        a = model(ids[:, 8:10], key_padding_mask=real, cache=kv.view(8)).logits
        changed = ids.clone()
        changed[:, 10:] = 11  # the suffix changes on the canvas, but its cached K/V do not
        b = model(changed[:, 8:10], key_padding_mask=real, cache=kv.view(8)).logits
        fresh = model(changed, key_padding_mask=real).logits[:, 8:10]
    assert torch.equal(a, b)
    assert not torch.allclose(b, fresh)


def test_bad_cached_calls(model):
    ids, real = _canvas(model)
    kv = model.new_kv_cache(2, 12)
    with pytest.raises(ValueError, match="pass key_end=10"):
        model(ids[:, 6:], cache=kv.view(6, 10))
    with pytest.raises(ValueError, match="allocated for 2"):
        model(ids[:1, 6:], cache=kv.view(6))
    with pytest.raises(ValueError, match=r"key_padding_mask must be bool \[2, 12\]"):
        model(ids[:, 6:], key_padding_mask=real[:, 6:], cache=kv.view(6))
    with pytest.raises(ValueError, match="start < key_end"):
        kv.view(12)
