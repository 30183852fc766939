"""save_pretrained writes the official layout; load reads it back to identical logits."""

import json
import re

import pytest
import torch
from safetensors import safe_open

from dllm.models import load, tiny
from dllm.models.checkpoint import INDEX_FILE, SINGLE_FILE

from .helpers import random_ids

LLADA_LAYER = ["attn_norm", "q_proj", "k_proj", "v_proj", "attn_out", "ff_norm", "ff_proj", "up_proj", "ff_out"]
DREAM_LAYER = ["input_layernorm.weight", "self_attn.q_proj.weight", "self_attn.q_proj.bias",
               "self_attn.k_proj.weight", "self_attn.k_proj.bias", "self_attn.v_proj.weight",
               "self_attn.v_proj.bias", "self_attn.o_proj.weight", "post_attention_layernorm.weight",
               "mlp.gate_proj.weight", "mlp.up_proj.weight", "mlp.down_proj.weight"]


def official_keys(family: str, n_layers: int, tied: bool = False) -> set[str]:
    if family == "llada":
        keys = {"model.transformer.wte.weight", "model.transformer.ln_f.weight"}
        keys |= {f"model.transformer.blocks.{i}.{n}.weight" for i in range(n_layers) for n in LLADA_LAYER}
        if not tied:
            keys.add("model.transformer.ff_out.weight")
    else:
        keys = {"model.embed_tokens.weight", "model.norm.weight"}
        keys |= {f"model.layers.{i}.{n}" for i in range(n_layers) for n in DREAM_LAYER}
        if not tied:
            keys.add("lm_head.weight")
    return keys


def stored(path) -> dict[str, torch.Tensor]:
    out = {}
    for f in sorted(path.glob("*.safetensors")):
        with safe_open(str(f), framework="pt") as h:
            out.update({k: h.get_tensor(k) for k in h.keys()})
    return out


LLADA_FIELDS = {
    "model_type": "llada", "architectures": ["LLaDAModelLM"], "d_model": 64, "n_heads": 4, "n_kv_heads": 4,
    "n_layers": 2, "mlp_hidden_size": 128, "rope_theta": 500000.0, "rms_norm_eps": 1e-5, "embedding_size": 112,
    "vocab_size": 112, "max_sequence_length": 512, "weight_tying": False, "include_qkv_bias": False,
    "include_bias": False, "block_type": "llama", "layer_norm_type": "rms", "rope": True, "alibi": False,
    "rope_full_precision": True, "activation_type": "silu", "mask_token_id": 3, "eos_token_id": 2,
    "pad_token_id": 2, "torch_dtype": "float32",
}
DREAM_FIELDS = {
    "model_type": "Dream", "architectures": ["DreamModel"], "hidden_size": 64, "intermediate_size": 128,
    "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2, "max_position_embeddings": 512,
    "rms_norm_eps": 1e-6, "rope_theta": 1000000.0, "rope_scaling": None, "hidden_act": "silu",
    "tie_word_embeddings": False, "vocab_size": 112, "bos_token_id": 1, "eos_token_id": 1, "pad_token_id": 1,
    "mask_token_id": 4, "torch_dtype": "float32",
}


@pytest.mark.parametrize("shard", [None, 60_000])
def test_round_trip_official_layout(tmp_path, family, shard):
    model = tiny(family, seed=7)
    model.save_pretrained(tmp_path, max_shard_size=shard)
    files = sorted(p.name for p in tmp_path.iterdir())
    assert "config.json" in files and "tokenizer.json" in files and "tokenizer_config.json" in files
    if shard is None:
        assert SINGLE_FILE in files and INDEX_FILE not in files
    else:
        shards = [f for f in files if f.startswith("model-")]
        assert len(shards) > 1 and SINGLE_FILE not in files
        assert shards == [f"model-{k:05d}-of-{len(shards):05d}.safetensors" for k in range(1, len(shards) + 1)]
        index = json.loads((tmp_path / INDEX_FILE).read_text())
        assert set(index["weight_map"]) == official_keys(family, 2)
        assert set(index["weight_map"].values()) == set(shards)
        assert index["metadata"]["total_size"] == sum(t.numel() * 4 for t in stored(tmp_path).values())

    tensors = stored(tmp_path)
    assert set(tensors) == official_keys(family, 2)
    cfg = json.loads((tmp_path / "config.json").read_text())
    expected = LLADA_FIELDS if family == "llada" else DREAM_FIELDS
    assert {k: cfg.get(k) for k in expected} == expected
    assert "dtype" not in cfg
    tok_cfg = json.loads((tmp_path / "tokenizer_config.json").read_text())
    assert tok_cfg["tokenizer_class"] == "PreTrainedTokenizerFast" and tok_cfg["chat_template"]

    loaded = load(tmp_path)
    assert type(loaded) is type(model) and loaded.config == model.config and loaded.special == model.special
    ids = random_ids(model, 2, 9)
    with torch.no_grad():
        assert torch.equal(loaded(ids).logits, model(ids).logits)
    assert loaded.generation_prompt("hi", chat=True) == model.generation_prompt("hi", chat=True)


