"""SDAR: the checkpoint layout, the config translation and block-causal logits against the
transcription of the official modelling (tests/reference/modelling/sdar_modeling.py), bit for bit in float32."""

from __future__ import annotations

import json

import pytest
import torch

from dllm.models import load, tiny
from dllm.models.core.config import TransformerConfig
from dllm.models.families.sdar import SDAR
from dllm.models.core.layer.block import block_causal_mask
from tests.reference.modelling.sdar_modeling import RefCache, RefSDARForCausalLM

from ..helpers import assert_regenerated, logits_atol, random_ids


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
    assert loaded.attn_backend in (("sdpa", "auto") if torch.cuda.is_available() else ("sdpa",))  # auto: measured on CUDA
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


def test_bfloat16_bit_identical_too(tmp_path):
    """bfloat16 (the released checkpoints' dtype): bit-identical with the 4-D mask as well; the 3-D call
    of generate.py (another CPU kernel) within bf16 rounding."""
    model = tiny("sdar", seed=8)
    model.save_pretrained(tmp_path)
    official = _official(tmp_path, torch.bfloat16)
    ours = load(tmp_path, dtype=torch.bfloat16)
    ids = random_ids(ours, 2, 12)
    pos = torch.arange(12)[None]
    ref = official(ids, attention_mask=_four_d(_block_mask(12, 4)), position_ids=pos).logits
    ref3 = official(ids, attention_mask=_block_mask(12, 4), position_ids=pos).logits
    with torch.no_grad():
        mine = ours(ids).logits
    assert mine.dtype == torch.bfloat16
    assert torch.equal(mine, ref)
    assert (ref3.float() - ref.float()).abs().max() <= 0.02 * ref.float().abs().max()


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


# SDAR-4B-Chat's config.json fields at tiny sizes (training switches, auto_map and all), as the
# official classes write them
OFFICIAL_CONFIG = {
    "architectures": ["SDARForCausalLM"],
    "auto_map": {"AutoConfig": "configuration_sdar.SDARConfig", "AutoModel": "modeling_sdar.SDARModel",
                 "AutoModelForCausalLM": "modeling_sdar.SDARForCausalLM"},
    "attention_bias": False, "attention_dropout": 0.0, "attn_implementation": "flex_attention",
    "bos_token_id": 90, "debug": False, "eos_token_id": 90, "block_size": 4, "mask_token_id": 95,
    "ep_size": 1, "fuse_cross_entropy": True, "head_dim": 16, "hidden_act": "silu", "hidden_size": 48,
    "initializer_range": 0.02, "intermediate_size": 96, "max_position_embeddings": 256,
    "max_window_layers": 3, "micro_forward": False, "model_type": "sdar", "num_attention_heads": 6,
    "num_hidden_layers": 3, "num_key_value_heads": 2, "rms_norm_eps": 1e-06, "rope_scaling": None,
    "rope_theta": 1000000, "skip_checkpoint": False, "sliding_window": None, "tie_word_embeddings": False,
    "torch_dtype": "float32", "transformers_version": "4.52.4", "use_cache": False, "use_deepep": False,
    "use_sliding_window": False, "vocab_size": 100,
}


