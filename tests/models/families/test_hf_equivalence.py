"""Our checkpoints and math are the real ones: transformers' own Qwen2 (for Dream) and Llama (for
LLaDA, after renaming keys) load what we save with no missing or unexpected keys and give the same
logits.

Two ways to compare a causal implementation with a bidirectional one:
- pass transformers a 4-D additive float mask (zeros), which replaces its causal mask (every
  position). (A 4-D *boolean* mask with False entries is not read as "True = attend" by
  transformers 5.24, so the tests use the additive form.)
- with ONE layer, the causal model's last position attends to every key exactly as ours does.
  (With two or more layers it does not: the keys of layer 2 come from layer-1 states of earlier
  positions, which a causal model computes without seeing later tokens.)
"""

import json

import pytest
import torch
from safetensors.torch import load_file

from dllm.models import tiny

from ..helpers import random_ids

transformers = pytest.importorskip("transformers")

LLADA_TO_LLAMA = {
    "attn_norm": "input_layernorm", "q_proj": "self_attn.q_proj", "k_proj": "self_attn.k_proj",
    "v_proj": "self_attn.v_proj", "attn_out": "self_attn.o_proj", "ff_norm": "post_attention_layernorm",
    "ff_proj": "mlp.gate_proj", "up_proj": "mlp.up_proj", "ff_out": "mlp.down_proj",
}


def llada_to_llama_key(key: str) -> str:
    glob = {"model.transformer.wte.weight": "model.embed_tokens.weight",
            "model.transformer.ln_f.weight": "model.norm.weight",
            "model.transformer.ff_out.weight": "lm_head.weight"}
    if key in glob:
        return glob[key]
    _, _, _, i, name, kind = key.split(".")  # model.transformer.blocks.{i}.{name}.weight
    return f"model.layers.{i}.{LLADA_TO_LLAMA[name]}.{kind}"


def additive(allowed: torch.Tensor) -> torch.Tensor:
    """bool [B, 1, T, T] (True = attend) -> float mask: 0 where allowed, float32 min elsewhere."""
    return torch.zeros(allowed.shape).masked_fill(~allowed, torch.finfo(torch.float32).min)


def _compare(ours, theirs, ids):
    b, t = ids.shape
    with torch.no_grad():
        mine = ours.raw_logits(ids)
        ref = theirs(input_ids=ids, attention_mask=additive(torch.ones(b, 1, t, t, dtype=torch.bool))).logits
        assert torch.allclose(mine, ref, atol=1e-4, rtol=0), (mine - ref).abs().max()
        if ours.config.n_layers == 1:  # the causal model's last position sees every key
            causal_last = theirs(input_ids=ids).logits[:, -1]
            assert torch.allclose(mine[:, -1], causal_last, atol=1e-4, rtol=0)


def qwen2_config(path):
    """transformers' ``Qwen2Config`` (Dream's architecture) of the Dream checkpoint at ``path``, eager attention."""
    cfg = json.loads((path / "config.json").read_text())
    return transformers.Qwen2Config(
        vocab_size=cfg["vocab_size"], hidden_size=cfg["hidden_size"],
        intermediate_size=cfg["intermediate_size"], num_hidden_layers=cfg["num_hidden_layers"],
        num_attention_heads=cfg["num_attention_heads"], num_key_value_heads=cfg["num_key_value_heads"],
        max_position_embeddings=cfg["max_position_embeddings"], rms_norm_eps=cfg["rms_norm_eps"],
        rope_theta=cfg["rope_theta"], hidden_act=cfg["hidden_act"],
        tie_word_embeddings=cfg["tie_word_embeddings"], attn_implementation="eager",
    )


@pytest.mark.parametrize("overrides", [{}, {"n_kv_heads": 1}, {"n_layers": 1}])
def test_dream_checkpoint_loads_in_transformers_qwen2(tmp_path, overrides):
    model = tiny("dream", seed=11, **overrides)
    model.save_pretrained(tmp_path)
    qwen = transformers.Qwen2ForCausalLM(qwen2_config(tmp_path)).eval()
    result = qwen.load_state_dict(load_file(str(tmp_path / "model.safetensors")), strict=False)
    assert not result.missing_keys and not result.unexpected_keys
    assert qwen.model.layers[0].self_attn.q_proj.bias is not None
    _compare(model, qwen, random_ids(model, 2, 12))


@pytest.mark.parametrize("overrides", [{}, {"n_kv_heads": 2}, {"n_layers": 1}])
def test_llada_checkpoint_is_llama_under_renaming(tmp_path, overrides):
    model = tiny("llada", seed=12, **overrides)
    model.save_pretrained(tmp_path)
    cfg = json.loads((tmp_path / "config.json").read_text())
    lcfg = transformers.LlamaConfig(
        vocab_size=cfg["embedding_size"], hidden_size=cfg["d_model"], intermediate_size=cfg["mlp_hidden_size"],
        num_hidden_layers=cfg["n_layers"], num_attention_heads=cfg["n_heads"],
        num_key_value_heads=cfg["n_kv_heads"], max_position_embeddings=cfg["max_sequence_length"],
        rms_norm_eps=cfg["rms_norm_eps"], rope_theta=cfg["rope_theta"], hidden_act="silu",
        tie_word_embeddings=cfg["weight_tying"], attention_bias=False, mlp_bias=False,
        attn_implementation="eager",
    )
    llama = transformers.LlamaForCausalLM(lcfg).eval()
    state = {llada_to_llama_key(k): v for k, v in load_file(str(tmp_path / "model.safetensors")).items()}
    result = llama.load_state_dict(state, strict=False)
    assert not result.missing_keys and not result.unexpected_keys
    _compare(model, llama, random_ids(model, 2, 12))


def test_dream_padded_batch_matches_qwen2_with_dream_sampler_inputs(tmp_path):
    """Dream's own sampler passes position_ids = cumsum(mask) - 1 and a 4-D mask real x real;
    on real positions that is exactly our key_padding_mask path."""
    model = tiny("dream", seed=13)
    model.save_pretrained(tmp_path)
    cfg = json.loads((tmp_path / "config.json").read_text())
    qwen = transformers.Qwen2ForCausalLM(transformers.Qwen2Config(
        vocab_size=cfg["vocab_size"], hidden_size=cfg["hidden_size"],
        intermediate_size=cfg["intermediate_size"], num_hidden_layers=cfg["num_hidden_layers"],
        num_attention_heads=cfg["num_attention_heads"], num_key_value_heads=cfg["num_key_value_heads"],
        rms_norm_eps=cfg["rms_norm_eps"], rope_theta=cfg["rope_theta"], tie_word_embeddings=False,
        attn_implementation="eager")).eval()
    qwen.load_state_dict(load_file(str(tmp_path / "model.safetensors")))
    ids = random_ids(model, 2, 10)
    real = torch.ones(2, 10, dtype=torch.bool)
    real[0, :4] = False
    ids[0, :4] = model.pad_id
    tok_idx = (real.long().cumsum(-1) - 1).masked_fill(~real, 1)
    mask4d = real[:, None, None, :] & real[:, None, :, None]
    with torch.no_grad():
        mine = model.raw_logits(ids, key_padding_mask=real)
        ref = qwen(input_ids=ids, attention_mask=additive(mask4d), position_ids=tok_idx).logits
    assert torch.allclose(mine[real], ref[real], atol=1e-4, rtol=0)
