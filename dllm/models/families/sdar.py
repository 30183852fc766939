"""SDAR (JetLM/SDAR-*-Chat): config.json translation, Qwen3 key names, ChatML, block-causal attention.

SDAR is Qwen3 (q/k per-head RMSNorm before RoPE, an explicit ``head_dim``, no biases) trained as a
block-diffusion model: attention is bidirectional inside a block of ``block_size`` positions and
causal across blocks (``TransformerConfig.attention = "block_causal"``), and a block is decoded by
unmasking ``<|MASK|>`` tokens while the finished blocks' keys/values stay exact (``dllm.cache``
``block``). Logits are not shifted: ``logits[:, i]`` predicts position i. Sources: JetAstra/SDAR
``training/model/SDAR-4B-Chat/config.json``, ``configuration_sdar.py``, ``modeling_sdar.py``,
``generation_config.json``, ``tokenizer_config.json`` and ``generate.py``; SDAR (arXiv 2510.06303).

The official model is loaded here without ``trust_remote_code``: the checkpoint's tensors are mapped
onto the shared transformer (``core/transformer.py``), whose logits equal the official modelling's
(tests/models/families/test_sdar.py against the transcription in tests/reference/modelling/sdar_modeling.py).
"""

from __future__ import annotations

import dataclasses

from typing import Any, Mapping

import torch

from dllm.models.inputs import SpecialIds
from dllm.models.core.config import TransformerConfig
from dllm.models.families.pretrained import TransformerLM, require_fields, resolve_special
from dllm.models.families.qwen import qwen_hf_fields, qwen_keymap, qwen_transformer_config

SDAR_KEYMAP = qwen_keymap(qkv_bias=False, qk_norm=True)  # Qwen3 names: q/k norms, no biases

# ChatML as SDAR-4B-Chat's chat_template.jinja renders it without tools or reasoning content (written
# for dllm): an optional first system turn, then every turn as <|im_start|>role\ncontent<|im_end|>\n,
# and the assistant header when add_generation_prompt. No default system prompt (unlike Dream's).
SDAR_CHAT_TEMPLATE = (
    "{%- for message in messages -%}"
    "{{ '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>\\n' }}"
    "{%- endfor -%}"
    "{%- if add_generation_prompt -%}{{ '<|im_start|>assistant\\n' }}{%- endif -%}"
)

SDAR_SPECIAL_TOKENS = {
    "eos": "<|endoftext|>", "im_start": "<|im_start|>", "im_end": "<|im_end|>", "mask": "<|MASK|>",
}

SDAR_MODEL_TYPES = ("sdar",)

_REQUIRED = ("hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads",
             "num_key_value_heads", "head_dim", "vocab_size", "rms_norm_eps", "rope_theta",
             "max_position_embeddings", "block_size")


def _check_supported(hf: Mapping[str, Any]) -> None:
    """NotImplementedError naming the first config.json field whose value dllm does not implement."""
    checks = (
        ("hidden_act", hf.get("hidden_act", "silu"), lambda v: v == "silu", '"silu"'),
        ("rope_scaling", hf.get("rope_scaling"), lambda v: v is None, "null"),
        ("use_sliding_window", hf.get("use_sliding_window", False), lambda v: not v, "false"),
        ("attention_bias", hf.get("attention_bias", False), lambda v: not v, "false"),
    )
    for name, value, ok, supported in checks:
        if not ok(value):
            raise NotImplementedError(f"SDAR config.json field {name} = {value!r} is not supported "
                                      f"(supported: {supported})")
    bs = hf["block_size"]
    if not isinstance(bs, int) or isinstance(bs, bool) or bs <= 0:
        raise ValueError(f"SDAR config.json field block_size = {bs!r} must be a positive integer "
                         "(the block the checkpoint was trained with, 4 for SDAR-*-Chat)")


