"""SDAR: the checkpoint layout, the config translation and block-causal logits against the
transcription of the official modelling (tests/reference/sdar_modeling.py), bit for bit in float32."""

from __future__ import annotations

import json

import pytest
import torch

from dllm.models import load, tiny
from dllm.models.config import TransformerConfig
from dllm.models.sdar import SDAR
from dllm.models.transformer import block_causal_mask
from tests.reference.sdar_modeling import RefCache, RefSDARForCausalLM

from .helpers import random_ids


def _official(path, dtype=torch.float32) -> RefSDARForCausalLM:
    return RefSDARForCausalLM.from_pretrained(path, dtype)


def _block_mask(t: int, bs: int) -> torch.Tensor:
    """[1, T, T] float ones/zeros: generate.py's ``tril(ones(nb, nb)).repeat_interleave(bs, ...)``."""
    nb = -(-t // bs)
    m = torch.tril(torch.ones(nb, nb)).repeat_interleave(bs, dim=0).repeat_interleave(bs, dim=1)
    return m[None, :t, :t]


# generate.py hands SDPA the 3-D mask [1, T, K]; on CPU, torch 2.x runs a 3-D mask through another
# SDPA kernel than the same mask as [B, 1, T, K] (the layout dllm and transformers' 4-D masks use):
# the results differ by float summation order (~6e-6 here). Bit-identity is asserted with the 4-D
# layout of the SAME mask; the 3-D call is asserted equal up to that order, and argmax-equal.
def _four_d(mask: torch.Tensor) -> torch.Tensor:
    return mask[:, None]


def test_block_causal_mask_matches_generate_py_layout():
    pos = torch.arange(10)[None]
    ours = block_causal_mask(pos, pos, 4)[:, 0]  # [1, T, T]
    assert torch.equal(ours, _block_mask(10, 4).bool())
    shifted = block_causal_mask(pos + 2, pos + 2, 4)[0, 0]  # positions 2..11: blocks {2,3}, {4..7}, {8..11}
    assert shifted[0, 1] and not shifted[1, 2] and shifted[2, 5] and not shifted[5, 6] and shifted[9, 0]


@pytest.mark.parametrize("overrides", [{}, {"n_kv_heads": 4}, {"n_layers": 1}, {"block_size": 8},
                                       {"tie_embeddings": True}])
def test_logits_bit_identical_to_official_modelling(tmp_path, overrides):
    model = tiny("sdar", seed=5, **overrides)
    model.save_pretrained(tmp_path)
    official = _official(tmp_path)
    loaded = load(tmp_path)
    assert loaded.attn_backend == "sdpa"
    ids = random_ids(loaded, 2, 13)
    bs = loaded.config.block_size
    pos = torch.arange(13)[None]
    ref = official(ids, attention_mask=_four_d(_block_mask(13, bs)), position_ids=pos).logits
    ref3 = official(ids, attention_mask=_block_mask(13, bs), position_ids=pos).logits
    with torch.no_grad():
        assert torch.equal(loaded(ids).logits, ref)
        assert torch.equal(model(ids).logits, ref)
    assert torch.allclose(ref3, ref, atol=1e-4, rtol=0) and torch.equal(ref3.argmax(-1), ref.argmax(-1))


def test_block_causal_means_later_blocks_are_invisible():
    model = tiny("sdar", seed=2)
    ids = random_ids(model, 1, 12)
    changed = ids.clone()
    changed[0, 8:] = 20  # the third block (positions 8..11)
    changed[0, 6] = 21  # inside the second block
    with torch.no_grad():
        a, b = model(ids).logits, model(changed).logits
    assert torch.equal(a[:, :4], b[:, :4])  # block 0 sees neither change
    assert not torch.equal(a[:, 4:8], b[:, 4:8])  # block 1 sees its own position 6 (bidirectional)


def test_left_padded_row_equals_the_prompt_alone():
    model = tiny("sdar", seed=4)
    ids = random_ids(model, 1, 9)
    padded = torch.cat([torch.full((1, 3), model.pad_id), ids], dim=1)
    real = torch.cat([torch.zeros(1, 3, dtype=torch.bool), torch.ones(1, 9, dtype=torch.bool)], dim=1)
    with torch.no_grad():
        alone = model(ids).logits
        both = model(torch.cat([padded, torch.cat([ids, ids[:, :3]], 1)]),
                     key_padding_mask=torch.cat([real, torch.ones_like(real)])).logits
    # as for LLaDA / Dream (test_forward.py): equal up to the float order of the longer key set
    assert torch.allclose(both[:1, 3:], alone, atol=1e-5, rtol=0)
    assert torch.equal(both[:1, 3:].argmax(-1), alone.argmax(-1))


def test_cached_forward_against_official_store_kv(tmp_path):
    """generate.py's prefill (store_kv=True) then a block forward against the stored K/V: the same
    logits as dllm's cached forward over the same columns."""
    model = tiny("sdar", seed=6)
    model.save_pretrained(tmp_path)
    official = _official(tmp_path)
    ids = random_ids(model, 1, 12)
    mask = _block_mask(12, 4)
    pos = torch.arange(12)[None]
    cache = RefCache()
    official(ids[:, :8], attention_mask=mask[:, :8, :8], position_ids=pos[:, :8], past_key_values=cache,
             use_cache=True, store_kv=True)
    ref = official(ids[:, 8:], attention_mask=mask[:, 8:, :12], position_ids=pos[:, 8:], past_key_values=cache,
                   use_cache=True, store_kv=False).logits
    kv = model.new_kv_cache(1, 12)
    with torch.no_grad():
        model(ids[:, :8], cache=kv.view(0, 8))
        ours = model(ids[:, 8:], cache=kv.view(8, 12)).logits
    assert torch.allclose(ours, ref, atol=1e-5, rtol=0)
    assert torch.equal(ours.argmax(-1), ref.argmax(-1))


def test_save_reload_official_layout(tmp_path):
    model = tiny("sdar", seed=7)
    model.save_pretrained(tmp_path)
    cfg = json.loads((tmp_path / "config.json").read_text())
    assert cfg["model_type"] == "sdar" and cfg["architectures"] == ["SDARForCausalLM"]
    assert cfg["block_size"] == 4 and cfg["head_dim"] == 32 and cfg["mask_token_id"] == model.mask_id
    gen = json.loads((tmp_path / "generation_config.json").read_text())
    assert gen["eos_token_id"] == [model.eot_id, model.eos_id]
    again = load(tmp_path)
    assert isinstance(again, SDAR) and again.config == model.config and again.special == model.special
    ids = random_ids(model, 2, 10)
    with torch.no_grad():
        assert torch.equal(again(ids).logits, model(ids).logits)
    again.save_pretrained(tmp_path / "again")
    assert json.loads((tmp_path / "again" / "config.json").read_text()) == cfg
    assert again.generation_prompt("hello", chat=True)[:1] == [again.tokenizer.convert_tokens_to_ids("<|im_start|>")]


def test_bfloat16_within_rounding(tmp_path):
    model = tiny("sdar", seed=8)
    model.save_pretrained(tmp_path)
    official = _official(tmp_path, torch.bfloat16)
    ours = load(tmp_path, dtype=torch.bfloat16)
    ids = random_ids(ours, 1, 12)
    ref = official(ids, attention_mask=_block_mask(12, 4), position_ids=torch.arange(12)[None]).logits
    with torch.no_grad():
        mine = ours(ids).logits
    assert mine.dtype == torch.bfloat16
    scale = ref.float().abs().max()
    assert (mine.float() - ref.float()).abs().max() <= 0.05 * scale


def _config(tmp_path, **changes) -> None:
    tiny("sdar", seed=1).save_pretrained(tmp_path)
    cfg = json.loads((tmp_path / "config.json").read_text())
    for k, v in changes.items():
        if v is None:
            cfg.pop(k)
        else:
            cfg[k] = v
    (tmp_path / "config.json").write_text(json.dumps(cfg))


@pytest.mark.parametrize("field, value, error, words", [
    ("block_size", None, ValueError, "block_size"),
    ("head_dim", None, ValueError, "head_dim"),
    ("block_size", 0, ValueError, "block_size = 0"),
    ("rope_scaling", {"rope_type": "yarn", "factor": 4.0}, NotImplementedError, "rope_scaling"),
    ("use_sliding_window", True, NotImplementedError, "use_sliding_window"),
    ("attention_bias", True, NotImplementedError, "attention_bias"),
    ("hidden_act", "gelu", NotImplementedError, "hidden_act = 'gelu'"),
])
def test_unsupported_config_fields_named(tmp_path, field, value, error, words):
    _config(tmp_path, **{field: value})
    with pytest.raises(error, match=words):
        load(tmp_path)


def test_unknown_model_type_lists_sdar(tmp_path):
    _config(tmp_path, model_type="sdar_moe")
    with pytest.raises(ValueError, match="sdar_moe.*sdar"):
        load(tmp_path)


def test_config_checks():
    with pytest.raises(ValueError, match="block_size"):
        TransformerConfig(vocab_size=8, d_model=8, n_layers=1, n_heads=2, n_kv_heads=2, mlp_hidden=8,
                          attention="block_causal")
    with pytest.raises(ValueError, match="attention must be one of"):
        TransformerConfig(vocab_size=8, d_model=8, n_layers=1, n_heads=2, n_kv_heads=2, mlp_hidden=8,
                          attention="causal")
    with pytest.raises(ValueError, match="needs attention='block_causal'"):
        TransformerConfig(vocab_size=8, d_model=8, n_layers=1, n_heads=2, n_kv_heads=2, mlp_hidden=8,
                          block_size=4)
    with pytest.raises(ValueError, match="cannot express.*block_causal"):
        tiny("sdar", attention="bidirectional", block_size=None)
