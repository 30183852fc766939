"""The shared transformer: RMSNorm and RoPE math, attention backends, attention maps, hidden states."""

import math

import pytest
import torch

from dllm.models import tiny
from dllm.models.core.transformer import apply_rope, rms_norm, rope_cos_sin, rope_inv_freq, rotate_half

from ..helpers import random_ids


# ---- RMSNorm -------------------------------------------------------------------------------------

def test_rms_norm_unit_rms_and_scale_invariance():
    x = torch.randn(3, 5, 16, dtype=torch.float64).float() * 7
    y = rms_norm(x, torch.ones(16), 1e-6)
    assert torch.allclose(y.pow(2).mean(-1), torch.ones(3, 5), atol=1e-5)
    assert torch.allclose(rms_norm(10 * x, torch.ones(16), 1e-6), y, atol=1e-5)


def test_rms_norm_bf16_order_is_normalise_cast_then_weight():
    x = torch.randn(4, 32).to(torch.bfloat16)
    w = (1 + 0.3 * torch.randn(32)).to(torch.bfloat16)
    x32 = x.float()
    expected = w * (x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + 1e-5)).to(torch.bfloat16)
    out = rms_norm(x, w, 1e-5)
    assert out.dtype == torch.bfloat16
    assert torch.equal(out, expected)


# ---- RoPE ------------------------------------------------------------------------------------------

def test_inv_freq_formula():
    inv = rope_inv_freq(8, 500000.0)
    assert inv.dtype == torch.float32
    expected = torch.tensor([1 / 500000.0 ** (2 * j / 8) for j in range(4)], dtype=torch.float32)
    assert torch.allclose(inv, expected, rtol=1e-6)


def test_rotate_half_layout():
    x = torch.arange(6.0)
    assert rotate_half(x).tolist() == [-3.0, -4.0, -5.0, 0.0, 1.0, 2.0]


def test_rope_identity_at_zero_norm_preserving_and_relative():
    hd = 16
    q = torch.randn(1, 2, 1, hd, dtype=torch.float64).float()
    k = torch.randn(1, 2, 1, hd, dtype=torch.float64).float()

    def rot(x, p):
        cos, sin = rope_cos_sin(torch.tensor([[p]]), hd, 10000.0)
        return apply_rope(x, cos, sin, fp32=True)

    assert torch.allclose(rot(q, 0), q)
    assert torch.allclose(rot(q, 37).norm(dim=-1), q.norm(dim=-1), atol=1e-5)
    # the score depends only on the position difference
    s1 = (rot(q, 5) * rot(k, 2)).sum(-1)
    s2 = (rot(q, 105) * rot(k, 102)).sum(-1)
    assert torch.allclose(s1, s2, atol=1e-4)


def test_rope_precision_modes():
    hd = 32
    x = torch.randn(2, 4, 7, hd).to(torch.bfloat16)
    cos, sin = rope_cos_sin(torch.arange(7).expand(2, 7) + 1000, hd, 1e6)
    full = apply_rope(x, cos, sin, fp32=True)
    low = apply_rope(x, cos, sin, fp32=False)
    assert full.dtype == low.dtype == torch.bfloat16
    x32 = x.float()
    assert torch.equal(full, (x32 * cos + rotate_half(x32) * sin).to(torch.bfloat16))
    c, s = cos.to(torch.bfloat16), sin.to(torch.bfloat16)
    assert torch.equal(low, x * c + rotate_half(x) * s)
    # same in float32
    assert torch.equal(apply_rope(x32, cos, sin, fp32=True), apply_rope(x32, cos, sin, fp32=False))


# ---- attention backends ------------------------------------------------------------------------------

def _left_padded(model, lengths=(9, 5), seed=0):
    t = max(lengths)
    ids = random_ids(model, len(lengths), t, seed)
    real = torch.zeros(len(lengths), t, dtype=torch.bool)
    for b, n in enumerate(lengths):
        real[b, t - n:] = True
        ids[b, : t - n] = model.pad_id
    return ids, real


