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

import re
from dataclasses import dataclass
from typing import Any, ClassVar, Mapping, Optional, Union

from dllm.registry import Registry, UnknownNameError, build_config as _build_config
from dllm.state import DecodeState


@dataclass(frozen=True)
class Query:
    """One forward's query columns ``[start, end)`` and attended keys ``[0, key_end)``."""

    start: int
    end: int
    key_end: int

    @property
    def length(self) -> int:
        return self.end - self.start


@dataclass(frozen=True)
class NoOptions:
    """A cache policy without options."""


def check_refresh(refresh: Optional[int]) -> None:
    if refresh is not None and (not isinstance(refresh, int) or isinstance(refresh, bool) or refresh < 1):
        raise ValueError(f"refresh must be an integer >= 1 (a full forward every `refresh` steps of a "
                         f"block; None = only at block starts), got {refresh!r}")


def check_count(name: str, value: Any, low: int) -> None:
    if not isinstance(value, int) or isinstance(value, bool) or value < low:
        raise ValueError(f"{name} must be an integer >= {low}, got {value!r}")


class CachePolicy:
    """Base class: holds the frozen config; subclasses implement ``cached_query``."""

    name: ClassVar[str] = ""
    Config: ClassVar[type] = NoOptions
    uses_kv: ClassVar[bool] = True  # False: no buffers, every step is a plain full forward

    def __init__(self, config: Any | None = None, **options: Any) -> None:
        if config is not None and options:
            raise TypeError("pass either a Config or keyword options, not both")
        self.config = config if config is not None else build_config(self.Config, options, self.name)

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

    def variant_refusal(self) -> Optional[str]:
        """Why this policy cannot serve verification forwards (``Sampler.needs_variants``), or None.

        A verification node stands for a later step of the same block. Its forward reproduces that
        step exactly when the step would be a cached one: a copy of the buffers (as the block-start
        forward left them outside the query) and the same cached query with the node's tokens. A
        full forward in the middle of a block (``refresh``, ``warmup`` > 1) would change the buffers
        between the node and the step it stands for, so those settings are refused.
        """
        if not self.uses_kv:
            return None
        refresh = getattr(self.config, "refresh", None)
        warmup = getattr(self.config, "warmup", 0) or 0
        if refresh is not None:
            return (f"refresh={refresh} re-runs full forwards inside a block, so a verification node "
                    f"could not reproduce the step it stands for; drop refresh")
        if warmup > 1:
            return (f"warmup={warmup} runs full forwards at the first {warmup} steps of a block, so a "
                    f"verification node could not reproduce the step it stands for; use warmup <= 1")
        return None

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.config})"


def build_config(config_cls: type, options: dict[str, Any], policy: str) -> Any:
    """A cache policy's frozen config from keyword options; unknown keys list the valid ones."""
    return _build_config(config_cls, options, "cache policy", policy)


caches: Registry[type[CachePolicy]] = Registry("cache policy")


def register_cache(name: str, *, aliases: tuple[str, ...] = (), description: str | None = None):
    """Class decorator: register a ``CachePolicy`` subclass under ``name``."""

    def deco(cls: type[CachePolicy]) -> type[CachePolicy]:
        cls.name = name
        caches.add(name, cls, aliases=aliases, description=description)
        return cls

    return deco


CacheSpec = Union[str, CachePolicy, Mapping[str, Any]]

_SPEC = re.compile(r"^\s*([A-Za-z_][\w-]*)\s*(?::(.*))?$")


def _parse_value(text: str) -> Any:
    low = text.strip().lower()
    if low in ("none", "null"):
        return None
    if low in ("true", "false"):
        return low == "true"
    try:
        return int(text)
    except ValueError:
        pass
    try:
        return float(text)
    except ValueError:
        return text.strip()


def parse_cache_spec(spec: str) -> tuple[str, dict[str, Any]]:
    """``"dual:refresh=4,look_ahead=8"`` -> ``("dual", {"refresh": 4, "look_ahead": 8})``."""
    m = _SPEC.match(spec)
    if not m:
        raise ValueError(f"cannot parse cache policy {spec!r}; expected NAME or NAME:key=value,...")
    name, rest = m.group(1), m.group(2)
    options: dict[str, Any] = {}
    for item in filter(None, (p.strip() for p in (rest or "").split(","))):
        key, sep, value = item.partition("=")
        if not sep or not key.strip():
            raise ValueError(f"cannot parse cache option {item!r} in {spec!r}; expected key=value")
        options[key.strip()] = _parse_value(value)
    return name, options


def make_cache(cache: CacheSpec = "none", **options: Any) -> CachePolicy:
    """A cache policy from a name (``"dual"``), a spec string (``"dual:refresh=4"``), a mapping
    (``{"name": "dual", "refresh": 4}``) or an instance (returned as is; no options then).

    Unknown names list the valid ones; unknown options list the policy's valid options.
    """
    if isinstance(cache, CachePolicy):
        if options:
            raise TypeError(f"options {sorted(options)} were given together with a cache policy "
                            f"instance {cache!r}; set them on its Config instead")
        return cache
    if isinstance(cache, Mapping):
        spec = dict(cache)
        if "name" not in spec:
            raise ValueError(f"a cache policy mapping needs a 'name' key, got {sorted(spec)}")
        name = spec.pop("name")
        return make_cache(name, **{**spec, **options})
    if not isinstance(cache, str):
        raise TypeError(f"cache must be a policy name, a spec string, a mapping or a CachePolicy, "
                        f"got {type(cache).__name__}")
    name, parsed = parse_cache_spec(cache)
    try:
        cls = caches.get(name)
    except UnknownNameError:
        raise UnknownNameError(
            f"Unknown cache policy {name!r}. Valid cache policies: {', '.join(caches.names(aliases=True))}"
        ) from None
    return cls(**{**parsed, **options})


__all__ = ["CachePolicy", "Query", "caches", "register_cache", "make_cache", "parse_cache_spec",
           "check_refresh", "check_count"]
