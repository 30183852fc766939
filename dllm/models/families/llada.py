"""LLaDA (GSAI-ML/LLaDA-8B-*): config.json translation, checkpoint key names, chat template.

Only ``block_type: "llama"`` (separate q/k/v and gate/up projections) exists in the released
checkpoints; other OLMo-derived variants raise NotImplementedError naming the field.
Logits are not shifted: ``logits[:, i]`` predicts position i. Sources: GSAI-ML/LLaDA-8B-Instruct
``config.json``, ``tokenizer_config.json``, ``configuration_llada.py`` and ``modeling_llada.py``;
LLaDA (arXiv 2502.09992).
"""

from __future__ import annotations

from typing import Any, Callable, Mapping

import torch

from dllm.models.inputs import SpecialIds
from dllm.models.core.config import TransformerConfig
from dllm.models.families.keymap import KeyMap
from dllm.models.families.pretrained import (DTYPE_NAMES, TransformerLM, number_field, require_fields,
                                             resolve_special)

LLADA_KEYMAP = KeyMap(
    global_names=(
        ("model.transformer.wte.weight", "embed.weight"),
        ("model.transformer.ln_f.weight", "norm.weight"),
        ("model.transformer.ff_out.weight", "lm_head.weight"),  # the LM head (absent when tied)
    ),
    layer_prefix="model.transformer.blocks.{i}.",
    layer_names=(
        ("attn_norm.weight", "attn_norm.weight"),
        ("q_proj.weight", "attn.q_proj.weight"),
        ("q_proj.bias", "attn.q_proj.bias"),
        ("k_proj.weight", "attn.k_proj.weight"),
        ("k_proj.bias", "attn.k_proj.bias"),
        ("v_proj.weight", "attn.v_proj.weight"),
        ("v_proj.bias", "attn.v_proj.bias"),
        ("attn_out.weight", "attn.o_proj.weight"),
        ("ff_norm.weight", "mlp_norm.weight"),
        ("ff_proj.weight", "mlp.gate_proj.weight"),  # ff_proj goes through SiLU: it is the gate
        ("up_proj.weight", "mlp.up_proj.weight"),
        ("ff_out.weight", "mlp.down_proj.weight"),  # per-block ff_out is the MLP down projection
    ),
)

# Chat template of LLaDA-8B-Instruct's tokenizer_config.json, restated for dllm: BOS before
# the first message, header + role + blank line + trimmed content + <|eot_id|> per message, and the
# assistant header ALWAYS appended (whatever add_generation_prompt says).
LLADA_CHAT_TEMPLATE = (
    "{%- for message in messages -%}"
    "{%- if loop.first -%}{{ '<|startoftext|>' }}{%- endif -%}"
    "{{ '<|start_header_id|>' + message['role'] + '<|end_header_id|>\\n\\n' "
    "+ (message['content'] | trim) + '<|eot_id|>' }}"
    "{%- endfor -%}"
    "{{ '<|start_header_id|>assistant<|end_header_id|>\\n\\n' }}"
)

LLADA_SPECIAL_TOKENS = {
    "bos": "<|startoftext|>", "eos": "<|endoftext|>", "mask": "<|mdm_mask|>",
    "header_start": "<|start_header_id|>", "header_end": "<|end_header_id|>", "eot": "<|eot_id|>",
}

_REQUIRED = ("d_model", "n_layers", "n_heads", "vocab_size", "rope_theta", "rms_norm_eps",
             "max_sequence_length", "weight_tying", "block_type", "layer_norm_type",
             "activation_type", "rope")

_falsy: Callable[[Any], bool] = lambda v: not v
# field -> (is the value supported?, what is supported)
_SUPPORTED: dict[str, tuple[Callable[[Any], bool], str]] = {
    "block_type": (lambda v: v == "llama", '"llama"'),
    "layer_norm_type": (lambda v: v == "rms", '"rms"'),
    "activation_type": (lambda v: v == "silu", '"silu"'),
    "rope": (lambda v: v is True, "true"),
    "alibi": (_falsy, "false"),
    "input_emb_norm": (_falsy, "false"),
    "scale_logits": (_falsy, "false"),
    "attention_layer_norm": (_falsy, "false"),
    "multi_query_attention": (_falsy, "null or false"),
    "include_bias": (_falsy, "false (include_qkv_bias is supported)"),
    "bias_for_layer_norm": (_falsy, "false"),
    "layer_norm_with_affine": (lambda v: v is None or v is True, "true"),
    "clip_qkv": (lambda v: v is None, "null"),
    "block_group_size": (lambda v: v in (None, 1), "1"),
}


