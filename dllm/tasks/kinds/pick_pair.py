"""``pick_pair``: output any one of the listed two-token pairs.

The prompt lists M in 3..5 distinct pairs ``f s`` drawn from F x S, with F three random first parts
and S three random second parts; sets that are a Cartesian product of their projections are
rejected (their C would be 0). The answer is one listed pair, so C(Y|X) = I(first; second) under the
uniform distribution over the pairs, e.g. {(a,x), (a,y), (b,z), (c,z)} gives 1 bit. Decoding both
words in one step mixes halves of different pairs; one word per step is always valid.
"""

from __future__ import annotations

import random
from dataclasses import dataclass
from typing import Any, Sequence

from dllm.tasks.base import Meta, Task, register
from dllm.tasks.items import Item, chunk, flatten, is_item
from dllm.tasks.vocab import FIRST_PARTS, SECOND_PARTS

_PARTS = 3  # first parts and second parts available per problem


def is_product(pairs: Sequence[Item]) -> bool:
    """True if the set equals (its first parts) x (its second parts)."""
    firsts, seconds = {p[0] for p in pairs}, {p[1] for p in pairs}
    return set(pairs) == {(f, s) for f in firsts for s in seconds}


@dataclass(frozen=True, kw_only=True)
class PickPairTask(Task):
    def sample_problem(self, rng: random.Random, size: int) -> dict[str, Any]:
        firsts = rng.sample(FIRST_PARTS, _PARTS)
        seconds = rng.sample(SECOND_PARTS, _PARTS)
        grid = [(f, s) for f in firsts for s in seconds]
        while True:
            pairs = tuple(rng.sample(grid, size))
            if not is_product(pairs):
                return {"pairs": pairs}

    def format_args(self, meta: Meta) -> tuple[str, ...]:
        return flatten(meta["pairs"])

    def parse_args(self, args: Sequence[str]) -> dict[str, Any]:
        pairs = chunk(args, 2)
        if pairs is None or not all(is_item("2tok", p) for p in pairs):
            raise ValueError(f"{self.name}: {' '.join(args)!r} is not a list of 'f* s*' pairs")
        if len(set(pairs)) != len(pairs):
            raise ValueError(f"{self.name}: {' '.join(args)!r} lists a pair twice")
        return {"pairs": pairs}

    def size_of(self, meta: Meta) -> int:
        return len(meta["pairs"])

    def args_length(self, size: int) -> int:
        return 2 * size

    def content_length(self, size: int) -> int:
        return 2

    def sample_answer(self, rng: random.Random, meta: Meta) -> tuple[str, ...]:
        return tuple(rng.choice(meta["pairs"]))

    def reference_answer(self, meta: Meta) -> tuple[str, ...]:
        return tuple(meta["pairs"][0])

    def is_valid(self, meta: Meta, words: tuple[str, ...]) -> bool:
        return words in {tuple(p) for p in meta["pairs"]}

    def count_answers(self, meta: Meta) -> int:
        return len(meta["pairs"])

    def enumerate_answers(self, meta: Meta) -> list[tuple[str, ...]]:
        return [tuple(p) for p in meta["pairs"]]

    def item_integrity(self, meta: Meta, words: tuple[str, ...]) -> bool | None:
        return self.is_valid(meta, words)


register(
    PickPairTask(
        name="pick_pair",
        description="output any one listed two-token pair (C = I(first; second))",
        min_size=3,
        max_size=5,
        default_sizes=(3, 4, 5),
        size_meaning="number of listed pairs M",
    )
)
