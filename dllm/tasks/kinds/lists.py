"""List-operation tasks (ParallelBench's Waiting Line, with letters instead of names).

Prompt arguments: the list, then ``| <new item>`` for replace/insert, then ``| <index>`` for the
index variants. Indices are **1-based** digits: ``replace_index``/``remove_index`` take a position
i in 1..n; ``insert_index`` takes a slot i in 1..n+1 and inserts *before* position i (n+1 appends).

Answers (size n = list length; width w = words per item):

==================  ===================================================  =====================
task                valid answers                                        count
==================  ===================================================  =====================
copy / reverse      the list / the reversed list                         1
sort                ascending by ``items.item_key``                      1
replace_index       position i replaced by the new item                  1
replace_random      any one position replaced by the new item            n
insert_index        new item inserted before position i                  1
insert_random       new item inserted at any of the n+1 slots            n+1
remove_index        position i dropped                                   1
remove_random       any one item dropped, order kept                     n
shuffle             any permutation of the items                         n!
shuffle_strict      any permutation except the input order               n! - 1
==================  ===================================================  =====================

Registered names: each op above with 1-token items (``copy``, ...), ``<op>_2tok`` with two-token
items for all ten ops, and ``sort_num`` (two-digit numbers, numeric order).
"""

from __future__ import annotations

import itertools
import math
import random
from dataclasses import dataclass
from typing import Any, Sequence

import numpy as np

from dllm.tasks.answers import AnswerTable
from dllm.tasks.base import Meta, Task, register
from dllm.tasks.format import split_groups
from dllm.tasks.items import (
    Item, check_distinct, check_kind, chunk, flatten, item_key, item_width, parse_items, sample_items,
)
from dllm.tasks.vocab import BAR, DIGITS, EOS, word_id

LIST_OPS: tuple[str, ...] = (
    "copy", "reverse", "sort", "replace_index", "replace_random", "insert_index", "insert_random",
    "remove_index", "remove_random", "shuffle",
)  # fmt: skip

_DESCRIPTIONS = {
    "copy": "repeat the list",
    "reverse": "the list in reverse order",
    "sort": "the list in ascending order",
    "replace_index": "replace the item at a given 1-based position by a new item",
    "replace_random": "replace any one item by a new item",
    "insert_index": "insert a new item before a given 1-based position (n+1 = append)",
    "insert_random": "insert a new item at any position",
    "remove_index": "remove the item at a given 1-based position",
    "remove_random": "remove any one item, keeping the order",
    "shuffle": "any permutation of the list",
}
_KIND_NOTE = {"1tok": "items A-P", "2tok": "two-token items f*-s*", "num": "two-digit numbers 10-99"}