def _precision(dtype: torch.dtype) -> str:
    return {torch.bfloat16: "amp_bf16", torch.float16: "amp_fp16"}.get(dtype, "fp32")


class LLaDA(TransformerLM):
    """LLaDA: the shared transformer, OLMo/LLaDA key names, no logit shift."""

    family = "llada"
    model_types = ("llada",)
    keymap = LLADA_KEYMAP
    default_chat_template = LLADA_CHAT_TEMPLATE
    default_special = SpecialIds(mask_id=126336, eos_id=126081, pad_id=126081, eot_id=126348, bos_id=126080)

    @classmethod
    def from_hf_config(
        cls, hf: Mapping[str, Any], tokenizer: Any = None
    ) -> tuple[TransformerConfig, SpecialIds]:
        """Official config.json dict -> (TransformerConfig, SpecialIds)."""
        require_fields(hf, _REQUIRED, "LLaDA")
        for name, (ok, valid) in _SUPPORTED.items():
            if name in hf and not ok(hf[name]):
                raise NotImplementedError(
                    f"LLaDA config.json field {name} = {hf[name]!r} is not supported (supported: {valid})"
                )
        mlp_hidden = hf.get("mlp_hidden_size")
        if mlp_hidden is None:
            if hf.get("mlp_ratio") is None:
                raise ValueError("LLaDA config.json is missing required field(s): mlp_hidden_size "
                                 "(or mlp_ratio)")
            mlp_hidden = int(number_field(hf, "mlp_ratio", "LLaDA") * number_field(hf, "d_model", "LLaDA"))
        rows = hf.get("embedding_size") or hf["vocab_size"]
        config = TransformerConfig(
            vocab_size=rows,
            d_model=hf["d_model"],
            n_layers=hf["n_layers"],
            n_heads=hf["n_heads"],
            n_kv_heads=hf.get("n_kv_heads") or hf["n_heads"],
            mlp_hidden=mlp_hidden,
            rope_theta=number_field(hf, "rope_theta", "LLaDA"),
            rms_eps=number_field(hf, "rms_norm_eps", "LLaDA"),
            max_positions=hf["max_sequence_length"],
            qkv_bias=bool(hf.get("include_qkv_bias", False)),
            tie_embeddings=bool(hf["weight_tying"]),
            rope_fp32=bool(hf.get("rope_full_precision", True)),
        )
        special = resolve_special(
            hf, tokenizer, defaults=cls.default_special, vocab_rows=rows, family="LLaDA",
            tokens={"mask_id": LLADA_SPECIAL_TOKENS["mask"], "eot_id": LLADA_SPECIAL_TOKENS["eot"]},
        )
        return config, special

    @classmethod
    def to_hf_config(
        cls, config: TransformerConfig, special: SpecialIds, dtype: torch.dtype
    ) -> dict[str, Any]:
        """TransformerConfig + ids -> the fields of the official LLaDA config.json (those of
        GSAI-ML/LLaDA-8B-Instruct, read by ``configuration_llada.LLaDAConfig``)."""
        return {
            "model_type": "llada",
            "architectures": ["LLaDAModelLM"],
            "d_model": config.d_model,
            "n_layers": config.n_layers,
            "n_heads": config.n_heads,
            "n_kv_heads": config.n_kv_heads,
            "multi_query_attention": None,
            "mlp_hidden_size": config.mlp_hidden,
            "mlp_ratio": 4,
            "activation_type": "silu",
            "block_type": "llama",
            "block_group_size": 1,
            "layer_norm_type": "rms",
            "layer_norm_with_affine": True,
            "rms_norm_eps": config.rms_eps,
            "bias_for_layer_norm": False,
            "include_bias": False,
            "include_qkv_bias": config.qkv_bias,
            "attention_layer_norm": False,
            "clip_qkv": None,
            "rope": True,
            "alibi": False,
            "alibi_bias_max": 8.0,
            "rope_theta": config.rope_theta,
            "rope_full_precision": config.rope_fp32,
            "max_sequence_length": config.max_positions,
            "vocab_size": config.vocab_size,
            "embedding_size": config.vocab_size,
            "weight_tying": config.tie_embeddings,
            "scale_logits": False,
            "input_emb_norm": False,
            "flash_attention": False,
            "attention_dropout": 0.0,
            "residual_dropout": 0.0,
            "embedding_dropout": 0.0,
            "init_fn": "mitchell",
            "init_std": 0.02,
            "init_device": "meta",
            "precision": _precision(dtype),
            "use_cache": False,
            "mask_token_id": special.mask_id,
            "eos_token_id": special.eos_id,
            "pad_token_id": special.pad_id,
            "torch_dtype": DTYPE_NAMES.get(dtype, str(dtype).removeprefix("torch.")),
        }
