"""``none``: no cache; every step is a full forward over the whole canvas (exact decoding)."""

from __future__ import annotations

from dllm.cache.base import CachePolicy, register_cache


@register_cache("none")
class NoCache(CachePolicy):
    """Recompute every position at every step (exact; cost L queries per step)."""

    uses_kv = False
