"""Tiny random models of every family, for tests and offline demos.

``tiny("llada")`` / ``tiny("dream")`` / ``tiny("sdar")`` build a few-hundred-KB model with a word-level tokenizer
holding the family's special tokens, so prompts, chat templates, saving and loading all work
exactly as for the real checkpoints. Weights are random but deterministic under ``seed``, and the
LM head is drawn with a large std so greedy decoding rarely meets ties.
"""

from __future__ import annotations

import contextlib
from typing import Any, Optional, Union

import torch

from dllm.models.inputs import SpecialIds
from dllm.models.core.config import TransformerConfig
from dllm.models.families.dream import DREAM_SPECIAL_TOKENS
from dllm.models.families.init import HEAD_STD, init_weights  # noqa: F401 (re-exported)
from dllm.models.families.registry import family_class
from dllm.models.families.llada import LLADA_SPECIAL_TOKENS
from dllm.models.families.pretrained import TransformerLM
from dllm.models.loading import resolve_device, resolve_dtype
from dllm.models.families.sdar import SDAR_SPECIAL_TOKENS
from dllm.models.families.fastdllm_v2 import FASTDLLM_V2_SPECIAL_TOKENS as _FD2
from dllm.models.text.tokenizer import build_word_tokenizer, token_id, tokenizer_size

DIGITS = tuple("0123456789")
LETTERS = tuple("abcdefghijklmnopqrstuvwxyz")
COMMON_WORDS = (
    "the", "an", "and", "or", "not", "is", "are", "was", "be", "to", "of", "in", "on", "at", "for",
    "with", "from", "it", "this", "that", "what", "which", "who", "how", "why", "when", "where",
    "yes", "no", "you", "we", "they", "he", "she", "my", "your", "hello", "hi", "please", "thanks",
    "answer", "question", "number", "sum", "plus", "minus", "times", "equals", "user", "assistant",
    "system", "helpful", "good", "day",
)
PUNCTUATION = tuple(".,?!:;+-=()")
TINY_WORDS = DIGITS + LETTERS + COMMON_WORDS + PUNCTUATION

# family -> (special tokens in id order, named roles)
_SPECIALS: dict[str, tuple[tuple[str, ...], dict[str, str]]] = {
    "llada": (
        tuple(LLADA_SPECIAL_TOKENS[k] for k in ("bos", "eos", "mask", "header_start", "header_end", "eot")),
        {"bos_token": LLADA_SPECIAL_TOKENS["bos"], "eos_token": LLADA_SPECIAL_TOKENS["eos"],
         "pad_token": LLADA_SPECIAL_TOKENS["eos"], "mask_token": LLADA_SPECIAL_TOKENS["mask"]},
    ),
    "dream": (
        tuple(DREAM_SPECIAL_TOKENS[k] for k in ("eos", "im_start", "im_end", "mask")),
        {"bos_token": DREAM_SPECIAL_TOKENS["eos"], "eos_token": DREAM_SPECIAL_TOKENS["eos"],
         "pad_token": DREAM_SPECIAL_TOKENS["eos"], "mask_token": DREAM_SPECIAL_TOKENS["mask"]},
    ),
    "sdar": (
        tuple(SDAR_SPECIAL_TOKENS[k] for k in ("eos", "im_start", "im_end", "mask")),
        {"bos_token": SDAR_SPECIAL_TOKENS["eos"], "eos_token": SDAR_SPECIAL_TOKENS["eos"],
         "pad_token": SDAR_SPECIAL_TOKENS["eos"], "mask_token": SDAR_SPECIAL_TOKENS["mask"]},
    ),
    "fastdllm_v2": (
        tuple(_FD2[k] for k in ("pad", "im_start", "im_end", "mask")),
        {"bos_token": _FD2["pad"], "eos_token": _FD2["im_end"], "pad_token": _FD2["pad"], "mask_token": _FD2["mask"]},
    ),
}
_EOT_TOKEN = {"llada": LLADA_SPECIAL_TOKENS["eot"], "dream": DREAM_SPECIAL_TOKENS["im_end"],
              "sdar": SDAR_SPECIAL_TOKENS["im_end"], "fastdllm_v2": _FD2["im_end"]}