class SDAR(TransformerLM):
    """SDAR: the shared transformer with q/k norms, an explicit head_dim and block-causal attention."""

    family = "sdar"
    model_types = SDAR_MODEL_TYPES
    keymap = SDAR_KEYMAP
    default_chat_template = SDAR_CHAT_TEMPLATE
    default_special = SpecialIds(mask_id=151669, eos_id=151643, pad_id=151643, eot_id=151645, bos_id=151643)

    @classmethod
    def family_config(cls, config: TransformerConfig) -> TransformerConfig:
        """SDARRMSNorm is flash-attn's ``rms_norm_fn``: the weight multiplied in float32, one rounding."""
        return dataclasses.replace(config, norm_round_once=True)

    @classmethod
    def check_config(cls, config: TransformerConfig) -> None:
        problems = []
        if not config.block_causal:
            problems.append(f"attention={config.attention!r} (SDAR is 'block_causal')")
        if not config.qk_norm:
            problems.append("qk_norm=False (SDAR normalises q and k per head)")
        if config.qkv_bias:
            problems.append("qkv_bias=True (SDAR's attention_bias is false)")
        if config.rope_fp32:
            problems.append("rope_fp32=True (SDAR applies RoPE in the activation dtype)")
        if problems:
            raise ValueError("the SDAR checkpoint format cannot express " + "; ".join(problems))

    @classmethod
    def from_hf_config(
        cls, hf: Mapping[str, Any], tokenizer: Any = None
    ) -> tuple[TransformerConfig, SpecialIds]:
        """Official config.json dict -> (TransformerConfig, SpecialIds)."""
        require_fields(hf, _REQUIRED, "SDAR")
        _check_supported(hf)
        config = qwen_transformer_config(
            hf, "SDAR",
            n_kv_heads=hf["num_key_value_heads"],
            qkv_bias=False,
            attn_head_dim=hf["head_dim"],
            qk_norm=True,
            attention="block_causal",
            block_size=hf["block_size"],
        )  # tie_word_embeddings absent: SDARConfig's default, false
        special = resolve_special(
            hf, tokenizer, defaults=cls.default_special, vocab_rows=config.vocab_size, family="SDAR",
            tokens={"mask_id": SDAR_SPECIAL_TOKENS["mask"], "eot_id": SDAR_SPECIAL_TOKENS["im_end"]},
        )
        return config, special

    @classmethod
    def to_hf_config(
        cls, config: TransformerConfig, special: SpecialIds, dtype: torch.dtype
    ) -> dict[str, Any]:
        """TransformerConfig + ids -> the fields of SDAR-4B-Chat's config.json (read by
        ``configuration_sdar.SDARConfig``; the training-only switches keep the official values)."""
        return {
            "model_type": "sdar",
            "architectures": ["SDARForCausalLM"],
            **qwen_hf_fields(config, special, dtype),
            "head_dim": config.head_dim,
            "attention_bias": False,
            "block_size": config.block_size,
            "bos_token_id": special.bos_id if special.bos_id is not None else special.eos_id,
            "fuse_cross_entropy": True,
            "use_cache": False,
        }

    @classmethod
    def to_hf_generation_config(cls, special: SpecialIds) -> dict[str, Any]:
        """The fields of SDAR-4B-Chat's generation_config.json: sampling at temperature 0.6, top-k 20,
        top-p 0.95, and both end ids (``<|im_end|>``, then ``<|endoftext|>``) as stop tokens, which
        ``generate.py`` reads as its ``stopping_criteria_idx``."""
        eos = [special.eot_id, special.eos_id] if special.eot_id not in (None, special.eos_id) else special.eos_id
        return {
            "bos_token_id": special.bos_id if special.bos_id is not None else special.eos_id,
            "do_sample": True,
            "eos_token_id": eos,
            "pad_token_id": special.pad_id,
            "temperature": 0.6,
            "top_k": 20,
            "top_p": 0.95,
        }
