"""Fast-dLLM v2 (Efficient-Large-Model/Fast_dLLM_v2_7B): config.json translation, Qwen2 key names,
block-causal attention with Dream's token shift.

Fast-dLLM v2 (arXiv 2509.26328) is Qwen2.5 (q/k/v biases, RMSNorm, SwiGLU, RoPE applied in the
activation dtype) fine-tuned as a block-diffusion model: at inference, attention is bidirectional
inside a block of ``bd_size`` positions and causal across blocks (the HF ``modeling.py``
``eval_block_diff_mask``: ``q // bs >= k // bs`` on absolute positions), which is the shared
transformer's ``attention = "block_causal"`` with ``block_size = bd_size``. Like Dream it keeps the
autoregressive token shift: the hidden state at position i-1 predicts the token at i (``generate``
rolls the block's logits right by one), so ``logit_shift = 1`` here too and ``logits[:, i]``
predicts position i. At a block start the prediction comes from the previous block's last position,
which attends block-causally to complete blocks only: the official loop's greedy "next token" after
each finished block.

Sources: the HF folder Efficient-Large-Model/Fast_dLLM_v2_7B ``config.json``, ``configuration.py``
(``Fast_dLLM_QwenConfig``), ``modeling.py`` (``Fast_dLLM_QwenForCausalLM``), ``generation_config.json``,
``special_tokens_map.json``, ``added_tokens.json``; NVlabs/Fast-dLLM ``v2/generation_functions.py``.
The official model is loaded here without ``trust_remote_code``; tests/models/families/test_fastdllm_v2.py
checks the logits against a transcription of ``modeling.py`` (tests/reference/modelling/fastdllm_v2_modeling.py).
Decoding: ``sampler="fastdllm_v2"`` (``dllm/samplers/fastdllm_v2.py``).
"""

from __future__ import annotations

from typing import Any, Mapping

import torch

from dllm.models.inputs import SpecialIds, shifted_by_one
from dllm.models.core.config import TransformerConfig
from dllm.models.families.dream import DREAM_CHAT_TEMPLATE
from dllm.models.families.pretrained import TransformerLM, require_fields, resolve_special
from dllm.models.families.qwen import qwen_hf_fields, qwen_keymap, qwen_transformer_config

FASTDLLM_V2_KEYMAP = qwen_keymap(qkv_bias=True, qk_norm=False)  # Qwen2 names with q/k/v biases, as Dream's

FASTDLLM_V2_SPECIAL_TOKENS = {
    "pad": "<|endoftext|>", "im_start": "<|im_start|>", "im_end": "<|im_end|>", "mask": "|<MASK>|",
}

FASTDLLM_V2_MODEL_TYPES = ("Fast_dLLM_Qwen",)

_REQUIRED = ("hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads",
             "vocab_size", "rms_norm_eps", "rope_theta", "max_position_embeddings", "bd_size")


def _check_supported(hf: Mapping[str, Any]) -> None:
    """NotImplementedError naming the first config.json field whose value dllm does not implement;
    ValueError for a malformed ``bd_size``."""
    layer_types = hf.get("layer_types") or []
    odd = sorted({t for t in layer_types if t != "full_attention"})
    checks = (
        ("hidden_act", hf.get("hidden_act", "silu"), hf.get("hidden_act", "silu") == "silu", '"silu"'),
        ("rope_scaling", hf.get("rope_scaling"), hf.get("rope_scaling") is None, "null"),
        ("use_sliding_window", hf.get("use_sliding_window", False), not hf.get("use_sliding_window", False),
         "false"),
        ("layer_types", odd, not odd, 'only "full_attention"'),
    )
    for name, value, ok, supported in checks:
        if not ok:
            raise NotImplementedError(f"Fast-dLLM v2 config.json field {name} = {value!r} is not supported "
                                      f"(supported: {supported})")
    bs = hf["bd_size"]
    if not isinstance(bs, int) or isinstance(bs, bool) or bs <= 0:
        raise ValueError(f"Fast-dLLM v2 config.json field bd_size = {bs!r} must be a positive integer "
                         "(the block the checkpoint was trained with, 32 for Fast_dLLM_v2_7B)")
    if layer_types and len(layer_types) != hf["num_hidden_layers"]:
        raise ValueError(f"Fast-dLLM v2 config.json field layer_types has {len(layer_types)} entries for "
                         f"num_hidden_layers = {hf['num_hidden_layers']}")