_DEFAULTS: dict[str, dict[str, Any]] = {
    "llada": dict(d_model=64, n_layers=2, n_heads=4, n_kv_heads=4, mlp_hidden=128, rope_theta=500000.0,
                  rms_eps=1e-5, max_positions=512, qkv_bias=False, tie_embeddings=False, rope_fp32=True),
    "dream": dict(d_model=64, n_layers=2, n_heads=4, n_kv_heads=2, mlp_hidden=128, rope_theta=1000000.0,
                  rms_eps=1e-6, max_positions=512, qkv_bias=True, tie_embeddings=False, rope_fp32=False),
    # Qwen3 / SDAR: head_dim 32 != 64 / 4 (as SDAR-4B's 128 != 2560 / 32), q/k norms, block 4
    "sdar": dict(d_model=64, n_layers=2, n_heads=4, n_kv_heads=2, mlp_hidden=128, rope_theta=1000000.0,
                 rms_eps=1e-6, max_positions=512, qkv_bias=False, tie_embeddings=False, rope_fp32=False,
                 attn_head_dim=32, qk_norm=True, attention="block_causal", block_size=4),
    # Fast-dLLM v2 (Qwen2.5, q/k/v biases, block-causal with the token shift): block 8, sub-blocks of 4 fit
    "fastdllm_v2": dict(d_model=64, n_layers=2, n_heads=4, n_kv_heads=2, mlp_hidden=128, rope_theta=1000000.0,
                        rms_eps=1e-6, max_positions=512, qkv_bias=True, tie_embeddings=False, rope_fp32=False,
                        attention="block_causal", block_size=8),
}
_SPECIAL_NAMES = ("mask_id", "eos_id", "pad_id", "eot_id", "bos_id")


def tiny_tokenizer(family: str) -> Any:
    """The word-level tokenizer of tiny models: unk, the family specials, digits, letters, ~50 words."""
    specials, roles = _SPECIALS[family]
    template = family_class(family).default_chat_template
    return build_word_tokenizer(TINY_WORDS, specials, chat_template=template, **roles)




def tiny(
    family: str = "llada",
    *,
    seed: int = 0,
    dtype: Union[torch.dtype, str] = torch.float32,
    tokenizer: bool = True,
    attn_backend: str = "auto",
    device: Optional[Union[str, torch.device]] = None,
    **overrides: Any,
) -> TransformerLM:
    """A small random model of ``family`` ("llada" | "dream" | "sdar").

    dtype: a floating torch dtype or its name ("bfloat16", "fp16", ...), as ``dllm.load`` takes it
    (a ValueError listing the valid ones otherwise).

    device: build and initialise the weights there (None: the CPU; one this process does not have is
    a ValueError listing those it has). A large random model (the benchmarks' LLaDA-8B width) is then
    made on the GPU in seconds instead of drawn on one CPU thread and copied; its values come from
    that device's generator.

    overrides: TransformerConfig fields (d_model, n_layers, vocab_size, ...) or special ids
    (mask_id, eos_id, pad_id, eot_id, bos_id). Without overrides the special ids are the tiny
    tokenizer's and vocab_size is its size rounded up to a multiple of 8. "llada2" (MoE, no tokenizer):
    ``dllm.models.families.llada2.tiny_llada2`` (overrides: TransformerConfig fields, or ``moe=MoEConfig``).
    """
    cls = family_class(family)
    dtype = resolve_dtype(dtype, {}, None)
    device = resolve_device(device)  # a ValueError listing the devices this process has
    if family == "llada2":
        from dllm.models.families.llada2 import tiny_llada2

        if device is not None and device.type != "cpu":
            raise ValueError(f"tiny('llada2') builds on the CPU only (move it with .to()), "
                             f"got device={str(device)!r}")

        return tiny_llada2(seed, dtype=dtype, attn_backend=attn_backend, **overrides)
    valid = set(TransformerConfig.field_names()) | set(_SPECIAL_NAMES)
    unknown = sorted(set(overrides) - valid)
    if unknown:
        raise ValueError(f"tiny(): unknown override(s) {unknown}; valid: {', '.join(sorted(valid))}")
    tok = tiny_tokenizer(family)
    n_tokens = tokenizer_size(tok)
    ids = {
        "mask_id": tok.mask_token_id, "eos_id": tok.eos_token_id, "pad_id": tok.pad_token_id,
        "eot_id": token_id(tok, _EOT_TOKEN[family]), "bos_id": tok.bos_token_id,
    }
    ids.update({k: v for k, v in overrides.items() if k in _SPECIAL_NAMES})
    fields = dict(_DEFAULTS[family], vocab_size=-(-n_tokens // 8) * 8)
    fields.update({k: v for k, v in overrides.items() if k not in _SPECIAL_NAMES})
    config = TransformerConfig(**fields)
    if tokenizer and config.vocab_size < n_tokens:
        raise ValueError(f"tiny(): vocab_size {config.vocab_size} is smaller than the tiny tokenizer "
                         f"({n_tokens} tokens); pass tokenizer=False or a larger vocab_size")
    special = SpecialIds(**ids)
    with torch.device(device) if device is not None else contextlib.nullcontext():  # every parameter made there
        model = cls(config, special, tokenizer=tok if tokenizer else None, attn_backend=attn_backend)
    init_weights(model, seed)
    model.to(dtype)
    model.hf_config = model.to_hf_config(config, special, dtype)
    return model.eval()
