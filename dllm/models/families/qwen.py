"""The Qwen2 / Qwen3 checkpoint layout shared by three families: Dream and Fast-dLLM v2 (Qwen2.5: q/k/v
biases) and SDAR (Qwen3: per-head q/k RMSNorm, no biases).

One key map (``qwen_keymap``), the config.json fields every one of them reads the same way
(``qwen_transformer_config``) and those each writes the same way (``qwen_hf_fields``); each family
adds its own fields and checks (``dream.py``, ``fastdllm_v2.py``, ``sdar.py``).
"""

from __future__ import annotations

from typing import Any, Mapping

import torch

from dllm.models.inputs import SpecialIds
from dllm.models.core.config import TransformerConfig
from dllm.models.families.keymap import KeyMap
from dllm.models.families.pretrained import DTYPE_NAMES, number_field


def qwen_keymap(*, qkv_bias: bool, qk_norm: bool) -> KeyMap:
    """The Qwen2 (``qkv_bias``) or Qwen3 (``qk_norm``) names: ``model.embed_tokens``, ``model.norm``,
    ``lm_head`` (absent when tie_word_embeddings), and per layer the attention and SwiGLU MLP."""
    attn: list[tuple[str, str]] = []
    for p in ("q", "k", "v"):
        attn.append((f"self_attn.{p}_proj.weight", f"attn.{p}_proj.weight"))
        if qkv_bias:
            attn.append((f"self_attn.{p}_proj.bias", f"attn.{p}_proj.bias"))
    attn.append(("self_attn.o_proj.weight", "attn.o_proj.weight"))
    if qk_norm:
        attn += [("self_attn.q_norm.weight", "attn.q_norm.weight"), ("self_attn.k_norm.weight", "attn.k_norm.weight")]
    return KeyMap(
        global_names=(
            ("model.embed_tokens.weight", "embed.weight"),
            ("model.norm.weight", "norm.weight"),
            ("lm_head.weight", "lm_head.weight"),  # absent when tie_word_embeddings
        ),
        layer_prefix="model.layers.{i}.",
        layer_names=(
            ("input_layernorm.weight", "attn_norm.weight"),
            *attn,
            ("post_attention_layernorm.weight", "mlp_norm.weight"),
            ("mlp.gate_proj.weight", "mlp.gate_proj.weight"),
            ("mlp.up_proj.weight", "mlp.up_proj.weight"),
            ("mlp.down_proj.weight", "mlp.down_proj.weight"),
        ),
        ignored=(r"\.rotary_emb\.inv_freq$",),  # RoPE buffers some older Qwen2 exports stored
    )


def qwen_transformer_config(hf: Mapping[str, Any], name: str, **family: Any) -> TransformerConfig:
    """A Qwen config.json -> TransformerConfig: the fields every Qwen family reads alike (RoPE in the
    activation dtype; ``num_key_value_heads`` absent = one per head; ``tie_word_embeddings`` absent =
    false; ``rope_theta`` / ``rms_norm_eps`` JSON numbers, refused naming the ``name`` family's field
    otherwise), then ``family``'s own, which take precedence."""
    fields: dict[str, Any] = dict(
        vocab_size=hf["vocab_size"],
        d_model=hf["hidden_size"],
        n_layers=hf["num_hidden_layers"],
        n_heads=hf["num_attention_heads"],
        n_kv_heads=hf.get("num_key_value_heads") or hf["num_attention_heads"],
        mlp_hidden=hf["intermediate_size"],
        rope_theta=number_field(hf, "rope_theta", name),
        rms_eps=number_field(hf, "rms_norm_eps", name),
        max_positions=hf["max_position_embeddings"],
        tie_embeddings=bool(hf.get("tie_word_embeddings", False)),
        rope_fp32=False,
    )
    return TransformerConfig(**{**fields, **family})


def qwen_hf_fields(config: TransformerConfig, special: SpecialIds, dtype: torch.dtype) -> dict[str, Any]:
    """The config.json fields every Qwen family writes alike: sizes, RoPE, SiLU, no sliding window, the
    eos / pad / mask ids and the dtype. The family adds ``model_type``, ``architectures``,
    ``bos_token_id``, ``use_cache`` and its own fields."""
    return {
        "hidden_size": config.d_model,
        "intermediate_size": config.mlp_hidden,
        "num_hidden_layers": config.n_layers,
        "num_attention_heads": config.n_heads,
        "num_key_value_heads": config.n_kv_heads,
        "max_position_embeddings": config.max_positions,
        "rms_norm_eps": config.rms_eps,
        "rope_theta": config.rope_theta,
        "rope_scaling": None,
        "hidden_act": "silu",
        "attention_dropout": 0.0,
        "initializer_range": 0.02,
        "use_sliding_window": False,
        "sliding_window": None,
        "max_window_layers": config.n_layers,
        "tie_word_embeddings": config.tie_embeddings,
        "vocab_size": config.vocab_size,
        "eos_token_id": special.eos_id,
        "pad_token_id": special.pad_id,
        "mask_token_id": special.mask_id,
        "torch_dtype": DTYPE_NAMES.get(dtype, str(dtype).removeprefix("torch.")),
    }
