"""dllm: fast decoding for masked diffusion language models.

Public API (imported lazily so ``import dllm`` stays cheap):
``load``, ``generate``, ``compile_model`` / ``uncompile_model`` (torch.compile of the layers), ``list_samplers``, ``list_caches``, ``GenerationOutput``; speculative decoding of
autoregressive targets: ``speculative_generate``, ``load_target``, ``make_drafter``, ``list_drafters``,
``SpeculativeOutput``, ``list_tree_builders`` (draft trees: ``speculative_generate(..., plan=Plan(tree=...))``).
"""

from __future__ import annotations

from dllm.lazy import lazy_exports

__version__ = "0.1.0"

_LAZY = {
    "load": ("dllm.models", "load"),
    "generate": ("dllm.engine", "generate"),
    "compile_model": ("dllm.models.core.compile", "compile_model"),
    "uncompile_model": ("dllm.models.core.compile", "uncompile_model"),
    "list_samplers": ("dllm.samplers", "list_samplers"),
    "list_caches": ("dllm.cache", "list_caches"),
    "GenerationOutput": ("dllm.state", "GenerationOutput"),
    "speculative_generate": ("dllm.drafters.loop", "speculative_generate"),
    "load_target": ("dllm.models.targets", "load_target"),
    "make_drafter": ("dllm.drafters.base", "make_drafter"),
    "list_drafters": ("dllm.drafters.base", "list_drafters"),
    "SpeculativeOutput": ("dllm.drafters.output", "SpeculativeOutput"),
    "list_tree_builders": ("dllm.drafters.trees.builders", "list_tree_builders"),
}


__getattr__, __dir__ = lazy_exports(__name__, _LAZY)

__all__ = list(_LAZY)