@pytest.mark.parametrize("family, overrides", [
    ("llada", {}), ("llada", {"n_kv_heads": 2}), ("dream", {}), ("dream", {"n_kv_heads": 1}),
])
@pytest.mark.parametrize("padded", [False, True])
def test_reference_and_sdpa_backends_agree(family, overrides, padded):
    model = tiny(family, **overrides)
    ids, real = _left_padded(model)
    kpm = real if padded else None
    with torch.no_grad():
        model.set_attn_backend("reference")
        ref = model(ids, key_padding_mask=kpm).logits
        assert model.attn_backend == "reference"
        model.set_attn_backend("sdpa")
        fast = model(ids, key_padding_mask=kpm).logits
    assert torch.allclose(ref, fast, atol=1e-5, rtol=0)
    model.set_attn_backend("auto")
    assert model.attn_backend in (("sdpa", "auto") if torch.cuda.is_available() else ("sdpa",))  # auto: measured on CUDA


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_inference_mlp_in_place_equals_the_autograd_path_bit_for_bit(dtype):
    """Under no_grad the SwiGLU runs silu and the product in place (fewer allocations); with grad
    enabled it keeps the reference expression autograd needs. Same values, same model logits."""
    torch.manual_seed(0)
    model = tiny("llada").to(dtype)
    mlp = model.transformer.layers[0].mlp
    x = torch.randn(2, 7, mlp.gate_proj.in_features, dtype=dtype)
    with torch.no_grad():
        fast = mlp(x)
    ref = mlp(x)
    assert ref.requires_grad and not fast.requires_grad
    assert torch.equal(fast, ref.detach())
    ids = random_ids(model, 2, 9)
    with torch.no_grad():
        fast_logits = model(ids).logits
    assert torch.equal(fast_logits, model(ids).logits.detach())
    ref.sum().backward()  # the grad path still trains
    assert mlp.gate_proj.weight.grad is not None
    kept = []  # a hook that keeps gate_proj's output sees it unchanged (the reference path runs)
    handle = mlp.gate_proj.register_forward_hook(lambda mod, inp, out: kept.append(out))
    with torch.no_grad():
        assert torch.equal(mlp(x), fast)
    handle.remove()
    assert torch.equal(kept[0], mlp.gate_proj(x).detach())


def test_unknown_backend_lists_valid():
    with pytest.raises(KeyError, match="reference"):
        tiny("llada").set_attn_backend("nope")


def test_attention_probs_for_requested_layers(family):
    model = tiny(family)
    model.packs_padded_rows = False  # attention maps asked for: the padded forward, compared with its twin
    ids, real = _left_padded(model)
    with torch.no_grad():
        out = model(ids, key_padding_mask=real, want_attn_layers=(0, -1))
        plain = model(ids, key_padding_mask=real).logits
    n, h, t = model.config.n_layers, model.config.n_heads, ids.shape[1]
    assert sorted(out.attn) == [0, n - 1]
    for probs in out.attn.values():
        assert probs.shape == (2, h, t, t) and probs.dtype == torch.float32
        assert torch.allclose(probs.sum(-1), torch.ones(2, h, t), atol=1e-5)
        for b in range(2):
            rows = probs[b][:, real[b]]  # real queries
            assert torch.all(rows[..., ~real[b]] == 0)  # never attend to pads
    assert torch.allclose(out.logits, plain, atol=1e-5)  # reference layers change nothing


def test_hidden_states_index_convention(family):
    model = tiny(family, n_layers=3)
    ids = random_ids(model, 2, 6)
    with torch.no_grad():
        out = model(ids, want_hidden_layers=(0, -1))
        full = model(ids, want_hidden_layers=(0, 1, 2))
        raw = model.raw_logits(ids)
    assert sorted(out.hidden) == [0, 2]
    assert out.hidden[0].shape == (2, 6, model.config.d_model)
    assert torch.equal(out.hidden[2], full.hidden[2])
    tr = model.transformer
    assert torch.allclose(tr.lm_head(tr.norm(out.hidden[2])), raw, atol=1e-5)  # hidden[-1] = last layer output
    with pytest.raises(ValueError, match=r"layer index 3 is out of range .* 3 layers"):
        model(ids, want_hidden_layers=(3,))
    with pytest.raises(ValueError, match=r"layer index -4"):
        model(ids, want_attn_layers=(-4,))


def test_logits_dtype_follows_model():
    model = tiny("dream", dtype=torch.bfloat16)
    out = model(random_ids(model, 1, 5), want_attn_layers=(0,))
    assert out.logits.dtype == torch.bfloat16 and out.attn[0].dtype == torch.float32
    assert math.isfinite(out.logits.float().abs().max().item())
