"""One small generic registry (samplers, cache policies, attention backends, tasks, recipes), the
one spec grammar, and the base of every configurable registered class.

- ``Registry``: entries registered with a decorator under a canonical name plus optional aliases.
  Every lookup failure is a ``KeyError`` subclass whose message lists the valid names, so a typo on
  the command line or in ``generate(sampler=...)`` tells the user what they could have typed.
- The spec grammar ``"name:key=value,..."`` (``parse_spec`` / ``format_spec``), the same for
  samplers (``"threshold:threshold=0.8"``), cache policies (``"dual:refresh=4"``), the comparison,
  the benchmarks and the command line. Values: ``none``/``null`` -> None, ``true``/``false`` ->
  bool, then int, then float (``inf`` included), else the text itself.
- ``Configurable``: a class with a frozen ``Config`` dataclass of options, built from keyword
  options (unknown keys list the valid ones). ``Registry.make`` builds a registered one from a
  name, a spec string, a mapping with a ``"name"`` key, or takes an instance as it is.
"""

from __future__ import annotations

import dataclasses
import fnmatch
import re
import warnings
from dataclasses import dataclass
from typing import Any, Callable, ClassVar, Generic, Iterator, Mapping, Optional, TypeVar

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

    def __init__(self, kind: str, base: Optional[type] = None, plural: Optional[str] = None) -> None:
        self.kind = kind
        self.plural = plural or kind + "s"
        self.base = base  # for registries of Configurable classes: the class ``make`` accepts instances of
        self._entries: dict[str, Entry[T]] = {}  # canonical name -> entry
        self._aliases: dict[str, str] = {}  # alias -> canonical name
        self.version = 0  # counts ``add`` calls: what is derived from the entries is stale once it moves

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
        self.version += 1

    def register_class(
        self, name: str, *, aliases: tuple[str, ...] = (), description: str | None = None
    ) -> Callable[[T], T]:
        """Class decorator for ``Configurable`` subclasses: sets ``cls.name`` and registers it."""

        def deco(cls: T) -> T:
            cls.name = name  # type: ignore[attr-defined]
            self.add(name, cls, aliases=aliases, description=description)
            return cls

        return deco

    def make(self, spec: Any, **options: Any) -> Any:
        """An instance of a registered ``Configurable`` class from a name (``"dual"``), a spec string
        (``"dual:refresh=4"``), a mapping (``{"name": "dual", "refresh": 4}``) or an instance of the
        registry's base class (returned as is; no options then). Keyword options add to the spec's;
        an option given both ways is a ValueError naming both values (no silent winner).
        """
        if self.base is not None and isinstance(spec, self.base):
            if options:
                raise TypeError(f"options {sorted(options)} were given together with a {self.kind} instance "
                                f"{spec!r}; set them on its Config instead")
            return spec
        if isinstance(spec, Mapping):
            fields = dict(spec)
            if "name" not in fields:
                raise ValueError(f"a {self.kind} mapping needs a 'name' key, got keys {sorted(fields)}")
            name = fields.pop("name")
            self._check_given_once(fields, options, f"the mapping {dict(spec)!r}")
            return self.make(name, **fields, **options)
        if not isinstance(spec, str):
            base = f", a {self.base.__name__}" if self.base is not None else ""
            raise TypeError(f"{self.kind} must be a registered name, a spec string 'name:key=value,...', "
                            f"a mapping{base}; got {type(spec).__name__} {spec!r}")
        name, parsed = parse_spec(spec, self.kind)
        cls = self.get(name)
        self._check_given_once(parsed, options, f"the spec {spec!r}")
        return cls(**parsed, **options)

    def _check_given_once(self, given: Mapping[str, Any], options: Mapping[str, Any], where: str) -> None:
        """ValueError when an option is in both the spec (or mapping) and the keyword options."""
        both = [k for k in given if k in options]
        if both:
            pairs = "; ".join(f"{k!r}: {given[k]!r} in {where} and {options[k]!r} as a keyword" for k in both)
            raise ValueError(f"{self.kind} option(s) given twice ({pairs}); give each option once, in the "
                             f"spec or as a keyword")

    def describe(self) -> list[tuple[str, str]]:
        """(name, one-line description) of every entry, aliases noted."""
        rows = []
        for entry in self:
            desc = entry.description
            if entry.aliases:
                desc += f" (aliases: {', '.join(entry.aliases)})"
            rows.append((entry.name, desc))
        return rows

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
            f"Unknown {self.kind} {name!r}. Valid {self.plural}: {', '.join(self.names(aliases=True))}"
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


_SPEC = re.compile(r"^\s*([A-Za-z_][\w-]*)\s*(?::(.*))?$")


