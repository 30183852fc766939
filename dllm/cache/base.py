"""The cache-policy protocol, the registry, and ``make_cache``.

A cache policy decides, for every step of a block, which canvas columns one forward recomputes
(the queries) and which keys/values it reuses from the buffers of the call (``kv.py``). It is a
small class with a frozen ``Config`` (its options), registered by name, and holds no per-call
state: the buffers live on the ``DecodeState`` (``state.kv``), so one instance can serve many
``generate`` calls.

Per step the engine asks ``policy.query(state, block_step, shift)`` for a ``Query``:

- ``start, end``: the forward's query rows are canvas columns ``[start, end)``; the sampler
  sees logits for exactly these rows (``StepInput.query_start = start``);
- ``key_end``: the queries attend to buffer rows ``[0, key_end)`` (columns beyond are pruned).

``Query(0, L, L)`` is a full forward: it refreshes every buffer row and its logits are exactly those
of ``cache="none"``. ``shift`` is the model's ``logit_shift`` (Dream: 1): a query that must
predict column s starts at ``s - shift``.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, ClassVar, Mapping, Optional, Union

import torch

from dllm.models.core.kv import canvas_columns
from dllm.options import check_optional_int
from dllm.registry import Configurable, NoOptions, Registry
from dllm.state import DecodeState


@dataclass(frozen=True)
class Query:
    """One forward's query columns ``[start, end)`` and attended keys ``[0, key_end)``; ``extra``
    [n] (sorted canvas columns left of ``start``, a long tensor on the canvas device) are recomputed
    too: their rows come first in the forward, their logits are dropped (``dllm.cache.drift``)."""

    start: int
    end: int
    key_end: int
    extra: Optional[torch.Tensor] = field(default=None, compare=False)

    @property
    def n_extra(self) -> int:
        return 0 if self.extra is None else int(self.extra.numel())  # metadata, no device sync

    @property
    def length(self) -> int:
        return self.end - self.start + self.n_extra

    def columns(self) -> Union[slice, torch.Tensor]:
        """What ``x[:, ...]`` takes to get the forward's input columns (extra ones first)."""
        return canvas_columns(self.start, self.end, self.extra)

    def head_rows(self, rows: Optional[tuple[int, int]]) -> Optional[tuple[int, int]]:
        """Logits rows ``(a, b)`` of ``[start, end)`` -> rows of the forward (past the extra ones);
        None = every contiguous row (None again when there are no extra rows)."""
        n = self.n_extra
        if rows is None:
            return (n, n + self.end - self.start) if n else None
        return rows[0] + n, rows[1] + n


def check_refresh(refresh: Optional[int]) -> None:
    check_optional_int("refresh", refresh, 1, hint=" (a full forward every `refresh` steps of a block; "
                       "None = only at block starts)")


class CachePolicy(Configurable):
    """Base class: holds the frozen config; subclasses implement ``cached_query``."""

    kind: ClassVar[str] = "cache policy"
    Config: ClassVar[type] = NoOptions
    uses_kv: ClassVar[bool] = True  # False: no buffers, every step is a plain full forward

    # ---- per call ----------------------------------------------------------------------------------
    def check(self, model, *, block_length: int, gen_length: int) -> None:
        """ValueError when the policy cannot serve this call (called before anything runs)."""

    def allocate(self, model, rows: int, length: int):
        """The call's K/V buffers (None for a policy without them)."""
        if not self.uses_kv:
            return None
        return model.new_kv_cache(rows, length)

    # ---- per step ----------------------------------------------------------------------------------
    def is_refresh(self, block_step: int) -> bool:
        """Full forward at this step of the block? Block starts always; then every ``refresh`` steps
        and during the first ``warmup`` steps when the config has those fields."""
        refresh = getattr(self.config, "refresh", None)
        warmup = getattr(self.config, "warmup", 0) or 0
        if block_step == 0 or block_step < warmup:
            return True
        return refresh is not None and block_step % refresh == 0

    def query(self, state: DecodeState, block_step: int, shift: int) -> Query:
        length = state.x.shape[1]
        if not self.uses_kv or self.is_refresh(block_step):
            return Query(0, length, length)
        return self.cached_query(state, shift)

    def cached_query(self, state: DecodeState, shift: int) -> Query:
        """Query of a step that reuses the buffers (block ``[state.block_start, state.block_end)``).
        It depends on the block only, never on the step inside it (verification forwards rely on it)."""
        raise NotImplementedError

    def sampler_refusal(self, sampler) -> Optional[str]:
        """Why this policy cannot serve ``sampler`` (a sentence after the sampler's name), or None."""
        refusal = self.variant_refusal() if sampler.needs_variants else None
        if refusal is None:
            return None
        return (f"verifies modified copies of the canvas in extra forwards, which cache policy "
                f"{self.name!r} cannot serve with these options: {refusal}")

    def variant_refusal(self) -> Optional[str]:
        """Why this policy cannot serve verification forwards (``Sampler.needs_variants``), or None.

        A verification variant stands for a later step of the same block. Its forward reproduces that
        step exactly when the step would be a cached one: a copy of the buffers (as the block-start
        forward left them outside the query) and the same cached query with the variant's tokens. A
        full forward in the middle of a block (``refresh``, ``warmup`` > 1) would change the buffers
        between the variant and the step it stands for, so those settings are refused.
        """
        if not self.uses_kv:
            return None
        refresh = getattr(self.config, "refresh", None)
        warmup = getattr(self.config, "warmup", 0) or 0
        if refresh is not None:
            return (f"refresh={refresh} re-runs full forwards inside a block, so a verification variant "
                    f"could not reproduce the step it stands for; drop refresh")
        if warmup > 1:
            return (f"warmup={warmup} runs full forwards at the first {warmup} steps of a block, so a "
                    f"verification variant could not reproduce the step it stands for; use warmup <= 1")
        return None

caches: Registry[type[CachePolicy]] = Registry("cache policy", base=CachePolicy, plural="cache policies")
register_cache = caches.register_class  # class decorator: @register_cache("name", aliases=...)

CacheSpec = Union[str, CachePolicy, Mapping[str, Any]]


def make_cache(cache: CacheSpec = "none", **options: Any) -> CachePolicy:
    """A cache policy from a name (``"dual"``), a spec string (``"dual:refresh=4"``), a mapping
    (``{"name": "dual", "refresh": 4}``) or an instance (returned as is; no options then).

    Unknown names list the valid ones; unknown options list the policy's valid options.
    """
    return caches.make(cache, **options)


__all__ = ["CachePolicy", "CacheSpec", "Query", "caches", "check_refresh", "make_cache", "register_cache"]