def test_checkpoint_made_by_the_official_classes_loads(tmp_path):
    """A random checkpoint written from the official module tree (its state_dict, its config.json,
    split in two shards with an index as the released checkpoints are): dllm loads it, with no
    tokenizer, and its logits are the official ones bit for bit."""
    from safetensors.torch import save_file

    torch.manual_seed(0)
    official = RefSDARForCausalLM(OFFICIAL_CONFIG)
    with torch.no_grad():
        for p in official.parameters():
            p.copy_(torch.randn_like(p) * (0.5 if p.dim() == 1 else p.shape[-1] ** -0.5) + (1.0 if p.dim() == 1 else 0))
    (tmp_path / "config.json").write_text(json.dumps(OFFICIAL_CONFIG))
    state = {k: v.contiguous() for k, v in official.state_dict().items()}
    keys = sorted(state)
    half = len(keys) // 2
    index = {"metadata": {"total_size": sum(v.numel() * 4 for v in state.values())}, "weight_map": {}}
    for n, part in enumerate((keys[:half], keys[half:]), start=1):
        name = f"model-0000{n}-of-00002.safetensors"
        save_file({k: state[k] for k in part}, str(tmp_path / name), metadata={"format": "pt"})
        index["weight_map"].update({k: name for k in part})
    (tmp_path / "model.safetensors.index.json").write_text(json.dumps(index))
    model = load(tmp_path)
    assert model.config.head_dim == 16 and model.config.d_model == 48 and model.mask_id == 95
    assert model.eos_id == 90 and model.tokenizer is None
    ids = torch.randint(0, 90, (2, 11), generator=torch.Generator().manual_seed(1))
    ref = official(ids, attention_mask=_four_d(_block_mask(11, 4)), position_ids=torch.arange(11)[None]).logits
    with torch.no_grad():
        assert torch.equal(model(ids).logits, ref)


def test_sharded_save_loads_in_the_official_code(tmp_path):
    model = tiny("sdar", seed=9)
    model.save_pretrained(tmp_path, max_shard_size=20_000)
    assert len(list(tmp_path.glob("*.safetensors"))) > 1 and (tmp_path / "model.safetensors.index.json").is_file()
    official = _official(tmp_path)
    ids = random_ids(model, 1, 9)
    ref = official(ids, attention_mask=_four_d(_block_mask(9, 4)), position_ids=torch.arange(9)[None]).logits
    with torch.no_grad():
        assert torch.equal(model(ids).logits, ref)


def test_long_ragged_batch_runs_per_row_group_with_the_block_mask(monkeypatch):
    """A long left-padded batch takes the packed-rows path (dllm.models.core.packed_rows), which runs each
    group of rows unmasked over its real columns: the block-causal mask still applies (it comes from
    the positions), and the logits match the padded forward."""
    import dllm.models.base as base

    taken = []
    real_fn = base.packed_rows_logits
    monkeypatch.setattr(base, "packed_rows_logits", lambda *a: taken.append(real_fn(*a)) or taken[-1])
    model = tiny("sdar", seed=10)
    ids = random_ids(model, 2, 300)
    real = torch.ones(2, 300, dtype=torch.bool)
    real[0, :120] = False
    with torch.no_grad():
        packed = model(ids, key_padding_mask=real).logits
        assert taken and taken[0] is not None  # the packed path ran
        model.packs_padded_rows = False
        padded = model(ids, key_padding_mask=real).logits
        alone = model(ids[:1, 120:]).logits
    assert torch.allclose(packed[real], padded[real], atol=1e-5, rtol=0)
    assert torch.allclose(packed[0, 120:], alone[0], atol=1e-5, rtol=0)


def test_embedded_tiny_random_sdar_is_the_regenerated_checkpoint():
    """dllm/models/embedded/tiny-random-sdar is what ``dllm models make-embedded`` writes (tiny("sdar",
    seed=2)), loads offline as SDAR, and decodes with the exact block cache."""
    import dllm
    from dllm.models import embedded_names

    assert "tiny-random-sdar" in embedded_names()
    model = load("tiny-random-sdar")
    assert isinstance(model, SDAR) and model.config.block_size == 4
    ids = random_ids(model, 1, 10)
    with torch.no_grad():
        fresh = tiny("sdar", seed=2)
        assert_regenerated(model.transformer.state_dict(), fresh.transformer.state_dict())
        want = fresh(ids).logits
        torch.testing.assert_close(model(ids).logits, want, rtol=0, atol=logits_atol(model, want))
    out = dllm.generate(model, "what is the sum of 2 and 3 ?", "sdar", chat=True, cache="block", gen_length=8)
    assert out.sequences.shape[1] == out.prompt_length + 8 and out.texts[0] is not None
