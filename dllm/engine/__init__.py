"""The decode engine: ``generate`` and its block loop (``dllm.engine.loop``), the three kinds of
forward a step runs (``dllm.engine.forwards``: plain, with a shadow block, verification variants) and
the cached forwards captured as CUDA graphs (``dllm.engine.graphs``)."""

from dllm.engine.loop import Decode, generate

__all__ = ["Decode", "generate"]
