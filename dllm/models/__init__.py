"""Models: the DiffusionLM interface, one shared transformer, LLaDA, Dream and SDAR checkpoint formats,
loading (embedded name, local directory or Hub id) and tiny random models.

>>> from dllm.models import load, tiny
>>> model = load("tiny-random-llada")          # shipped with the package, works offline
>>> out = model(ids, key_padding_mask=real)     # out.logits[:, i] predicts position i
"""

from dllm.models.base import DiffusionLM, ModelOutput, SpecialIds
from dllm.models.checkpoint import CheckpointError
from dllm.models.compile import compile_model, uncompile_model
from dllm.models.config import TransformerConfig
from dllm.models.dream import Dream
from dllm.models.llada import LLaDA
from dllm.models.loading import ModelNotFoundError, embedded_names, load
from dllm.models.pretrained import TransformerLM
from dllm.models.sdar import SDAR
from dllm.models.tiny import tiny

__all__ = [
    "CheckpointError",
    "DiffusionLM",
    "Dream",
    "LLaDA",
    "ModelNotFoundError",
    "ModelOutput",
    "SDAR",
    "SpecialIds",
    "TransformerConfig",
    "TransformerLM",
    "compile_model",
    "embedded_names",
    "load",
    "tiny",
    "uncompile_model",
]
