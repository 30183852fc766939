"""The sweep grid of ``dllm stress``: sampler families x parallelism values x block lengths x caches.

One ``--grid`` entry is one sampler *family* (one line in the accuracy / tokens-per-step plots):

    SAMPLER[:OPTION=VALUE[,VALUE...][,OPTION=VALUE[,VALUE...]]...]

the spec grammar of ``dllm.registry.parse_spec`` in which an option may list several values: a
comma-separated item without ``=`` adds a value to the option before it. Every combination of the
listed values is one *setting*. The option ``k`` is the number of tokens per step of a fixed-step
sampler (``steps = ceil(block / k)`` per block, LLaDA's schedule); every other option goes to the
sampler's ``Config``. Examples::

    low_confidence:k=1,2,4,8          top-k by confidence, 4 settings
    random:k=1,2,4,ties=first         k swept, ties fixed (part of the family's name)
    threshold:threshold=0.5,0.7,0.9   Fast-dLLM confidence threshold
    factor:factor=0.7,1.0,1.9         Fast-dLLM factor rule
    fast                              one setting, the sampler's defaults

A fixed-step sampler without ``k`` runs one token per step. Block lengths (``--block-lengths
0,4``; 0 = one block of the whole answer) cross every setting, and so do KV-cache policies
(``--caches none,dual``: each a spec as ``dllm.generate(cache=...)`` takes it; commas separate the
caches, so a spec with several options is written in parentheses, ``(dual:look_back=16,look_ahead=16)``,
the registry's nested-spec form, or with semicolons, ``dual:look_back=16;look_ahead=16``). A label
names the cache (`` cache=dual``) only when the sweep is not the default ``none`` alone. Everything
is checked here, before any decoding: unknown samplers, options and caches list the valid ones, and
each setting's sampler is built once, so an out-of-range value (``threshold=1.5``, ``k=0``) fails
with the Config's message. ``engine_refusal`` asks the engine, before any decoding, whether a
setting runs on the model (a cache the model cannot serve, a sampler the cache cannot serve).
"""

from __future__ import annotations

from dataclasses import dataclass
from itertools import product
from typing import Any, Optional, Sequence

from dllm import tasks as T
from dllm.cache import make_cache
from dllm.options import check_int
from dllm.registry import format_spec, parse_spec, parse_value, split_options
from dllm.samplers import samplers
from dllm.settings import CACHE, TOKENS_PER_STEP, DecodeSettings, cache_spec  # k, cache: not sampler options

DEFAULT_GRID = (
    "low_confidence:k=1,2,4,8", "random:k=1,2,4,8", "threshold:threshold=0.5,0.7,0.9,0.99",
    "factor:factor=0.7,1.0,1.9", "fast",
)  # fmt: skip
DEFAULT_CACHES = ("none",)  # no KV cache: every step forwards the whole canvas


@dataclass(frozen=True)
class GridEntry:
    """One ``--grid`` entry: a sampler and, per option, the values to sweep (in the given order)."""

    text: str
    sampler: str  # the name as written (an alias stays an alias in the labels)
    values: tuple[tuple[str, tuple[Any, ...]], ...]  # (option, values) in the given order

    @property
    def family(self) -> str:
        """The sampler and its single-valued options but k: the family's label."""
        return format_spec(self.sampler, {k: v[0] for k, v in self.values if len(v) == 1 and k != TOKENS_PER_STEP})

    @property
    def swept(self) -> tuple[str, ...]:
        """The options with several values."""
        return tuple(k for k, v in self.values if len(v) > 1)


@dataclass(frozen=True)
class Setting:
    """One point of the sweep: its family, the swept values and block length, and how it decodes."""

    family: str
    point: str  # the swept values, e.g. "k=2" ("" for a one-setting family)
    block_length: int  # 0: one block of the task's answer length
    decode: DecodeSettings  # the sampler with its options, k and cache; its block length is ``block_length or None``
    cache_shown: bool = False  # the labels name the cache (the sweep is not the default ``none`` alone)

    @property
    def sampler(self) -> str:
        return self.decode.name

    @property
    def k(self) -> Optional[int]:
        """Tokens per step (fixed-step samplers); None: adaptive."""
        return self.decode.tokens_per_step

    @property
    def spec(self) -> str:
        """The sampler spec with k, as ``dllm compare`` reads it."""
        extra = {} if self.k is None else {TOKENS_PER_STEP: self.k}
        return format_spec(self.sampler, {**self.decode.sampler_options, **extra})

    @property
    def cache(self) -> str:
        """The cache policy spec, as ``generate(cache=...)`` takes it."""
        return str(self.decode.cache)

    @property
    def curve(self) -> str:
        """The family at this block length and cache: one line of the accuracy vs tokens-per-step plot."""
        return self.family + block_suffix(self.block_length) + self._cache_suffix

    @property
    def label(self) -> str:
        """Unique within a grid: the spec, the block length and (when shown) the cache."""
        return self.spec + block_suffix(self.block_length) + self._cache_suffix

    @property
    def _cache_suffix(self) -> str:
        return f" cache={self.cache}" if self.cache_shown else ""


