"""Training-only variants of the long-prompt tasks, for the long models' curricula.

- ``lookup_kW`` (:func:`narrow_lookup`): ``lookup_long`` with keys of W items (1 or 2; the suite's
  keys have 3), 4-16 / 4-48 rows. A model that cannot match a 3-item key first learns the
  match-and-copy step on 1-item keys (16 keys), then 2-item keys.
- ``count_cM`` (:func:`narrow_count`): ``count_long`` with 1..M occurrences in lists of >= M items
  (the suite: >= 24 items). Counting forms on short lists and then extends a doubling at a time.

Their prompts carry the suite task's word (``Task.word``), so nothing new enters the vocabulary; they
are registered under their own names (own size ranges, ``suite="curriculum"``, no held-out split of
their own) on first use, by :func:`curriculum_task`. Training redraws a prompt of theirs that is in the
suite task's test split (``dllm.train.data.is_held_out``): ``count_c16`` draws from ``count_long``'s
distribution, so it could meet ``count_long``'s test prompts.
"""

from __future__ import annotations

from dllm.tasks.base import register, tasks
from dllm.tasks.kinds.long_prompt import CountTask, LookupTask

WIDTH_SIZES = {1: (4, 16), 2: (4, 48)}  # rows per table for the narrow keys


class NarrowLookup(LookupTask):
    """``lookup_long`` with narrower keys (registered as ``lookup_kW``, prompts carry ``lookup_long``)."""


class NarrowCount(CountTask):
    """``count_long`` with 1..M occurrences, in lists of >= M items; registered as ``count_cM``,
    prompts carry ``count_long``."""


def narrow_lookup(width: int) -> str:
    """Register ``lookup_k<width>`` (width 1 or 2) once; returns its name."""
    if width not in WIDTH_SIZES:
        raise ValueError(f"lookup_k{width}: key width {width!r} has no curriculum variant; valid: "
                         f"{', '.join(f'lookup_k{w}' for w in WIDTH_SIZES)}")
    name = f"lookup_k{width}"
    if name not in tasks:
        lo, hi = WIDTH_SIZES[width]
        register(NarrowLookup(name=name, description=f"lookup_long with {width}-item keys (training only)",
                              min_size=lo, max_size=hi, default_sizes=(lo,), size_meaning="table rows n",
                              repeats=(1, 1), key_width=width, suite="curriculum", holdout=False,
                              word="lookup_long"))
    return name


def narrow_count(max_count: int) -> str:
    """Register ``count_c<max_count>`` once; returns its name."""
    if not isinstance(max_count, int) or max_count < 1:
        raise ValueError(f"count_c{max_count}: the largest count must be an integer >= 1")
    name = f"count_c{max_count}"
    if name not in tasks:
        register(NarrowCount(name=name, description=f"count_long with 1-{max_count} occurrences (training only)",
                             min_size=max_count, max_size=2040, default_sizes=(max(24, max_count),),
                             size_meaning="list length n", max_count=max_count, suite="curriculum",
                             holdout=False, word="count_long"))
    return name


def curriculum_task(name: str) -> str:
    """``lookup_kW`` / ``count_cM``: the narrow variants (registered on first use); else ``name``."""
    for prefix, make in (("lookup_k", narrow_lookup), ("count_c", narrow_count)):
        suffix = name[len(prefix):]
        if name.startswith(prefix) and suffix.isdigit():
            return make(int(suffix))
    return name


__all__ = ["NarrowCount", "NarrowLookup", "WIDTH_SIZES", "curriculum_task", "narrow_count", "narrow_lookup"]
