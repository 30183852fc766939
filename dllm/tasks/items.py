"""List items: single-token letters, two-token (first, second) names, two-digit numbers.

An item is a tuple of words. Kinds:

- ``1tok``: ``("A",)`` .. ``("P",)``; 16 items.
- ``2tok``: ``("f3", "s5")``: first part ``f0``-``f7`` x second part ``s0``-``s7``. Inside one
  problem (the list plus any new item) all first parts are distinct and all second parts are
  distinct, so a chimera (halves of two different items) or swapped halves is never an input item.
- ``num``: a number 10..99 written as two digit words, ``("4", "7")``.

Sort key (the only one used anywhere): 1tok by the letter's place in A..P; 2tok by the first part's
index, then the second part's; num by numeric value.
"""

from __future__ import annotations

import random
from typing import Sequence

from dllm.tasks.vocab import DIGITS, FIRST_PARTS, ITEMS_1TOK, SECOND_PARTS

Item = tuple[str, ...]
ITEM_KINDS: tuple[str, ...] = ("1tok", "2tok", "num")
_WIDTH = {"1tok": 1, "2tok": 2, "num": 2}
_CAPACITY = {"1tok": len(ITEMS_1TOK), "2tok": len(FIRST_PARTS), "num": 90}  # max distinct items per problem


def check_kind(kind: str) -> str:
    if kind not in ITEM_KINDS:
        raise ValueError(f"item kind {kind!r} is not one of {list(ITEM_KINDS)}")
    return kind


def item_width(kind: str) -> int:
    """Words per item."""
    return _WIDTH[check_kind(kind)]


def item_capacity(kind: str) -> int:
    """Most items one problem can hold under the distinctness rules."""
    return _CAPACITY[check_kind(kind)]


def sample_items(rng: random.Random, kind: str, count: int) -> tuple[Item, ...]:
    """``count`` distinct items in random order (2tok: distinct first and second parts)."""
    if count > item_capacity(kind):
        raise ValueError(f"cannot draw {count} distinct {kind} items (at most {item_capacity(kind)})")
    if kind == "1tok":
        return tuple((w,) for w in rng.sample(ITEMS_1TOK, count))
    if kind == "2tok":
        firsts = rng.sample(FIRST_PARTS, count)
        seconds = rng.sample(SECOND_PARTS, count)
        return tuple(zip(firsts, seconds))
    return tuple(tuple(str(v)) for v in rng.sample(range(10, 100), count))


def is_item(kind: str, item: Item) -> bool:
    if kind == "1tok":
        return len(item) == 1 and item[0] in ITEMS_1TOK
    if kind == "2tok":
        return len(item) == 2 and item[0] in FIRST_PARTS and item[1] in SECOND_PARTS
    return len(item) == 2 and item[0] in DIGITS[1:] and item[1] in DIGITS


def item_key(item: Item) -> tuple[int, ...]:
    """Sort key; see the module docstring."""
    if len(item) == 1:
        return (ITEMS_1TOK.index(item[0]),)
    if item[0] in FIRST_PARTS:
        return (FIRST_PARTS.index(item[0]), SECOND_PARTS.index(item[1]))
    return (int(item[0] + item[1]),)


def flatten(items: Sequence[Item]) -> tuple[str, ...]:
    return tuple(w for item in items for w in item)


def chunk(words: Sequence[str], width: int) -> tuple[Item, ...] | None:
    """Split words into items of ``width`` words; ``None`` if the length does not divide."""
    if len(words) % width:
        return None
    return tuple(tuple(words[i : i + width]) for i in range(0, len(words), width))


def parse_items(kind: str, words: Sequence[str], what: str) -> tuple[Item, ...]:
    """Parse and validate a group of item words (``ValueError`` naming the bad group)."""
    items = chunk(words, item_width(kind))
    if items is None or not all(is_item(kind, it) for it in items):
        raise ValueError(f"{what} {' '.join(words)!r} is not a sequence of {kind} items")
    return items


def check_distinct(kind: str, items: Sequence[Item], what: str) -> None:
    """The distinctness rules of the module docstring (``ValueError`` if broken)."""
    parts = [items] if kind != "2tok" else [[it[0] for it in items], [it[1] for it in items]]
    for group in parts:
        if len(set(group)) != len(group):
            raise ValueError(f"{what} {' '.join(flatten(items))!r} repeats an item (or a part of a 2tok item)")
