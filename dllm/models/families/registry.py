"""The checkpoint families dllm can load, by family name and by config.json ``model_type``."""

from __future__ import annotations

from dllm.models.families.dream import Dream
from dllm.models.families.fastdllm_v2 import FastDLLMv2
from dllm.models.families.llada import LLaDA
from dllm.models.families.llada2 import LLaDA2
from dllm.models.families.pretrained import TransformerLM
from dllm.models.families.sdar import SDAR

FAMILIES: dict[str, type[TransformerLM]] = {"llada": LLaDA, "dream": Dream, "sdar": SDAR, "llada2": LLaDA2,
                                        "fastdllm_v2": FastDLLMv2}

MODEL_TYPES: dict[str, type[TransformerLM]] = {
    model_type: cls for cls in FAMILIES.values() for model_type in cls.model_types
}


def family_class(family: str) -> type[TransformerLM]:
    """Family name ("llada" | "dream" | "sdar" | "llada2" | "fastdllm_v2") -> its model class."""
    if family not in FAMILIES:
        raise ValueError(f"unknown model family {family!r}; valid families: {', '.join(FAMILIES)}")
    return FAMILIES[family]


def _causal_hint(model_type: object) -> str:
    """A pointer for an autoregressive checkpoint (a model type transformers' ``AutoModelForCausalLM``
    loads) given where a diffusion model is wanted: it is a speculative-decoding target."""
    try:
        from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING_NAMES as causal
    except ImportError:  # pragma: no cover - the mapping moved: no hint, the error stands
        return ""
    if not isinstance(model_type, str) or model_type not in causal:
        return ""
    return (f" ({model_type!r} is an autoregressive model: it is a speculative-decoding target, "
            f"dllm.speculative_generate / `dllm spec --target`)")


def class_for_model_type(model_type: object) -> type[TransformerLM]:
    """config.json ``model_type`` -> model class; ValueError naming the type and the valid ones."""
    if not isinstance(model_type, str) or model_type not in MODEL_TYPES:
        raise ValueError(f"unsupported model_type {model_type!r} in config.json; supported model "
                         f"types: {', '.join(sorted(MODEL_TYPES))}{_causal_hint(model_type)}")
    return MODEL_TYPES[model_type]