class FastDLLMv2(TransformerLM):
    """Fast-dLLM v2: the shared transformer with q/k/v biases, block-causal attention (block
    ``bd_size``) and the one-position logit shift."""

    family = "fastdllm_v2"
    model_types = FASTDLLM_V2_MODEL_TYPES
    keymap = FASTDLLM_V2_KEYMAP
    default_chat_template = DREAM_CHAT_TEMPLATE  # Qwen2.5 ChatML with its default system prompt
    default_special = SpecialIds(mask_id=151665, eos_id=151645, pad_id=151643, eot_id=151645, bos_id=151643)

    logit_shift = 1  # hidden state i predicts position i + 1 (the token shift)

    def shift_logits(self, raw: torch.Tensor) -> torch.Tensor:
        """raw [B, T, V] -> shifted: [:, 0] = raw[:, 0] (never used), [:, i] = raw[:, i-1]."""
        return shifted_by_one(raw)

    @classmethod
    def check_config(cls, config: TransformerConfig) -> None:
        problems = []
        if not config.block_causal:
            problems.append(f"attention={config.attention!r} (Fast-dLLM v2 is 'block_causal')")
        if not config.qkv_bias:
            problems.append("qkv_bias=False (Qwen2 q/k/v projections always carry biases)")
        if config.qk_norm:
            problems.append("qk_norm=True (Qwen2 has no q/k norms)")
        if config.rope_fp32:
            problems.append("rope_fp32=True (Qwen2 applies RoPE in the activation dtype)")
        if config.rope_dim is not None:
            problems.append(f"rope_dim={config.rope_dim} (RoPE rotates every channel)")
        if problems:
            raise ValueError("the Fast-dLLM v2 checkpoint format cannot express " + "; ".join(problems))

    @classmethod
    def from_hf_config(
        cls, hf: Mapping[str, Any], tokenizer: Any = None
    ) -> tuple[TransformerConfig, SpecialIds]:
        """Official config.json dict -> (TransformerConfig, SpecialIds). ``head_dim`` (absent in the
        released config) is read as ``Fast_dLLM_QwenAttention`` reads it: hidden_size / heads unless given."""
        require_fields(hf, _REQUIRED, "Fast-dLLM v2")
        _check_supported(hf)
        head_dim = hf.get("head_dim")
        config = qwen_transformer_config(
            hf, "Fast-dLLM v2",
            qkv_bias=True,
            attn_head_dim=None if head_dim is None or head_dim * hf["num_attention_heads"] == hf["hidden_size"]
            else head_dim,
            attention="block_causal",
            block_size=hf["bd_size"],
        )  # tie_word_embeddings absent: Fast_dLLM_QwenConfig's default, false
        special = resolve_special(
            hf, tokenizer, defaults=cls.default_special, vocab_rows=config.vocab_size, family="Fast-dLLM v2",
            tokens={"mask_id": FASTDLLM_V2_SPECIAL_TOKENS["mask"], "eot_id": FASTDLLM_V2_SPECIAL_TOKENS["im_end"]},
        )
        return config, special

    @classmethod
    def to_hf_config(
        cls, config: TransformerConfig, special: SpecialIds, dtype: torch.dtype
    ) -> dict[str, Any]:
        """TransformerConfig + ids -> the fields of Fast_dLLM_v2_7B's config.json (read by
        ``configuration.Fast_dLLM_QwenConfig``). ``auto_map`` is left out: it names the remote-code
        files ``configuration.py`` / ``modeling.py``, which dllm does not ship; ``mask_token_id`` is
        added (the official ``generate`` takes the mask id as an argument, default 151665)."""
        return {
            "model_type": "Fast_dLLM_Qwen",
            "architectures": ["Fast_dLLM_QwenForCausalLM"],
            **qwen_hf_fields(config, special, dtype),
            **({"head_dim": config.attn_head_dim} if config.attn_head_dim is not None else {}),
            "layer_types": ["full_attention"] * config.n_layers,
            "bd_size": config.block_size,
            "bos_token_id": special.bos_id if special.bos_id is not None else special.pad_id,
            "use_cache": True,
        }

    @classmethod
    def to_hf_generation_config(cls, special: SpecialIds) -> dict[str, Any]:
        """The fields of Fast_dLLM_v2_7B's generation_config.json (Qwen2.5-Instruct's sampling
        defaults; both end ids, ``<|im_end|>`` first). The official ``generate`` reads none of them."""
        eos = [special.eot_id, special.pad_id] if special.pad_id not in (None, special.eot_id) else special.eot_id
        return {
            "bos_token_id": special.bos_id if special.bos_id is not None else special.pad_id,
            "do_sample": True,
            "eos_token_id": eos,
            "pad_token_id": special.pad_id,
            "repetition_penalty": 1.05,
            "temperature": 0.7,
            "top_k": 20,
            "top_p": 0.8,
        }
