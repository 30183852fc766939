"""DiffusionLM.forward contract: position semantics, Dream shift, left padding, argument checks."""

import pytest
import torch

from dllm.models import tiny
from dllm.models.inputs import default_positions, padding_attn_mask, square_padding_mask

from .helpers import random_ids


@pytest.mark.parametrize("grad", [False, True], ids=["no_grad", "autograd"])
@pytest.mark.parametrize("family", ["dream", "fastdllm_v2"])
def test_shifted_families_logits_are_shifted_by_one(family, grad):
    model = tiny(family)
    ids = random_ids(model, 2, 8)
    with torch.inference_mode():  # the shift's index made under inference mode first
        model(ids)
    with torch.set_grad_enabled(grad):
        shifted = model(ids).logits  # under autograd: an index of its own (not an inference tensor)
        raw = model.raw_logits(ids)
    assert torch.equal(shifted[:, 1:], raw[:, :-1])
    assert torch.equal(shifted[:, 0], raw[:, 0])


def test_llada_logits_are_not_shifted():
    model = tiny("llada")
    ids = random_ids(model, 2, 8)
    with torch.no_grad():
        assert torch.equal(model(ids).logits, model.raw_logits(ids))


def test_default_positions_and_mask():
    real = torch.tensor([[False, False, True, True], [True, True, True, True]])
    ids = torch.zeros(2, 4, dtype=torch.long)
    assert default_positions(ids, real).tolist() == [[0, 0, 0, 1], [0, 1, 2, 3]]
    assert default_positions(ids, None).tolist() == [[0, 1, 2, 3]] * 2
    mask = padding_attn_mask(real)
    assert mask.shape == (2, 1, 1, 4)  # broadcast over the queries
    assert mask[0, 0, 0].tolist() == [False, False, True, True]  # every query: real keys only
    assert mask[1].all()


@pytest.mark.parametrize("backend", ["sdpa", "reference"])
def test_broadcast_padding_mask_equals_the_square_one_on_real_queries(family, backend):
    """The broadcast key mask (fast path) against the square ``keys | pad_queries`` mask it replaced
    (reference): the same logits at every real position, bit for bit; pad positions stay finite."""
    model = tiny(family, attn_backend=backend, n_layers=3)
    ids = random_ids(model, 3, 12, seed=4)
    real = torch.ones(3, 12, dtype=torch.bool)
    real[0, :5], real[2, :2] = False, False
    positions = default_positions(ids, real)
    square = square_padding_mask(real)  # [B, 1, T, T]
    with torch.no_grad():
        fast = model(ids, key_padding_mask=real).logits
        slow = model._final_logits(model._raw_forward(ids, positions, square, (), ())[0], None)
    read = real.clone()  # positions whose logits come from a real query row
    if model.logit_shift:  # Dream: position i is predicted by row i - 1 (the first real one reads a pad)
        read[:, 1:] &= real[:, :-1]
    assert torch.equal(fast[read], slow[read])
    assert torch.isfinite(fast).all()


@pytest.mark.parametrize("backend", ["sdpa", "reference"])
def test_prompt_alone_equals_prompt_left_padded_in_batch(family, backend):
    model = tiny(family, attn_backend=backend)
    short = random_ids(model, 1, 5, seed=1)
    long = random_ids(model, 1, 11, seed=2)
    batch = torch.full((2, 11), model.pad_id)
    batch[0, 6:] = short[0]
    batch[1] = long[0]
    real = batch != model.pad_id
    real[0, :6] = False
    real[1] = True
    with torch.no_grad():
        alone = model(short).logits[0]
        padded = model(batch, key_padding_mask=real).logits[0, 6:]
        raw_alone = model.raw_logits(short)[0]
        raw_padded = model.raw_logits(batch, key_padding_mask=real)[0, 6:]
        other = model(long).logits[0]
        other_batched = model(batch, key_padding_mask=real).logits[1]
    assert torch.allclose(raw_alone, raw_padded, atol=1e-5, rtol=0)
    # Dream's first real position reads the pad before it; every later one must match
    start = 1 if family == "dream" else 0
    assert torch.allclose(alone[start:], padded[start:], atol=1e-5, rtol=0)
    assert torch.allclose(other, other_batched, atol=1e-5, rtol=0)
    assert torch.isfinite(model(batch, key_padding_mask=real).logits).all()