def test_weight_semantics_llada_ff_proj_is_gate(tmp_path):
    model = tiny("llada")
    model.save_pretrained(tmp_path)
    t = stored(tmp_path)
    layer = model.transformer.layers[0]
    assert torch.equal(t["model.transformer.blocks.0.ff_proj.weight"], layer.mlp.gate_proj.weight)
    assert torch.equal(t["model.transformer.blocks.0.up_proj.weight"], layer.mlp.up_proj.weight)
    assert torch.equal(t["model.transformer.blocks.0.ff_out.weight"], layer.mlp.down_proj.weight)
    assert torch.equal(t["model.transformer.ff_out.weight"], model.transformer.lm_head.weight)


def test_tied_embeddings_round_trip(tmp_path, family):
    model = tiny(family, tie_embeddings=True)
    model.save_pretrained(tmp_path)
    assert set(stored(tmp_path)) == official_keys(family, 2, tied=True)
    cfg = json.loads((tmp_path / "config.json").read_text())
    assert cfg["weight_tying" if family == "llada" else "tie_word_embeddings"] is True
    loaded = load(tmp_path)
    ids = random_ids(model, 1, 6)
    with torch.no_grad():
        assert torch.equal(loaded(ids).logits, model(ids).logits)


def test_bf16_save_and_load(tmp_path, family):
    model = tiny(family, dtype=torch.bfloat16)
    model.save_pretrained(tmp_path)
    cfg = json.loads((tmp_path / "config.json").read_text())
    assert cfg["torch_dtype"] == "bfloat16"
    loaded = load(tmp_path)
    assert loaded.dtype == torch.bfloat16
    assert load(tmp_path, dtype="float32").dtype == torch.float32
    assert load(tmp_path, dtype=torch.float16).dtype == torch.float16
    ids = random_ids(model, 1, 6)
    with torch.no_grad():
        assert torch.equal(loaded(ids).logits, model(ids).logits)


def test_resave_replaces_previous_layout(tmp_path):
    model = tiny("dream")
    model.save_pretrained(tmp_path, max_shard_size=50_000)
    model.save_pretrained(tmp_path)
    assert sorted(p.name for p in tmp_path.glob("model*")) == [SINGLE_FILE]


def test_save_without_tokenizer_and_load(tmp_path, family):
    model = tiny(family, tokenizer=False)
    model.save_pretrained(tmp_path)
    assert not (tmp_path / "tokenizer.json").exists()
    loaded = load(tmp_path)
    assert loaded.tokenizer is None
    assert (loaded.mask_id, loaded.eos_id, loaded.pad_id) == (model.mask_id, model.eos_id, model.pad_id)
    with pytest.raises(ValueError, match="has no tokenizer"):
        loaded.generation_prompt("hi", chat=True)


def test_llada_qkv_bias_round_trip(tmp_path):
    model = tiny("llada", qkv_bias=True, n_kv_heads=2)
    model.save_pretrained(tmp_path)
    keys = set(stored(tmp_path))
    assert {"model.transformer.blocks.0.q_proj.bias", "model.transformer.blocks.1.v_proj.bias"} <= keys
    assert json.loads((tmp_path / "config.json").read_text())["include_qkv_bias"] is True
    loaded = load(tmp_path)
    assert loaded.config.qkv_bias and loaded.config.n_kv_heads == 2
    ids = random_ids(model, 1, 6)
    with torch.no_grad():
        assert torch.equal(loaded(ids).logits, model(ids).logits)


def test_dtype_defaults_to_stored_tensors_without_torch_dtype(tmp_path):
    tiny("dream", dtype=torch.bfloat16).save_pretrained(tmp_path)
    cfg = json.loads((tmp_path / "config.json").read_text())
    del cfg["torch_dtype"]
    (tmp_path / "config.json").write_text(json.dumps(cfg))
    assert load(tmp_path).dtype == torch.bfloat16


def test_loaded_official_fields_are_kept_on_save(tmp_path):
    src, dst = tmp_path / "src", tmp_path / "dst"
    tiny("llada").save_pretrained(src)
    cfg = json.loads((src / "config.json").read_text())
    cfg.update(transformers_version="4.46.3", dtype="float32")  # an extra field, and the 4.57+ name
    (src / "config.json").write_text(json.dumps(cfg))
    load(src).save_pretrained(dst)
    out = json.loads((dst / "config.json").read_text())
    assert out["transformers_version"] == "4.46.3" and "dtype" not in out and out["torch_dtype"] == "float32"


