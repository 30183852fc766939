"""The ``triton`` attention backend inside the models: a tiny model's forward equals the reference
backend's, and cached decoding gives the same tokens as sdpa."""

from __future__ import annotations

import pytest
import torch

import dllm
from dllm.models import tiny

from .conftest import DEVICE
from .helpers import assert_close, left_padded


@pytest.mark.parametrize("family, overrides", [("llada", {}), ("dream", {"n_kv_heads": 2})],
                         ids=["llada-H4-Hkv4", "dream-H4-Hkv2"])
@pytest.mark.parametrize("padded", [False, True], ids=["nopad", "pad"])
def test_tiny_model_forward_matches_reference_backend(family, overrides, padded):
    model = tiny(family, attn_backend="triton", **overrides).to(DEVICE)
    assert model.attn_backend == "triton"
    ids, real = left_padded(model, device=DEVICE)
    kpm = real if padded else None
    with torch.no_grad():
        fast = model(ids, key_padding_mask=kpm).logits
        model.set_attn_backend("reference")
        ref = model(ids, key_padding_mask=kpm).logits
    assert_close(f"{family}-{'pad' if padded else 'nopad'}/logits", ref, fast, 1e-5)


@pytest.mark.slow  # seconds: the default run leaves it to -m slow (CI runs both)
@pytest.mark.parametrize("cache", ["dual", "prefix"])
def test_cached_generate_matches_sdpa(cache):
    prompts = [[11, 12, 13, 14, 15, 16], [21, 22, 23]]  # left-padded into one batch
    kw = dict(gen_length=8, block_length=4, cache=cache, sampler="low_confidence")
    outs = {}
    for backend in ("sdpa", "triton"):
        model = tiny("llada", seed=1, attn_backend=backend).to(DEVICE)
        outs[backend] = dllm.generate(model, prompts, **kw).generated
    assert torch.equal(outs["triton"], outs["sdpa"]), f"{outs['triton'].tolist()} != {outs['sdpa'].tolist()}"