@dataclass(frozen=True, kw_only=True)
class ListTask(Task):
    op: str
    kind: str = "1tok"
    strict: bool = False  # shuffle only: the input order itself is not a valid answer

    def __post_init__(self) -> None:
        super().__post_init__()
        check_kind(self.kind)
        if self.op not in LIST_OPS:
            raise ValueError(f"list op {self.op!r} is not one of {list(LIST_OPS)}")

    # --------------------------------------------------------------------------- op properties
    @property
    def base_op(self) -> str:
        return self.op.split("_")[0]

    @property
    def has_new(self) -> bool:
        return self.base_op in ("replace", "insert")

    @property
    def has_index(self) -> bool:
        return self.op.endswith("_index")

    @property
    def width(self) -> int:
        return item_width(self.kind)

    def _index_range(self, n: int) -> tuple[int, int]:
        return (1, n + 1) if self.base_op == "insert" else (1, n)

    # --------------------------------------------------------------------------- problem side
    def sample_problem(self, rng: random.Random, size: int) -> dict[str, Any]:
        drawn = sample_items(rng, self.kind, size + self.has_new)
        meta: dict[str, Any] = {"items": drawn[:size]}
        if self.has_new:
            meta["new"] = drawn[size]
        if self.has_index:
            lo, hi = self._index_range(size)
            meta["index"] = rng.randrange(lo, hi + 1)
        return meta

    def format_args(self, meta: Meta) -> tuple[str, ...]:
        words = flatten(meta["items"])
        if self.has_new:
            words += (BAR, *meta["new"])
        if self.has_index:
            words += (BAR, str(meta["index"]))
        return words

    def parse_args(self, args: Sequence[str]) -> dict[str, Any]:
        groups = split_groups(args)
        expected = 1 + self.has_new + self.has_index
        if len(groups) != expected:
            raise ValueError(f"{self.name}: expected {expected} '|'-separated argument groups, got {len(groups)}")
        meta: dict[str, Any] = {"items": parse_items(self.kind, groups[0], "list")}
        every = list(meta["items"])
        if self.has_new:
            new = parse_items(self.kind, groups[1], "new item")
            if len(new) != 1:
                raise ValueError(f"{self.name}: the new-item group must hold one item, got {' '.join(groups[1])!r}")
            meta["new"] = new[0]
            every.append(new[0])
        check_distinct(self.kind, every, f"{self.name} problem")
        if self.has_index:
            lo, hi = self._index_range(len(meta["items"]))
            group = groups[-1]
            if len(group) != 1 or group[0] not in DIGITS or not lo <= int(group[0]) <= hi:
                raise ValueError(f"{self.name}: index {' '.join(group)!r} is not a digit in {lo}..{hi}")
            meta["index"] = int(group[0])
        return meta

    def size_of(self, meta: Meta) -> int:
        return len(meta["items"])

    def args_length(self, size: int) -> int:
        return self.width * size + (1 + self.width) * self.has_new + 2 * self.has_index

    # --------------------------------------------------------------------------- answer side
    def content_length(self, size: int) -> int:
        delta = {"insert": 1, "remove": -1}.get(self.base_op, 0)
        return self.width * (size + delta)

    def _candidates(self, meta: Meta) -> list[tuple[Item, ...]]:
        """Every valid answer as a tuple of items, reference answer first."""
        items, op = tuple(meta["items"]), self.op
        n = len(items)
        if op == "copy":
            return [items]
        if op == "reverse":
            return [items[::-1]]
        if op == "sort":
            return [tuple(sorted(items, key=item_key))]
        if op == "shuffle":
            perms = list(itertools.permutations(items))
            return perms[1:] if self.strict else perms  # permutations() yields the identity first
        positions = [meta["index"]] if self.has_index else range(1, n + 1 + (self.base_op == "insert"))
        edit = {"replace": _replace, "insert": _insert, "remove": _remove}[self.base_op]
        return [edit(items, meta.get("new"), i) for i in positions]

    def count_answers(self, meta: Meta) -> int:
        n = len(meta["items"])
        if self.op == "shuffle":
            return math.factorial(n) - self.strict
        if self.has_index or self.base_op in ("copy", "reverse", "sort"):
            return 1
        return n + (self.base_op == "insert")

    def enumerate_answers(self, meta: Meta) -> list[tuple[str, ...]]:
        return [flatten(c) for c in self._candidates(meta)]

    def answer_table(self, meta: Meta) -> AnswerTable:
        if self.op != "shuffle":
            return super().answer_table(meta)
        # n! rows: gather item ids through a permutation index instead of building word tuples
        items = meta["items"]
        perms = np.asarray(list(itertools.permutations(range(len(items)))), dtype=np.intp)  # [n!, n]
        perms = perms[1:] if self.strict else perms
        item_ids = np.asarray([[word_id(w) for w in it] for it in items], dtype=np.int16)  # [n, w]
        body = item_ids[perms].reshape(len(perms), -1)  # [n!, n*w]
        eos = np.full((len(perms), 1), word_id(EOS), dtype=np.int16)
        return AnswerTable(np.concatenate([body, eos], axis=1))

    def reference_answer(self, meta: Meta) -> tuple[str, ...]:
        items = tuple(meta["items"])
        if self.op == "shuffle":  # identity, or (strict) the last two swapped: itertools' order
            return flatten(items[:-2] + (items[-1], items[-2]) if self.strict else items)
        return flatten(self._candidates(meta)[0])

    def sample_answer(self, rng: random.Random, meta: Meta) -> tuple[str, ...]:
        items = list(meta["items"])
        if self.op == "shuffle":
            while True:
                rng.shuffle(items)
                if not (self.strict and tuple(items) == tuple(meta["items"])):
                    return flatten(items)
        candidates = self._candidates(meta)
        return flatten(candidates[rng.randrange(len(candidates))])

    def is_valid(self, meta: Meta, words: tuple[str, ...]) -> bool:
        out = chunk(words, self.width)
        if out is None or len(words) != self.content_length(len(meta["items"])):
            return False
        items = tuple(meta["items"])
        if self.op == "shuffle":
            return sorted(out) == sorted(items) and not (self.strict and out == items)
        return out in self._candidates(meta)

    def item_integrity(self, meta: Meta, words: tuple[str, ...]) -> bool | None:
        if self.kind != "2tok":
            return None
        out = chunk(words, self.width)
        allowed = set(meta["items"]) | ({meta["new"]} if self.has_new else set())
        return out is not None and all(it in allowed for it in out)


def _replace(items: tuple[Item, ...], new: Item, i: int) -> tuple[Item, ...]:
    return items[: i - 1] + (new,) + items[i:]


def _insert(items: tuple[Item, ...], new: Item, i: int) -> tuple[Item, ...]:
    return items[: i - 1] + (new,) + items[i - 1 :]


def _remove(items: tuple[Item, ...], _new: Item | None, i: int) -> tuple[Item, ...]:
    return items[: i - 1] + items[i:]


def _make(op: str, kind: str, *, strict: bool = False, name: str | None = None) -> ListTask:
    has_new = op.split("_")[0] in ("replace", "insert")
    max_size = 7 if kind == "2tok" and has_new else 8  # 2tok: 8 first parts hold list + new item
    desc = _DESCRIPTIONS[op] + (", never the input order" if strict else "") + f" ({_KIND_NOTE[kind]})"
    return ListTask(
        name=name or (op if kind == "1tok" else f"{op}_{kind}"),
        description=desc,
        min_size=3,
        max_size=max_size,
        default_sizes=(4, 6) if kind == "2tok" else (4, 6, 8),
        size_meaning="list length n",
        op=op,
        kind=kind,
        strict=strict,
    )


for _op in LIST_OPS:
    register(_make(_op, "1tok"))
for _op in LIST_OPS:
    register(_make(_op, "2tok"))
register(_make("sort", "num", name="sort_num"))
register(_make("shuffle", "1tok", strict=True, name="shuffle_strict"))
