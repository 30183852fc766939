"""Models: the DiffusionLM interface, one shared transformer, LLaDA, Dream and SDAR checkpoint formats,
loading (embedded name, local directory or Hub id) and tiny random models.

Layout: ``base.py`` (DiffusionLM), ``loading.py`` (``load``), ``targets.py`` (``load_target``: AR targets),
``checkpoint.py`` (safetensors files), ``quantize.py``, ``tiny.py`` / ``make_embedded.py`` (tiny random
models and the shipped checkpoints in ``embedded/``), ``oracle.py``; ``text/`` (tokenizers, the task
tokenizer, chat templates and prompt ids), ``core/`` (the shared transformer, its norms, RoPE, fused weights, K/V buffers, MoE, WINO's shadow block,
padding-free forwards, ``torch.compile``) and ``families/`` (``TransformerLM``, key maps, one module per
checkpoint family, the family registry).

>>> from dllm.models import load, tiny
>>> model = load("tiny-random-llada")          # shipped with the package, works offline
>>> out = model(ids, key_padding_mask=real)     # out.logits[:, i] predicts position i
"""

from dllm.models.base import DiffusionLM
from dllm.models.inputs import ModelOutput, SpecialIds
from dllm.models.checkpoint import CheckpointError
from dllm.models.core.compile import compile_model, uncompile_model
from dllm.models.core.config import TransformerConfig
from dllm.models.families.dream import Dream
from dllm.models.families.llada import LLaDA
from dllm.models.loading import ModelNotFoundError, embedded_names, load
from dllm.models.families.pretrained import TransformerLM
from dllm.models.families.sdar import SDAR
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