def test_all_true_mask_is_the_fast_path(family):
    model = tiny(family)
    ids = random_ids(model, 2, 7)
    with torch.no_grad():
        a = model(ids).logits
        b = model(ids, key_padding_mask=torch.ones_like(ids, dtype=torch.bool)).logits
    assert torch.equal(a, b)


def test_explicit_positions_shift_everything_consistently():
    model = tiny("llada")
    ids = random_ids(model, 1, 6)
    with torch.no_grad():
        a = model(ids).logits
        b = model(ids, positions=torch.arange(6)[None] + 40).logits  # RoPE is relative
    assert torch.allclose(a, b, atol=1e-4)


def test_cache_argument_is_not_supported_yet():
    model = tiny("llada")
    with pytest.raises(NotImplementedError, match="cache=object is not supported"):
        model(random_ids(model, 1, 4), cache=object())


@pytest.mark.parametrize("kwargs, pattern", [
    ({"key_padding_mask": torch.ones(1, 3, dtype=torch.bool)}, "key_padding_mask must be bool"),
    ({"key_padding_mask": torch.ones(1, 4, dtype=torch.long)}, "key_padding_mask must be bool"),
    ({"positions": torch.zeros(1, 4)}, "positions must be an integer tensor"),
])
def test_bad_arguments(kwargs, pattern):
    model = tiny("dream")
    with pytest.raises(ValueError, match=pattern):
        model(random_ids(model, 1, 4), **kwargs)
    with pytest.raises(ValueError, match="input_ids must be an integer tensor"):
        model(torch.zeros(4, dtype=torch.long))


def test_special_ids_and_eos_ids():
    llada, dream = tiny("llada"), tiny("dream")
    tok = llada.tokenizer
    assert llada.mask_id == tok.convert_tokens_to_ids("<|mdm_mask|>")
    assert llada.eos_id == llada.pad_id == tok.convert_tokens_to_ids("<|endoftext|>")
    assert llada.eot_id == tok.convert_tokens_to_ids("<|eot_id|>")
    assert llada.bos_id == tok.convert_tokens_to_ids("<|startoftext|>")
    assert llada.eos_ids == (llada.eos_id, llada.eot_id)
    assert dream.mask_id == dream.tokenizer.convert_tokens_to_ids("<|mask|>")
    assert dream.eot_id == dream.tokenizer.convert_tokens_to_ids("<|im_end|>")
    assert dream.bos_id == dream.eos_id == dream.pad_id
    assert tiny("llada", eot_id=None).eos_ids == (llada.eos_id,)
    assert llada.vocab_size % 8 == 0 and llada.vocab_size >= len(tok)
    assert llada.max_positions == 512 and llada.dtype == torch.float32 and llada.device.type == "cpu"


def test_mask_must_differ_from_pad():
    with pytest.raises(ValueError, match=r"mask_id \(2\) must differ from pad_id"):
        tiny("llada", mask_id=2)
    with pytest.raises(ValueError, match="eos_id = 500 is not a token id"):
        tiny("dream", eos_id=500)


def test_tiny_overrides_and_determinism():
    a, b = tiny("dream", seed=5), tiny("dream", seed=5)
    ids = random_ids(a, 1, 6)
    with torch.no_grad():
        assert torch.equal(a(ids).logits, b(ids).logits)
        assert not torch.equal(a(ids).logits, tiny("dream", seed=6)(ids).logits)
        probs = a(ids).logits.softmax(-1)
    assert probs.max(-1).values.mean() > 0.2  # peaked enough for greedy decoding
    assert tiny("llada", d_model=32, n_layers=1).config.d_model == 32
    with pytest.raises(ValueError, match="unknown override"):
        tiny("llada", hidden_size=32)
    with pytest.raises(ValueError, match="unknown model family 'gpt'"):
        tiny("gpt")
    with pytest.raises(ValueError, match="qkv_bias=False"):
        tiny("dream", qkv_bias=False)
