"""One small generic registry, used for samplers, cache policies, attention backends and tasks.

Entries are registered with a decorator under a canonical name plus optional aliases. Every
lookup failure is a ``KeyError`` subclass whose message lists the valid names, so a typo on the
command line or in ``generate(sampler=...)`` tells the user what they could have typed.
"""

from __future__ import annotations

import dataclasses
import fnmatch
import warnings
from dataclasses import dataclass
from typing import Any, Callable, Generic, Iterator, TypeVar

T = TypeVar("T")


class UnknownNameError(KeyError, ValueError):
    """Raised when a name is not in a registry; the message lists the valid names."""

    def __str__(self) -> str:  # KeyError would quote the message
        return str(self.args[0])


@dataclass(frozen=True)
class Entry(Generic[T]):
    name: str
    obj: T
    aliases: tuple[str, ...]
    description: str


class Registry(Generic[T]):
    """A name -> object table with aliases.

    >>> samplers = Registry("sampler")
    >>> @samplers.register("greedy", aliases=("g",), description="one token per step")
    ... class Greedy: ...
    >>> samplers.get("g") is Greedy
    True
    """

    def __init__(self, kind: str) -> None:
        self.kind = kind
        self._entries: dict[str, Entry[T]] = {}  # canonical name -> entry
        self._aliases: dict[str, str] = {}  # alias -> canonical name

    def register(
        self, name: str, *, aliases: tuple[str, ...] = (), description: str | None = None
    ) -> Callable[[T], T]:
        def deco(obj: T) -> T:
            self.add(name, obj, aliases=aliases, description=description)
            return obj

        return deco

    def add(
        self, name: str, obj: T, *, aliases: tuple[str, ...] = (), description: str | None = None
    ) -> None:
        if name in self._entries or name in self._aliases:
            warnings.warn(f"{self.kind} {name!r} is registered again; the new entry replaces it")
            self._aliases.pop(name, None)
        if description is None:
            doc = (getattr(obj, "__doc__", None) or "").strip()
            description = doc.splitlines()[0] if doc else ""
        self._entries[name] = Entry(name, obj, tuple(aliases), description)
        for alias in aliases:
            self._aliases[alias] = name

    def set_alias(self, alias: str, name: str) -> None:
        """Point ``alias`` at an existing entry (used for choices made by measurement)."""
        canonical = self.canonical(name)
        self._aliases[alias] = canonical

    def canonical(self, name: str) -> str:
        if name in self._entries:
            return name
        if name in self._aliases:
            return self._aliases[name]
        raise UnknownNameError(
            f"Unknown {self.kind} {name!r}. Valid {self.kind}s: {', '.join(self.names(aliases=True))}"
        )

    def get(self, name: str) -> T:
        return self._entries[self.canonical(name)].obj

    def entry(self, name: str) -> Entry[T]:
        return self._entries[self.canonical(name)]

    def names(self, pattern: str = "*", *, aliases: bool = False) -> list[str]:
        found = [n for n in self._entries if fnmatch.fnmatch(n, pattern)]
        if aliases:
            found += [a for a in self._aliases if fnmatch.fnmatch(a, pattern)]
        return sorted(found)

    def __contains__(self, name: object) -> bool:
        return name in self._entries or name in self._aliases

    def __iter__(self) -> Iterator[Entry[T]]:
        return iter(self._entries[n] for n in sorted(self._entries))

    def __len__(self) -> int:
        return len(self._entries)


def build_config(config_cls: type, options: dict[str, Any], kind: str, name: str) -> Any:
    """A registered entry's frozen config from keyword options; unknown keys list the valid ones.

    ``kind``/``name`` say whose options they are in the message (e.g. "sampler", "threshold").
    """
    valid = [f.name for f in dataclasses.fields(config_cls)]
    unknown = sorted(set(options) - set(valid))
    if unknown:
        raise TypeError(
            f"Unknown option(s) {', '.join(repr(u) for u in unknown)} for {kind} {name!r}. "
            f"Valid options: {', '.join(valid) if valid else '(none)'}"
        )
    return config_cls(**options)
