"""``auto``: the recommended cache policy, a registered preset chosen by measurement.

Like the ``fast`` sampler, ``auto`` is an existing policy with chosen option defaults (``CHOICE``),
registered under its own name, so ``dllm.generate(model, prompt, sampler="fast", cache="auto")``
needs no options; options given by the caller override the preset's.

The choice follows the rule of ``dllm.eval.bench.choose.cache``: with the ``fast`` sampler, accuracy within
1 point of ``cache="none"`` on the short suite (PB-mini, both PB-mini models) and on the long-prompt
suite (both long-prompt models), each suite on enough examples that one weighs at most half a point,
and at least 3x the wall-clock speed of ``none`` at prompt 1,024 + 256 generated; the fastest candidate
that passes wins. When no candidate passes, ``CHOICE`` is None and ``auto`` is not registered (asking
for it lists the valid policies). The measured choice is in docs/results/caches.md ("Why ``auto``
is what it is"). Re-run the choice when the embedded models change:

    dllm bench choose-cache --threads 2 --repeats 3
"""

from __future__ import annotations

from typing import Any, Optional

from dllm.cache.base import CachePolicy, caches, register_cache
from dllm.registry import format_spec, preset_class

CHOICE: Optional[tuple[str, dict[str, Any]]] = ("dual", {"look_back": 16, "look_ahead": 16})  # or None


def register_auto(choice: Optional[tuple[str, dict[str, Any]]] = CHOICE) -> Optional[type[CachePolicy]]:
    """Register ``auto`` as ``choice`` (None: nothing is registered)."""
    if choice is None:
        return None
    base_name, defaults = choice
    spec = format_spec(base_name, defaults)
    cls = preset_class(caches, "auto", base_name, defaults, f"Recommended cache policy: {spec}, chosen by measurement.")
    description = f"the recommended cache policy = {spec}, chosen by measurement (dllm bench choose-cache)"
    return register_cache("auto", description=description)(cls)


Auto = register_auto()
