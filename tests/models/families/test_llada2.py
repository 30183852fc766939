"""LLaDA 2.x MoE: a random tiny checkpoint made with (a transcription of) the official classes
loads in dllm with bit-identical float32 logits; dllm saves it back in the official layout; the
config fields dllm does not implement are named."""

from __future__ import annotations

import importlib.util
import json

import pytest
import torch

from dllm.models import load
from dllm.models.families.llada2 import LLaDA2, tiny_llada2
from dllm.models.core.layer.moe import MoEConfig, SparseMoE, count_experts
from tests.reference.modelling.llada2_modeling import RefLLaDA2MoeModelLM

# llada2_mini's config.json (dFactory configs/model_configs/llada2_mini) at toy sizes
TINY = {
    "architectures": ["LLaDA2MoeModelLM"], "model_type": "llada2_moe", "num_hidden_layers": 3, "hidden_size": 64,
    "intermediate_size": 96, "first_k_dense_replace": 1, "hidden_act": "silu", "max_position_embeddings": 512,
    "moe_intermediate_size": 32, "norm_topk_prob": True, "num_experts_per_tok": 4, "norm_head": False,
    "num_attention_heads": 4, "num_experts": 16, "num_key_value_heads": 2, "rope_theta": 600000,
    "rope_scaling": None, "tie_word_embeddings": False, "torch_dtype": "float32", "use_bias": False,
    "use_rmsnorm": True, "rms_norm_eps": 1e-06, "head_dim": 16, "num_shared_experts": 1, "use_cache": False,
    "use_qkv_bias": False, "vocab_size": 96, "rotary_dim": 8, "router_dtype": "fp32",
    "moe_router_enable_expert_bias": True, "routed_scaling_factor": 2.5, "n_group": 4, "topk_group": 2,
    "score_function": "sigmoid", "pad_token_id": 94, "eos_token_id": 94, "mask_token_id": 95,
    "partial_rotary_factor": 0.5, "use_sliding_window": False, "block_size": 4,
}