def cell_key(setting: Setting, task: str) -> str:
    """The name of one cell (setting x task) in the result file."""
    return f"{setting.label} | {task}"


def block_suffix(block_length: int) -> str:
    return f" block={block_length}" if block_length else ""


def parse_grid_entry(text: str) -> GridEntry:
    """``"low_confidence:k=1,2,4"`` -> ``GridEntry("low_confidence", (("k", (1, 2, 4)),))``; raises
    ValueError naming the entry for a malformed one."""
    name, _, rest = text.partition(":")
    name = name.strip()
    parse_spec(name, "grid entry")  # the name's own syntax
    values: list[tuple[str, list[Any]]] = []
    for item in filter(None, (p.strip() for p in rest.split(","))):
        key, sep, value = item.partition("=")
        if sep:
            key = key.strip()
            if not key:
                raise ValueError(f"grid entry {text!r}: {item!r} has no option name; expected OPTION=VALUE")
            if any(k == key for k, _ in values):
                raise ValueError(f"grid entry {text!r} sets option {key!r} twice; list its values once: "
                                 f"{key}=V1,V2,...")
            values.append((key, [parse_value(value)]))
        elif not values:
            raise ValueError(f"grid entry {text!r}: value {item!r} comes before any OPTION=; expected "
                             f"SAMPLER:OPTION=V1,V2,... (e.g. low_confidence:k=1,2,4)")
        else:
            key, seen = values[-1]
            value = parse_value(item)
            if value in seen:
                raise ValueError(f"grid entry {text!r} lists {key}={value!r} twice")
            seen.append(value)
    return GridEntry(text, name, tuple((k, tuple(v)) for k, v in values))


def parse_caches(text: "str | Sequence[str]") -> tuple[str, ...]:
    """``"none,dual"`` -> ("none", "dual"): cache policy specs, each once (as written; an alias and
    its name are one cache). Commas separate caches; a spec with several options goes in parentheses
    or has semicolons between its options (the module docstring). ValueError naming a bad spec; an
    unknown name lists the valid cache policies."""
    if isinstance(text, str):
        try:
            items = split_options(text, text)
        except ValueError as err:
            raise ValueError(f"caches {text!r}: {err}") from None
    else:
        items = list(text)
    specs = [_cache_item(item) for item in items if str(item).strip()]
    if not specs:
        raise ValueError(f"caches: give at least one cache policy (none = no KV cache), got {text!r}")
    seen: dict[str, str] = {}  # the policy's canonical spec -> the spec as written
    for spec in specs:
        canonical = _check_cache(spec)
        if canonical in seen:
            raise ValueError(f"caches list the cache {canonical!r} twice ({seen[canonical]!r} and {spec!r}); "
                             f"give each once")
        seen[canonical] = spec
    return tuple(specs)


def _cache_item(item: str) -> str:
    """One cache as ``generate`` takes it: outer parentheses dropped, semicolons as commas."""
    spec = str(item).strip()
    if spec.startswith("(") and spec.endswith(")"):
        spec = spec[1:-1].strip()
    return cache_spec(spec)


def _check_cache(spec: str) -> str:
    """The policy's canonical spec (``make_cache``); ValueError naming ``spec`` for a bad one."""
    if "=" in spec and ":" not in spec:  # an option cut from the spec before it by a comma
        raise ValueError(f"cache {spec!r} is no cache spec (NAME[:OPTION=VALUE]); write a cache with several "
                         f"options in parentheses, '(dual:look_back=16,look_ahead=16)', or with semicolons, "
                         f"'dual:look_back=16;look_ahead=16'")
    try:
        return make_cache(spec).spec
    except (ValueError, TypeError, KeyError) as err:
        raise ValueError(f"cache {spec!r}: {err}") from None


def caches_shown(caches: Sequence[str]) -> bool:
    """Whether labels name the cache: the sweep is not the default (no KV cache) alone."""
    return len(caches) > 1 or make_cache(caches[0]).spec != "none"


def parse_block_lengths(text: "str | Sequence[int]") -> tuple[int, ...]:
    """``"0,4"`` -> (0, 4): integers >= 0 (0 = one block of the answer), each once."""
    items = [parse_value(p) for p in text.split(",") if p.strip()] if isinstance(text, str) else list(text)
    if not items:
        raise ValueError(f"block lengths: give at least one (0 = one block of the answer), got {text!r}")
    for b in items:
        check_int("block length", b, 0, hint=" (0 = one block of the answer)")
    if len(set(items)) != len(items):
        raise ValueError(f"block lengths list a value twice: {items}")
    return tuple(items)


