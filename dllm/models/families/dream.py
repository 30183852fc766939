"""Dream (Dream-org/Dream-v0-*-7B): config.json translation, Qwen2 key names, ChatML, logit shift.

Dream is Qwen2.5 without the causal mask, so its hidden state at position i-1 predicts the token
at position i. ``Dream.forward`` shifts the logits right by one so that, as for every family,
``logits[:, i]`` predicts position i (``raw_logits`` keeps the official, unshifted logits).
The shift is applied to whatever rows a forward computes, so a cached forward over canvas columns
``[q0, q1)`` (``dllm.cache``) predicts ``[q0 + 1, q1)``: cache policies start Dream queries one
column before the first position they decide (``logit_shift = 1``).
Sources: Dream-org/Dream-v0-Instruct-7B ``config.json``, ``generation_config.json``,
``configuration_dream.py``, ``modeling_dream.py`` and ``generation_utils.py``; Dream 7B (arXiv 2508.15487).
"""

from __future__ import annotations

from typing import Any, Mapping

import torch

from dllm.models.inputs import SpecialIds, shifted_by_one
from dllm.models.core.config import TransformerConfig
from dllm.models.families.pretrained import TransformerLM, require_fields, resolve_special
from dllm.models.families.qwen import qwen_hf_fields, qwen_keymap, qwen_transformer_config

DREAM_KEYMAP = qwen_keymap(qkv_bias=True, qk_norm=False)  # Qwen2 names with q/k/v biases

DEFAULT_SYSTEM_PROMPT = "You are a helpful assistant."

# Qwen2.5 ChatML with its default system prompt, as Dream-v0-Instruct-7B's tokenizer_config.json
# renders it (written for dllm; tools omitted).
DREAM_CHAT_TEMPLATE = (
    "{%- if not messages or messages[0]['role'] != 'system' -%}"
    "{{ '<|im_start|>system\\n" + DEFAULT_SYSTEM_PROMPT + "<|im_end|>\\n' }}"
    "{%- endif -%}"
    "{%- for message in messages -%}"
    "{{ '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>\\n' }}"
    "{%- endfor -%}"
    "{%- if add_generation_prompt -%}{{ '<|im_start|>assistant\\n' }}{%- endif -%}"
)

DREAM_SPECIAL_TOKENS = {
    "eos": "<|endoftext|>", "im_start": "<|im_start|>", "im_end": "<|im_end|>", "mask": "<|mask|>",
}

_REQUIRED = ("hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads",
             "vocab_size", "rms_norm_eps", "rope_theta", "max_position_embeddings",
             "tie_word_embeddings")


def _check_supported(hf: Mapping[str, Any]) -> None:
    act = hf.get("hidden_act", "silu")
    if act != "silu":
        raise NotImplementedError(f"Dream config.json field hidden_act = {act!r} is not supported "
                                  "(supported: \"silu\")")
    if hf.get("rope_scaling") is not None:
        raise NotImplementedError(f"Dream config.json field rope_scaling = {hf['rope_scaling']!r} is "
                                  "not supported (supported: null)")
    if hf.get("use_sliding_window"):
        raise NotImplementedError("Dream config.json field use_sliding_window = true is not supported "
                                  "(supported: false)")
    head_dim = hf.get("head_dim")
    if head_dim is not None and head_dim * hf["num_attention_heads"] != hf["hidden_size"]:
        raise NotImplementedError(f"Dream config.json field head_dim = {head_dim!r} is not supported "
                                  f"(supported: hidden_size / num_attention_heads)")


class Dream(TransformerLM):
    """Dream: the shared transformer with q/k/v biases, Qwen2 key names, shifted logits."""

    family = "dream"
    model_types = ("Dream", "dream")
    keymap = DREAM_KEYMAP
    default_chat_template = DREAM_CHAT_TEMPLATE
    default_special = SpecialIds(mask_id=151666, eos_id=151643, pad_id=151643, eot_id=151645, bos_id=151643)

    @classmethod
    def check_config(cls, config: TransformerConfig) -> None:
        if not config.qkv_bias:
            raise ValueError("Dream (Qwen2) checkpoints always have q/k/v biases; got qkv_bias=False")
        if config.rope_fp32:
            raise ValueError("Dream applies RoPE in the activation dtype; got rope_fp32=True, which "
                             "its config.json cannot express")

    logit_shift = 1  # hidden state i predicts position i + 1

    def shift_logits(self, raw: torch.Tensor) -> torch.Tensor:
        """raw [B, T, V] -> shifted: [:, 0] = raw[:, 0] (never used), [:, i] = raw[:, i-1]."""
        return shifted_by_one(raw)

    @classmethod
    def from_hf_config(
        cls, hf: Mapping[str, Any], tokenizer: Any = None
    ) -> tuple[TransformerConfig, SpecialIds]:
        """Official config.json dict -> (TransformerConfig, SpecialIds)."""
        require_fields(hf, _REQUIRED, "Dream")
        _check_supported(hf)
        config = qwen_transformer_config(hf, "Dream", qkv_bias=True)
        special = resolve_special(
            hf, tokenizer, defaults=cls.default_special, vocab_rows=config.vocab_size, family="Dream",
            tokens={"mask_id": DREAM_SPECIAL_TOKENS["mask"], "eot_id": DREAM_SPECIAL_TOKENS["im_end"]},
        )
        return config, special

    @classmethod
    def to_hf_config(
        cls, config: TransformerConfig, special: SpecialIds, dtype: torch.dtype
    ) -> dict[str, Any]:
        """TransformerConfig + ids -> the fields of the official Dream config.json (those of
        Dream-org/Dream-v0-Instruct-7B, read by ``configuration_dream.DreamConfig``)."""
        return {
            "model_type": "Dream",
            "architectures": ["DreamModel"],
            **qwen_hf_fields(config, special, dtype),
            "bos_token_id": special.bos_id if special.bos_id is not None else special.eos_id,
            "use_cache": False,
        }

    @classmethod
    def to_hf_generation_config(cls, special: SpecialIds) -> dict[str, Any]:
        """The fields of Dream-org/Dream-v0-Instruct-7B's generation_config.json. The official
        ``DreamModel.from_pretrained`` (modeling_dream.py) reads it with
        ``DreamGenerationConfig.from_pretrained`` and raises without it. Values: the defaults of
        ``diffusion_generate`` (``alg "origin"``, 512 steps, eps 1e-3, temperature 0). The official
        file has ``mask_token_id: null``; this model's id is written instead, because it is read
        only as the fallback for a caller's generation config that lacks one (generation_utils.py
        ``_prepare_generation_config``), where null would leave the mask id unset."""
        return {
            "_from_model_config": True,
            "alg": "origin",
            "alg_temp": None,
            "eps": 0.001,
            "output_history": False,
            "steps": 512,
            "temperature": 0.0,
            "top_k": None,
            "top_p": None,
            "bos_token_id": special.bos_id if special.bos_id is not None else special.eos_id,
            "eos_token_id": special.eos_id,
            "pad_token_id": special.pad_id,
            "mask_token_id": special.mask_id,
        }
