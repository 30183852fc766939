"""The long-prompt suite: 256-2,045-word prompts with 2-4-word answers and known C(Y|X).

Built to measure what KV-cache approximations (``dllm.cache``: prefix / dual / window caches with
refresh intervals) cost in accuracy where caching matters: the prompt is long, the answer is short
(so decoding is cheap and the cached prompt dominates the compute), and the answer depends on a few
words that sit anywhere in the prompt, often far from the answer.

==============  ======================================================  ==========  ======  ==========
task            answer                                                  size n      answer  C(Y|X)
==============  ======================================================  ==========  ======  ==========
lookup_long     the value of the query key in a table of unique keys    4..339      2       0
lookup_any      a value of the query key, which has m = 2..4 rows       4..339      2       log2 m
span_copy_far   the 4 items after the ``,`` marker (first half)         16..2039    4       0
count_long      how often the query item occurs (1..16), two digits     24..2040    2       0
==============  ======================================================  ==========  ======  ==========

Prompts (after ``[BOS] <task>``, before ``[SEP]``):

- ``lookup_*``: n rows ``k1 k2 k3 d1 d2`` joined by ``,``, then ``| q1 q2 q3``: a key is three
  items A-P (4,096 keys), a value two digits 00-99 (n rows = 6n + 3 words). ``lookup_long``: every
  key is distinct and the query is one of them. ``lookup_any``: the query key has m in 2..4 rows
  (drawn uniformly) whose values have pairwise distinct first digits and pairwise distinct second
  digits, every other key is distinct; so each answer digit is uniform over m digits and
  C(Y|X) = 2 log2 m - log2 m = log2 m (1 / 1.585 / 2 bits), and decoding both digits in one step
  is valid with probability 1/m under exact marginals (the halves of different values mix).
- ``span_copy_far``: n items A-P (with repeats) with one ``,`` inserted before item s, s uniform
  in 0..n/2 - 4 (the span lies in the first half: at least n/2 words before the answer).
- ``count_long``: n items A-P, then ``| q``; q occurs c times, c uniform in 1..16, at uniform
  positions; the other items are uniform over the 15 other letters. The answer is c as two digits
  (``0 7``), like ``add``'s zero-padded sums.

Default sizes (the test split, every evaluation) give prompts of 256 / 512 / 1,024 / 2,040 words
(lookup: 258 / 516 / 1,026 / 2,040); the sizes below them (prompts of 19-255 words) exist for the
training curriculum (``dllm/train/recipes/long_prompt.py``: retrieval is learned on short tables first); every full sequence fits 2,048 positions (the embedded models' ``max_positions``). The
suite is ``"long-prompt"``: default runs over PB-mini do not include it, and the models trained
before it cannot read its task tokens.

Hold-out: ``holdout=False``. A random prompt of >= 250 items never repeats (two prompts agree with
probability < 16^-250), so training cannot meet a test prompt; holding the split out would build
50 prompts at each of ~1,800 sizes (``is_test_prompt`` enumerates every size) for nothing.
"""

from __future__ import annotations

import random
from dataclasses import dataclass
from typing import Any, Sequence

from dllm.tasks.base import Meta, SingleAnswerTask, Task, register
from dllm.tasks.vocab import BAR, COMMA, DIGITS, ITEMS_1TOK

LONG_PROMPT_SUITE = "long-prompt"
KEY_WIDTH = 3  # items per lookup key: 16^3 = 4,096 keys
VALUE_WIDTH = 2  # digits per lookup value (00-99)
SPAN = 4  # span_copy_far: items copied after the marker
MAX_COUNT = 16  # count_long: the queried item occurs 1..MAX_COUNT times

Key = tuple[str, ...]
Row = tuple[Key, tuple[str, ...]]  # (key words, value digits)


# ---------------------------------------------------------------------------------- small math
def key_words(index: int, width: int = KEY_WIDTH) -> Key:
    """Key ``index`` in 0..16**width - 1 as ``width`` items (base 16 over A-P, most significant
    first; the suite's keys are three items, 0..4095)."""
    if not 0 <= index < 16**width:
        raise ValueError(f"key index {index!r} does not fit {width} items (0..{16**width - 1})")
    return tuple(ITEMS_1TOK[(index >> (4 * (width - 1 - i))) & 15] for i in range(width))