def expand(entry: GridEntry, block_lengths: Sequence[int], caches: Sequence[str] = DEFAULT_CACHES, *,
           cache_shown: bool = False) -> list[Setting]:
    """Every setting of one entry (cache outermost, then block length), each checked by building its sampler."""
    try:
        cls = samplers.get(entry.sampler)
    except KeyError as err:
        raise ValueError(f"grid entry {entry.text!r}: {err}") from None
    if any(k == CACHE for k, _ in entry.values):
        raise ValueError(f"grid entry {entry.text!r} sets {CACHE}=; give caches with --caches (crossed with "
                         f"every setting, e.g. --caches none,dual)")
    keys = [k for k, _ in entry.values]
    out = []
    for cache, bl in product(caches, block_lengths):
        for combo in product(*(v for _, v in entry.values)):
            chosen = dict(zip(keys, combo))
            point = ",".join(f"{key}={chosen[key]}" for key in entry.swept)
            k = chosen.pop(TOKENS_PER_STEP, None)
            if k is None and cls.fixed_steps:
                k = 1  # a fixed-step sampler without k: one token per step
            decode = DecodeSettings.of(sampler=entry.sampler, options=chosen, tokens_per_step=k, cache=cache,
                                       block_length=bl or None, label=entry.text)
            setting = Setting(entry.family, point, bl, decode, cache_shown)
            check_setting(entry, setting)
            out.append(setting)
    return out


def check_setting(entry: GridEntry, setting: Setting) -> None:
    """``DecodeSettings.check`` (the sampler's Config validates every option, k applies to fixed-step
    samplers only): the checks ``generate`` runs; ValueError naming the entry."""
    try:
        setting.decode.check()
    except (ValueError, TypeError) as err:
        raise ValueError(f"grid entry {entry.text!r}, setting {setting.label!r}: {err}") from None


def build_grid(texts: Sequence[str], block_lengths: Sequence[int],
               caches: "str | Sequence[str]" = DEFAULT_CACHES) -> list[Setting]:
    """All settings of the grid, in order; raises ValueError (before any decoding) for anything invalid."""
    caches = parse_caches(caches)
    shown = caches_shown(caches)
    if not texts:
        raise ValueError(f"the grid is empty; give at least one entry, e.g. {DEFAULT_GRID[0]!r}")
    entries = [parse_grid_entry(t) for t in texts]
    families: dict[str, str] = {}
    for e in entries:
        if e.family in families:
            raise ValueError(f"grid entries {families[e.family]!r} and {e.text!r} are the same family "
                             f"{e.family!r}; list all its values in one entry (OPTION=V1,V2,...)")
        families[e.family] = e.text
    settings: list[Setting] = []
    made_by: dict[str, str] = {}  # setting label (its cells' key) -> the entry that made it
    for e in entries:
        for s in expand(e, block_lengths, caches, cache_shown=shown):
            if s.label in made_by:  # one label is one cell per task: the two would share (and overwrite) it
                raise ValueError(f"grid entries {made_by[s.label]!r} and {e.text!r} both give the setting "
                                 f"{s.label!r}; list each value in one entry only")
            made_by[s.label] = e.text
            settings.append(s)
    return settings


def engine_refusal(model: Any, setting: Setting, examples: Sequence[T.Example]) -> Optional[str]:
    """Why ``generate`` refuses ``setting`` on ``model`` (its SettingError's message), or None: the
    settings resolved as ``decode_and_score`` plans each batch, once per answer length and prompt
    length of ``examples`` (a cache the model cannot serve, a sampler the cache cannot serve, ...)."""
    from dllm.cache.block_causal import block_size_of

    grid = block_size_of(model)
    seen: set[tuple[int, int]] = set()
    for ex in examples:
        la, prompt = T.answer_length(ex.task, ex.size), T.prompt_ids(ex)
        if (la, len(prompt)) in seen:
            continue
        seen.add((la, len(prompt)))
        bl = setting.decode.block_length if grid else min(setting.decode.block_length or la, la)
        try:
            setting.decode.replace(block_length=bl).resolve(model, [prompt], la)
        except (ValueError, TypeError) as err:
            return str(err)
    return None


def check_engine(model: Any, settings: Sequence[Setting], examples: Sequence[T.Example]) -> None:
    """ValueError, before any decoding, naming every setting ``generate`` refuses on ``model`` with the
    engine's message (``engine_refusal``; settings refused alike are listed together)."""
    refused: dict[str, list[str]] = {}  # the engine's message -> the settings it refuses
    for s in settings:
        why = engine_refusal(model, s, examples)
        if why is not None:
            refused.setdefault(why, []).append(s.label)
    if refused:
        raise ValueError("the engine refuses settings of the grid on this model: "
                         + "; ".join(f"{', '.join(labels)}: {why}" for why, labels in refused.items()))


__all__ = ["DEFAULT_CACHES", "DEFAULT_GRID", "GridEntry", "Setting", "build_grid", "caches_shown", "cell_key",
           "check_engine", "engine_refusal", "expand", "parse_block_lengths", "parse_caches", "parse_grid_entry"]
