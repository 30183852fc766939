"""Cache policies: what each step recomputes and which keys/values it reuses.

``none`` (exact), ``prefix`` and ``dual`` (Fast-dLLM; ``dual`` with dInfer's vicinity options),
``block`` (exact for block-causal models such as SDAR: finished blocks' K/V kept), ``subblock``
(Fast-dLLM v2's sub-block cache on top of it, approximate),
``window`` (Window-Diffusion style far-field pruning), ``drift`` (a dual cache whose recomputed window
follows the measured key drift). Choose one with
``dllm.generate(..., cache=...)``, which takes a name (``"dual"``), a spec string
(``"dual:refresh=4"``), a mapping (``{"name": "dual", "refresh": 4}``) or an instance
(``DualCache(refresh=4)``). Importing this package registers the built-in policies.
"""

from dllm.cache.base import CachePolicy, Query, caches, make_cache, register_cache
from dllm.models.core.kv import CacheView, KVCache
from dllm.cache.none import NoCache
from dllm.cache.prefix_dual import DualCache, PrefixCache
from dllm.cache.window import WindowCache
from dllm.cache.drift import DriftCache
from dllm.cache.block_causal import BlockCausalCache
from dllm.cache.subblock import SubBlockCache
from dllm.cache.auto import CHOICE as AUTO_CHOICE  # registers ``auto`` when a choice exists


def list_caches() -> list[tuple[str, str]]:
    """(name, one-line description) of every registered cache policy, aliases noted."""
    return caches.describe()


__all__ = ["AUTO_CHOICE", "BlockCausalCache", "CachePolicy", "CacheView", "DriftCache", "DualCache", "KVCache", "NoCache", "PrefixCache", "Query", "SubBlockCache",
           "WindowCache", "caches", "list_caches", "make_cache", "register_cache"]
