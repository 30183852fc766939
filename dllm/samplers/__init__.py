"""Samplers: every parallel-decoding rule is a registered class (see ``base.py``).

Importing this package registers the built-in samplers.
"""

from dllm.samplers.base import Sampler, make_sampler, register_sampler, samplers
from dllm.samplers import llada as _llada  # noqa: F401  (registration side effect)
from dllm.samplers import dream as _dream  # noqa: F401
from dllm.samplers import fast_dllm as _fast_dllm  # noqa: F401


def list_samplers() -> list[tuple[str, str]]:
    """(name, one-line description) of every registered sampler, aliases noted."""
    rows = []
    for entry in samplers:
        desc = entry.description
        if entry.aliases:
            desc += f" (aliases: {', '.join(entry.aliases)})"
        rows.append((entry.name, desc))
    return rows


__all__ = ["Sampler", "make_sampler", "register_sampler", "samplers", "list_samplers"]