# Fields of Dream-org/Dream-v0-Instruct-7B's generation_config.json, except transformers_version
# (the writer's transformers release; dllm writes without transformers).
DREAM_GENERATION_FIELDS = {"_from_model_config", "alg", "alg_temp", "bos_token_id", "eos_token_id", "eps",
                           "mask_token_id", "output_history", "pad_token_id", "steps", "temperature",
                           "top_k", "top_p"}


def assert_official_layout(path, family):
    """Every file of the official layout: config.json, generation_config.json, the weights (one file,
    or every shard its index names), the tokenizer files; and the family's generation config fields."""
    files = {p.name for p in path.iterdir()}
    assert {"config.json", "generation_config.json", "tokenizer.json", "tokenizer_config.json"} <= files
    if SINGLE_FILE in files:
        assert INDEX_FILE not in files
    else:
        shards = set(json.loads((path / INDEX_FILE).read_text())["weight_map"].values())
        assert shards and shards <= files
    cfg = json.loads((path / "config.json").read_text())
    gen = json.loads((path / "generation_config.json").read_text())
    ids = ("bos_token_id", "eos_token_id", "pad_token_id", "mask_token_id") if family == "dream" else (
        "eos_token_id", "pad_token_id")
    assert {k: gen[k] for k in ids} == {k: cfg[k] for k in ids}
    if family == "dream":
        assert set(gen) == DREAM_GENERATION_FIELDS
        assert (gen["alg"], gen["steps"], gen["eps"], gen["temperature"]) == ("origin", 512, 0.001, 0.0)
    else:  # what transformers builds from config.json when the file is absent (LLaDA's loader allows that)
        assert gen == {"_from_model_config": True, "eos_token_id": cfg["eos_token_id"],
                       "pad_token_id": cfg["pad_token_id"]}


@pytest.mark.parametrize("shard", [None, 60_000])
def test_saved_directory_holds_the_whole_official_layout(tmp_path, family, shard):
    tiny(family).save_pretrained(tmp_path, max_shard_size=shard)
    assert_official_layout(tmp_path, family)


@pytest.mark.parametrize("name", ["tiny-llada", "tiny-dream", "tiny-random-llada", "tiny-random-dream"])
def test_embedded_directories_hold_the_whole_official_layout(name):
    from dllm.models.loading import EMBEDDED_DIR

    model = load(name)
    assert_official_layout(EMBEDDED_DIR / name, model.family)
    shipped = json.loads((EMBEDDED_DIR / name / "generation_config.json").read_text())
    assert shipped == model.official_generation_config()


def test_loaded_generation_config_fields_are_kept_on_save(tmp_path):
    src, dst = tmp_path / "src", tmp_path / "dst"
    tiny("dream").save_pretrained(src)
    gen = json.loads((src / "generation_config.json").read_text())
    gen.update(steps=64, alg="entropy", mask_token_id=None, transformers_version="4.46.2")  # official: null
    (src / "generation_config.json").write_text(json.dumps(gen))
    load(src).save_pretrained(dst)
    out = json.loads((dst / "generation_config.json").read_text())
    assert (out["steps"], out["alg"], out["transformers_version"]) == (64, "entropy", "4.46.2")
    assert out["mask_token_id"] == json.loads((dst / "config.json").read_text())["mask_token_id"]


@pytest.mark.parametrize("family,options,said", [
    ("llada", dict(attention="block_causal", block_size=4), "attention='block_causal' (would load as 'bidirectional')"),
    ("dream", dict(attention="block_causal", block_size=4), "block_size=4 (would load as None)"),
    ("llada", dict(rope_dim=8), "rope_dim=8 (would load as None)"),
    ("sdar", dict(rope_dim=8), "rope_dim=8"),
    ("llada", dict(norm_round_once=True, dtype=torch.bfloat16), "norm_round_once=True (would load as False)"),
    ("llada2", dict(rope_fp32=True, dtype=torch.bfloat16), "rope_fp32=True (would load as False)"),
    ("llada", dict(attn_head_dim=8), "attn_head_dim=8"),
    ("llada", dict(qk_norm=True, rope_theta=1234.0), "qk_norm=True (would load as False)"),
])
def test_a_config_the_format_cannot_express_is_refused_before_any_file(tmp_path, family, options, said):
    """A saved config.json must load back as this model: a setting the family's format does not store
    is refused, and the directory keeps what it held (no new config.json over old weights)."""
    tiny(family, seed=1).save_pretrained(tmp_path)
    before = {p.name: p.read_bytes() for p in tmp_path.iterdir()}
    with pytest.raises(ValueError, match=re.escape(said) + ".*nothing was written"):
        tiny(family, seed=2, **options).save_pretrained(tmp_path)
    assert {p.name: p.read_bytes() for p in tmp_path.iterdir()} == before