def two_digits(value: int) -> tuple[str, str]:
    """0..99 as two digit words, zero-padded (7 -> ``0 7``)."""
    if not 0 <= value <= 99:
        raise ValueError(f"value {value!r} does not fit two digits (0..99)")
    return DIGITS[value // 10], DIGITS[value % 10]


def split_on(words: Sequence[str], sep: str) -> list[tuple[str, ...]]:
    """``words`` cut at every ``sep`` (the separators dropped; k separators give k + 1 groups)."""
    groups: list[list[str]] = [[]]
    for w in words:
        if w == sep:
            groups.append([])
        else:
            groups[-1].append(w)
    return [tuple(g) for g in groups]


def distinct_digit_values(values: Sequence[tuple[str, ...]]) -> bool:
    """Pairwise distinct first digits and pairwise distinct second digits (lookup_any's rule)."""
    return all(len({v[i] for v in values}) == len(values) for i in range(VALUE_WIDTH))


def _check_items(task: str, words: Sequence[str], what: str) -> None:
    bad = sorted({w for w in words if w not in ITEMS_1TOK})
    if bad:
        raise ValueError(f"{task}: {what} must be items A-P, got {bad[:5]}")


# ---------------------------------------------------------------------------------- lookup
@dataclass(frozen=True, kw_only=True)
class LookupTask(Task):
    """Key-value lookup in a long table; the query key has ``repeats[0]..repeats[1]`` rows, and any
    of their values is a valid answer (the module docstring gives the table format and C)."""

    repeats: tuple[int, int]  # (1, 1): unique keys, C = 0; (2, 4): lookup_any
    key_width: int = KEY_WIDTH  # items per key; the suite's tasks use 3 (narrower: training curricula)

    def __post_init__(self) -> None:
        super().__post_init__()
        lo, hi = self.repeats
        if not 1 <= lo <= hi <= len(DIGITS) or hi > self.min_size:
            raise ValueError(f"task {self.name!r}: repeats {self.repeats} must satisfy 1 <= lo <= hi <= "
                             f"min(10, min_size {self.min_size})")
        if not isinstance(self.key_width, int) or self.key_width < 1:
            raise ValueError(f"task {self.name!r}: key_width must be an integer >= 1, got {self.key_width!r}")
        keys = 16**self.key_width
        if self.max_size - lo + 1 > keys:
            raise ValueError(f"task {self.name!r}: key_width {self.key_width!r} gives {keys} distinct keys, "
                             f"too few for {self.max_size} rows (at most {keys + lo - 1})")

    @property
    def row_width(self) -> int:
        return self.key_width + VALUE_WIDTH

    def sample_problem(self, rng: random.Random, size: int) -> dict[str, Any]:
        m = rng.randint(*self.repeats)
        keys = [key_words(k, self.key_width) for k in rng.sample(range(16**self.key_width), size - m + 1)]
        query, others = keys[0], keys[1:]
        firsts, seconds = rng.sample(range(10), m), rng.sample(range(10), m)
        query_values = [(DIGITS[a], DIGITS[b]) for a, b in zip(firsts, seconds)]
        slots = set(rng.sample(range(size), m))
        rows, q, o = [], iter(query_values), iter(others)
        for i in range(size):
            rows.append((query, next(q)) if i in slots else (next(o), two_digits(rng.randrange(100))))
        return {"rows": tuple(rows), "query": query}

    def format_args(self, meta: Meta) -> tuple[str, ...]:
        out: list[str] = []
        for i, (key, value) in enumerate(meta["rows"]):
            out += [COMMA] * (i > 0) + [*key, *value]
        return (*out, BAR, *meta["query"])

    def parse_args(self, args: Sequence[str]) -> dict[str, Any]:
        groups = split_on(args, BAR)
        if len(groups) != 2:
            raise ValueError(f"{self.name}: expected '<rows> | <query key>', found {len(groups) - 1} '|'")
        table, query = groups
        if len(query) != self.key_width:
            raise ValueError(f"{self.name}: the query key has {len(query)} words, expected {self.key_width}")
        _check_items(self.name, query, "the query key")
        rows = []
        for i, row in enumerate(split_on(table, COMMA)):
            key, value = row[:self.key_width], row[self.key_width:]
            if (len(row) != self.row_width or any(w not in ITEMS_1TOK for w in key)
                    or any(w not in DIGITS for w in value)):
                raise ValueError(f"{self.name}: row {i + 1} {' '.join(row)!r} is not "
                                 f"'<{self.key_width} items A-P> <{VALUE_WIDTH} digits>'")
            rows.append((key, value))
        meta = {"rows": tuple(rows), "query": query}
        self._check_table(meta)
        return meta

    def _check_table(self, meta: Meta) -> None:
        keys = [k for k, _ in meta["rows"] if k != meta["query"]]
        if len(set(keys)) != len(keys):
            raise ValueError(f"{self.name}: a key other than the query appears in two rows")
        values = self.enumerate_answers(meta)
        lo, hi = self.repeats
        if not lo <= len(values) <= hi:
            raise ValueError(f"{self.name}: the query key {' '.join(meta['query'])!r} has {len(values)} "
                             f"rows, expected {lo}..{hi}")
        if not distinct_digit_values(values):
            raise ValueError(f"{self.name}: the query's values {[''.join(v) for v in values]} repeat a "
                             "first or a second digit")

    def size_of(self, meta: Meta) -> int:
        return len(meta["rows"])

    def args_length(self, size: int) -> int:
        return (self.row_width + 1) * size + self.key_width  # rows, their n - 1 commas, '|', the query key

    def content_length(self, size: int) -> int:
        return VALUE_WIDTH

    def sample_answer(self, rng: random.Random, meta: Meta) -> tuple[str, ...]:
        return rng.choice(self.enumerate_answers(meta))

    def reference_answer(self, meta: Meta) -> tuple[str, ...]:
        return self.enumerate_answers(meta)[0]

    def is_valid(self, meta: Meta, words: tuple[str, ...]) -> bool:
        return words in self.enumerate_answers(meta)

    def count_answers(self, meta: Meta) -> int:
        return len(self.enumerate_answers(meta))

    def enumerate_answers(self, meta: Meta) -> list[tuple[str, ...]]:
        """The query key's values in table order."""
        return [tuple(v) for k, v in meta["rows"] if k == meta["query"]]


# ---------------------------------------------------------------------------------- span copy
@dataclass(frozen=True, kw_only=True)
class SpanCopyTask(SingleAnswerTask):
    """Copy the ``SPAN`` items after the one ``,`` marker, which sits in the list's first half."""

    def sample_problem(self, rng: random.Random, size: int) -> dict[str, Any]:
        return {"items": tuple(rng.choices(ITEMS_1TOK, k=size)), "start": rng.randint(0, size // 2 - SPAN)}

    def format_args(self, meta: Meta) -> tuple[str, ...]:
        items, s = meta["items"], meta["start"]
        return (*items[:s], COMMA, *items[s:])

    def parse_args(self, args: Sequence[str]) -> dict[str, Any]:
        groups = split_on(args, COMMA)
        if len(groups) != 2:
            raise ValueError(f"{self.name}: expected exactly one ',' marker, found {len(groups) - 1}")
        before, after = groups
        _check_items(self.name, before + after, "the list")
        if len(after) < SPAN:
            raise ValueError(f"{self.name}: the marker is followed by {len(after)} items, fewer than {SPAN}")
        return {"items": before + after, "start": len(before)}

    def size_of(self, meta: Meta) -> int:
        return len(meta["items"])

    def args_length(self, size: int) -> int:
        return size + 1

    def content_length(self, size: int) -> int:
        return SPAN

    def reference_answer(self, meta: Meta) -> tuple[str, ...]:
        s = meta["start"]
        return tuple(meta["items"][s:s + SPAN])


# ---------------------------------------------------------------------------------- count
@dataclass(frozen=True, kw_only=True)
class CountTask(SingleAnswerTask):
    """How often the query item occurs in a long list, as two digits."""

    max_count: int = MAX_COUNT  # the query occurs 1..max_count times (the suite: 16; fewer: curricula)

    def __post_init__(self) -> None:
        super().__post_init__()
        if not 1 <= self.max_count <= min(99, self.min_size):
            raise ValueError(f"task {self.name!r}: max_count {self.max_count!r} must be in 1..{min(99, self.min_size)} "
                             f"(two digits, and at most min_size {self.min_size} occurrences)")

    def sample_problem(self, rng: random.Random, size: int) -> dict[str, Any]:
        query = rng.choice(ITEMS_1TOK)
        others = [w for w in ITEMS_1TOK if w != query]
        items = rng.choices(others, k=size)
        for i in rng.sample(range(size), rng.randint(1, self.max_count)):
            items[i] = query
        return {"items": tuple(items), "query": query}

    def format_args(self, meta: Meta) -> tuple[str, ...]:
        return (*meta["items"], BAR, meta["query"])

    def parse_args(self, args: Sequence[str]) -> dict[str, Any]:
        groups = split_on(args, BAR)
        if len(groups) != 2 or len(groups[1]) != 1:
            raise ValueError(f"{self.name}: expected '<items> | <query item>', got {len(groups) - 1} '|' "
                             f"and {len(groups[-1])} query words")
        items, (query,) = groups
        _check_items(self.name, (*items, query), "the list and the query")
        if items.count(query) > 99:
            raise ValueError(f"{self.name}: the query item occurs {items.count(query)} times; the answer "
                             "has two digits (at most 99)")
        return {"items": items, "query": query}

    def size_of(self, meta: Meta) -> int:
        return len(meta["items"])

    def args_length(self, size: int) -> int:
        return size + 2

    def content_length(self, size: int) -> int:
        return 2

    def reference_answer(self, meta: Meta) -> tuple[str, ...]:
        return two_digits(meta["items"].count(meta["query"]))


# ---------------------------------------------------------------------------------- registration
_COMMON = dict(suite=LONG_PROMPT_SUITE, holdout=False)

register(LookupTask(
    name="lookup_long", description="the value of the query key in a long table of unique keys",
    min_size=4, max_size=339, default_sizes=(42, 85, 170, 339), size_meaning="table rows n",
    repeats=(1, 1), **_COMMON))
register(LookupTask(
    name="lookup_any", description="any value of a query key with 2-4 rows in a long table (C = log2 m)",
    min_size=4, max_size=339, default_sizes=(42, 85, 170, 339), size_meaning="table rows n",
    repeats=(2, 4), **_COMMON))
register(SpanCopyTask(
    name="span_copy_far", description=f"copy the {SPAN} items after the ',' marker far back in a long list",
    min_size=16, max_size=2039, default_sizes=(252, 508, 1020, 2036), size_meaning="list length n",
    **_COMMON))
register(CountTask(
    name="count_long", description=f"count the query item (1-{MAX_COUNT} times) in a long list",
    min_size=24, max_size=2040, default_sizes=(251, 507, 1019, 2035), size_meaning="list length n",
    **_COMMON))