def block_mask(t: int, bs: int) -> torch.Tensor:
    """The official generate()'s mask: tril(ones(nb, nb)) repeated per block -> bool [1, 1, T, T]."""
    nb = -(-t // bs)
    m = torch.tril(torch.ones(nb, nb)).repeat_interleave(bs, dim=0).repeat_interleave(bs, dim=1)
    return m[None, None, :t, :t].bool()


def official_dir(tmp_path, seed=0, **changes):
    cfg = {**TINY, **changes}
    if cfg.get("partial_rotary_factor") == 1.0:
        cfg["rotary_dim"] = cfg["head_dim"]
    ref = RefLLaDA2MoeModelLM.random(cfg, seed)
    ref.save_official(tmp_path / "official")
    return tmp_path / "official", ref


CASES = [{}, {"tie_word_embeddings": True}, {"num_key_value_heads": 4}, {"num_experts_per_tok": 1},
         {"num_shared_experts": None}, {"partial_rotary_factor": 1.0}, {"first_k_dense_replace": 0},
         {"n_group": 1, "topk_group": 1}, {"use_qk_norm": False}]


@pytest.mark.parametrize("changes", CASES, ids=lambda c: ",".join(f"{k}={v}" for k, v in c.items()) or "mini")
def test_logits_bit_identical_to_official_modelling(tmp_path, changes):
    path, ref = official_dir(tmp_path, seed=3, **changes)
    model = load(path)
    assert isinstance(model, LLaDA2) and model.config.block_causal and model.config.block_size == 4
    n_moe = sum(isinstance(layer.mlp, SparseMoE) for layer in model.transformer.layers)
    assert n_moe == 3 - changes.get("first_k_dense_replace", 1)
    ids = torch.randint(0, 94, (2, 13), generator=torch.Generator().manual_seed(1))
    want = ref(ids, attention_mask=block_mask(13, 4)).logits
    with torch.no_grad():
        got = model(ids).logits
    assert torch.equal(got, want), (got - want).abs().max()


def test_saved_by_dllm_loads_in_official_code(tmp_path):
    model = tiny_llada2(seed=4)
    model.save_pretrained(tmp_path / "ours")
    hf = json.loads((tmp_path / "ours" / "config.json").read_text())
    assert hf["model_type"] == "llada2_moe" and hf["num_experts"] == 8 and hf["first_k_dense_replace"] == 1
    ref = RefLLaDA2MoeModelLM.from_pretrained(tmp_path / "ours")  # strict: every key of the official model
    ids = torch.randint(0, 94, (1, 11), generator=torch.Generator().manual_seed(2))
    with torch.no_grad():
        assert torch.equal(model(ids).logits, ref(ids, attention_mask=block_mask(11, 4)).logits)
    again = load(tmp_path / "ours")
    with torch.no_grad():
        assert torch.equal(again(ids).logits, model(ids).logits)


def test_veomni_layout_loads_and_saves_back(tmp_path):
    """dFactory's training layout (model_type llada2_moe_veomni: a layer's experts stacked per
    projection, as scripts/moe_convertor.py --mode merge writes them) loads to the same model, and
    is saved back in that layout."""
    from safetensors.torch import load_file, save_file

    path, ref = official_dir(tmp_path, seed=9)
    state, merged = load_file(str(path / "model.safetensors")), {}
    for layer in (1, 2):
        for proj in ("gate_proj", "up_proj", "down_proj"):
            keys = [f"model.layers.{layer}.mlp.experts.{e}.{proj}.weight" for e in range(16)]
            merged[f"model.layers.{layer}.mlp.experts.{proj}"] = torch.stack([state.pop(k) for k in keys])
    veomni = tmp_path / "veomni"
    veomni.mkdir()
    save_file({**state, **merged}, str(veomni / "model.safetensors"))
    cfg = json.loads((path / "config.json").read_text())
    (veomni / "config.json").write_text(json.dumps({**cfg, "model_type": "llada2_moe_veomni"}))
    model = load(veomni)
    ids = torch.randint(0, 94, (2, 9), generator=torch.Generator().manual_seed(7))
    with torch.no_grad():
        assert torch.equal(model(ids).logits, ref(ids, attention_mask=block_mask(9, 4)).logits)
    model.save_pretrained(tmp_path / "again")
    saved = load_file(str(tmp_path / "again" / "model.safetensors"))
    assert set(saved) == set(state) | set(merged)
    assert all(torch.equal(saved[k], v) for k, v in merged.items())
    assert json.loads((tmp_path / "again" / "config.json").read_text())["model_type"] == "llada2_moe_veomni"
    del saved["model.layers.2.mlp.experts.up_proj"]
    save_file(saved, str(tmp_path / "again" / "model.safetensors"))
    with pytest.raises(Exception, match="missing keys.*model.layers.2.mlp.experts.up_proj"):
        load(tmp_path / "again")


def test_bfloat16_within_rounding(tmp_path):
    path, _ = official_dir(tmp_path, seed=5)
    ref = RefLLaDA2MoeModelLM.from_pretrained(path, torch.bfloat16)
    model = load(path, dtype="bfloat16")
    ids = torch.randint(0, 94, (2, 12), generator=torch.Generator().manual_seed(3))
    want = ref(ids, attention_mask=block_mask(12, 4)).logits
    with torch.no_grad():
        got = model(ids).logits.float()
    f32 = load(path)(ids).logits.detach()
    # both bf16 runs are as far from float32 as each other, and close to each other
    assert (got - want).abs().max() <= 2 * max((want - f32).abs().max(), 1e-2)


def test_block_causal_inside_blocks_bidirectional():
    # all layers dense: with MoE layers a changed token changes how many rows each expert runs on,
    # and a one-row matmul rounds differently from a many-row one (as in the official moe_infer)
    model = tiny_llada2(seed=6, moe=MoEConfig(n_experts=8, top_k=2, expert_hidden=32, n_group=4, topk_group=2,
                                              first_dense=3))
    ids = torch.randint(0, 94, (1, 12), generator=torch.Generator().manual_seed(4))
    with torch.no_grad():
        base = model(ids).logits
        later = ids.clone()
        later[0, 9] = (later[0, 9] + 1) % 94  # a token of the third block (8..11)
        out = model(later).logits
    assert torch.equal(out[0, :8], base[0, :8])  # earlier blocks do not see it
    assert not torch.equal(out[0, 8], base[0, 8])  # its own block does (position 8 < 9)


def test_experts_counted_per_forward():
    model = tiny_llada2(seed=7)
    ids = torch.randint(0, 94, (1, 16), generator=torch.Generator().manual_seed(5))
    with torch.no_grad(), count_experts(model) as counter:
        model(ids[:, :1])
        model(ids)
    assert counter.forwards() == 2 and len(counter.uses) == 4  # 2 MoE layers x 2 forwards
    one, many = counter.uses[:2], counter.uses[2:]
    assert all(u.distinct == 2 for u in one)  # a single token: its top-2
    assert all(u.distinct > 2 for u in many)


@pytest.mark.skipif(importlib.util.find_spec("torchao") is None, reason="torchao is not installed")
def test_quantized_llada2_runs(tmp_path):
    from dllm.models.quantize import weight_bytes

    path, _ = official_dir(tmp_path, seed=8)
    ref, q = load(path), load(path, quantization="int8")
    assert weight_bytes(ref) / weight_bytes(q) > 2.5  # experts are linears too; router and embeddings stay float
    ids = torch.randint(0, 94, (1, 8), generator=torch.Generator().manual_seed(6))
    with torch.no_grad():
        a, b = ref(ids).logits, q(ids).logits
    assert ((a - b).norm() / a.norm()) < 0.1  # int8 rounding, and the few routing choices it flips
    experts = q.transformer.layers[1].mlp.experts
    assert all(type(e.gate_proj.weight).__name__ == "Int8Tensor" for e in experts)


@pytest.mark.parametrize("field, value, match", [
    ("use_bias", True, "use_bias = True is not supported"),
    ("score_function", "softmax", "score_function = 'softmax' is not supported"),
    ("norm_topk_prob", False, "norm_topk_prob = False is not supported"),
    ("rope_scaling", {"type": "linear"}, "rope_scaling"),
    ("hidden_act", "gelu", "hidden_act = 'gelu'"),
])
def test_unsupported_fields_are_named(tmp_path, field, value, match):
    path, _ = official_dir(tmp_path)
    cfg = json.loads((path / "config.json").read_text())
    cfg[field] = value
    (path / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(NotImplementedError, match=match):
        load(path)


def test_bad_sizes_are_named(tmp_path):
    path, _ = official_dir(tmp_path)
    cfg = json.loads((path / "config.json").read_text())
    (path / "config.json").write_text(json.dumps({**cfg, "rotary_dim": 6}))
    with pytest.raises(ValueError, match="rotary_dim 6 disagrees with head_dim 16 x partial_rotary_factor 0.5 = 8"):
        load(path)
    (path / "config.json").write_text(json.dumps({**cfg, "num_experts": 12}))
    with pytest.raises(Exception, match="num_experts|experts"):
        load(path)
    del cfg["moe_intermediate_size"]
    (path / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(ValueError, match="missing required field.*moe_intermediate_size"):
        load(path)


@pytest.mark.parametrize("sampler", ["low_confidence", "threshold", "sdar"])
def test_block_cache_decodes_like_recompute_with_fewer_experts(sampler):
    """The exact block cache (dllm.cache 'block') on a MoE model: the tokens of recomputing
    everything, from forwards of fewer rows, which route to fewer distinct experts."""
    import dllm

    model = tiny_llada2(seed=1)
    prompts = [[5, 6, 7, 8, 9, 10, 11], [12, 13, 14]]
    runs = {}
    for cache in ("none", "block"):
        with count_experts(model) as counter:
            out = dllm.generate(model, prompts, gen_length=12, block_length=4, sampler=sampler, cache=cache)
        runs[cache] = (out.sequences, counter.mean_tokens(), counter.mean_distinct())
    assert torch.equal(runs["none"][0], runs["block"][0])
    assert runs["block"][1] < runs["none"][1] / 2  # rows routed per forward
    assert runs["block"][2] < runs["none"][2]  # distinct experts per layer per forward


def test_tiny_builds_llada2_and_names_bad_overrides():
    from dllm.models import tiny

    model = tiny("llada2", seed=2, block_size=8)
    assert isinstance(model, LLaDA2) and model.config.block_size == 8
    with pytest.raises(ValueError, match=r"unknown override\(s\) \['foo'\]"):
        tiny("llada2", foo=1)