def split_options(text: str, spec: str = "") -> list[str]:
    """``text`` cut at the commas outside parentheses: a nested spec with several options is
    written in parentheses (``"fast:cache=(dual:look_back=16,look_ahead=16)"``)."""
    parts, depth, start = [], 0, 0
    for i, ch in enumerate(text):
        depth += (ch == "(") - (ch == ")")
        if depth < 0:
            raise ValueError(f"unbalanced ')' in spec {spec or text!r}")
        if ch == "," and depth == 0:
            parts.append(text[start:i])
            start = i + 1
    if depth:
        raise ValueError(f"unbalanced '(' in spec {spec or text!r}")
    return parts + [text[start:]]


def parse_value(text: str) -> Any:
    """One option value of a spec: none/null -> None, true/false -> bool, int, float, a nested spec
    in parentheses -> the text inside them, else the text."""
    raw = text.strip()
    if raw.startswith("(") and raw.endswith(")"):
        return raw[1:-1].strip()
    low = raw.lower()
    if low in ("none", "null"):
        return None
    if low in ("true", "false"):
        return low == "true"
    for convert in (int, float):
        try:
            return convert(raw)
        except ValueError:
            pass
    return raw


def parse_option(text: str, kind: str = "option") -> tuple[str, Any]:
    """``"key=value"`` -> ``(key, parse_value(value))``."""
    key, sep, value = text.partition("=")
    if not sep or not key.strip():
        raise ValueError(f"cannot parse {kind} {text!r}; expected key=value")
    return key.strip(), parse_value(value)


def parse_spec(spec: str, kind: str = "spec") -> tuple[str, dict[str, Any]]:
    """``"dual:refresh=4,look_ahead=8"`` -> ``("dual", {"refresh": 4, "look_ahead": 8})``."""
    m = _SPEC.match(spec)
    if not m:
        raise ValueError(f"cannot parse {kind} {spec!r}; expected NAME or NAME:key=value,...")
    name, rest = m.group(1), m.group(2)
    options: dict[str, Any] = {}
    for item in filter(None, (p.strip() for p in split_options(rest or "", spec))):
        try:
            key, value = parse_option(item, f"{kind} option")
        except ValueError as err:
            raise ValueError(f"{err} (in {spec!r})") from None
        if key in options:
            raise ValueError(f"{kind} {spec!r} sets {key!r} twice")
        options[key] = value
    return name, options


def format_spec(name: str, options: Mapping[str, Any]) -> str:
    """The inverse of ``parse_spec`` for values it reads back: ``("dual", {"refresh": 4})`` -> ``"dual:refresh=4"``."""
    def value(v: Any) -> str:
        return f"({v})" if isinstance(v, str) and "," in v else str(v)

    return name + (":" + ",".join(f"{k}={value(v)}" for k, v in options.items()) if options else "")


@dataclass(frozen=True)
class NoOptions:
    """A registered class without options."""


class Configurable:
    """Base of registered classes configured by a frozen ``Config`` dataclass (samplers, cache
    policies): ``Cls(threshold=0.8)`` or ``Cls(Cls.Config(threshold=0.8))``."""

    kind: ClassVar[str] = "entry"  # what the class is, for messages ("sampler", "cache policy")
    name: ClassVar[str] = ""  # set by ``Registry.register_class``
    Config: ClassVar[type] = NoOptions

    def __init__(self, config: Any | None = None, **options: Any) -> None:
        if config is not None and options:
            raise TypeError("pass either a Config or keyword options, not both")
        if config is not None and not isinstance(config, self.Config):
            raise TypeError(f"config of {self.kind} {self.name!r} must be a {self.Config.__name__}, "
                            f"got {type(config).__name__}")
        self.config = config if config is not None else build_config(self.Config, options, self.kind, self.name)

    @property
    def spec(self) -> str:
        """This instance as a spec string: the name and the options that differ from the defaults."""
        try:
            default = self.Config()
        except TypeError:  # a Config with required fields: every option is "changed"
            default = None
        changed = {f.name: getattr(self.config, f.name) for f in dataclasses.fields(self.config)
                   if default is None or getattr(self.config, f.name) != getattr(default, f.name)}
        return format_spec(self.name, changed)

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.config})"


def preset_class(registry: "Registry", name: str, base_name: str, defaults: dict[str, Any], doc: str) -> type:
    """A subclass of ``registry``'s class ``base_name`` whose Config has ``defaults`` (validated as
    usual): a measured choice registered under its own name (the ``fast`` sampler, the ``auto``
    cache). Options given by the caller still override the defaults."""
    base = registry.get(base_name)
    known = {f.name for f in dataclasses.fields(base.Config)}
    unknown = sorted(set(defaults) - known)
    if unknown:
        raise ValueError(f"preset {name!r}: {base_name!r} has no options {unknown} (valid: {sorted(known)})")
    config = dataclasses.make_dataclass(
        f"{name.title()}Config", [(k, type(v), dataclasses.field(default=v)) for k, v in defaults.items()],
        bases=(base.Config,), frozen=True)
    config()  # the preset's own defaults must pass the base's checks
    return type(name.title(), (base,), {"Config": config, "__doc__": doc})


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
