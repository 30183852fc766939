"""``latin4`` / ``latin4_r1``: any 4x4 Latin square over four given symbols.

Prompt: the four distinct symbols (items A-P) in a random order; ``latin4_r1`` adds ``| <first row>``
(a permutation of the symbols). Answer: 16 cells row-major; valid iff every row and every column is
a permutation of the symbols (and, for r1, the first row matches). The 576 Latin squares of order 4
are enumerated once over {0, 1, 2, 3} and relabelled with the symbols in prompt order, so symbol k
of the prompt stands for value k. C(Y|X): 32 - log2 576 = 22.830 bits (latin4);
12 log2 3 - log2 24 = 14.435 bits (latin4_r1, 24 completions).
"""

from __future__ import annotations

import random
from dataclasses import dataclass
from functools import lru_cache
from typing import Any, Sequence

from dllm.tasks.base import Meta, Task, register
from dllm.tasks.format import split_groups
from dllm.tasks.items import check_distinct, flatten, parse_items, sample_items
from dllm.tasks.vocab import BAR

ORDER = 4
Square = tuple[int, ...]  # 16 values in 0..3, row-major


@lru_cache(maxsize=1)
def all_squares() -> tuple[Square, ...]:
    """The 576 Latin squares of order 4 over {0, 1, 2, 3}, in lexicographic order."""
    found: list[Square] = []
    cells = [0] * (ORDER * ORDER)

    def fill(i: int) -> None:
        if i == len(cells):
            found.append(tuple(cells))
            return
        r, c = divmod(i, ORDER)
        used = {cells[r * ORDER + k] for k in range(c)} | {cells[k * ORDER + c] for k in range(r)}
        for v in range(ORDER):
            if v not in used:
                cells[i] = v
                fill(i + 1)

    fill(0)
    return tuple(found)


def is_latin(values: Sequence[str], symbols: Sequence[str]) -> bool:
    """Every row and column of the 4x4 grid ``values`` is a permutation of ``symbols``."""
    if len(values) != ORDER * ORDER:
        return False
    want = sorted(symbols)
    rows = [values[r * ORDER : (r + 1) * ORDER] for r in range(ORDER)]
    cols = [values[c :: ORDER] for c in range(ORDER)]
    return all(sorted(line) == want for line in rows + cols)


@dataclass(frozen=True, kw_only=True)
class LatinTask(Task):
    first_row: bool = False  # latin4_r1: the prompt also fixes the first row

    def _squares(self, meta: Meta) -> list[tuple[str, ...]]:
        symbols = meta["symbols"]
        squares = [tuple(symbols[v] for v in sq) for sq in all_squares()]
        if self.first_row:
            row = tuple(meta["row"])
            squares = [sq for sq in squares if sq[:ORDER] == row]
        return squares

    def sample_problem(self, rng: random.Random, size: int) -> dict[str, Any]:
        symbols = tuple(w for (w,) in sample_items(rng, "1tok", ORDER))
        meta: dict[str, Any] = {"symbols": symbols}
        if self.first_row:
            row = list(symbols)
            rng.shuffle(row)
            meta["row"] = tuple(row)
        return meta

    def format_args(self, meta: Meta) -> tuple[str, ...]:
        return tuple(meta["symbols"]) + ((BAR, *meta["row"]) if self.first_row else ())

    def parse_args(self, args: Sequence[str]) -> dict[str, Any]:
        groups = split_groups(args)
        if len(groups) != 1 + self.first_row:
            raise ValueError(f"{self.name}: expected {1 + self.first_row} '|'-separated groups, got {len(groups)}")
        symbols = parse_items("1tok", groups[0], "symbols")
        check_distinct("1tok", symbols, "symbols")
        if len(symbols) != ORDER:
            raise ValueError(f"{self.name}: expected {ORDER} symbols, got {' '.join(groups[0])!r}")
        meta: dict[str, Any] = {"symbols": flatten(symbols)}
        if self.first_row:
            if sorted(groups[1]) != sorted(meta["symbols"]):
                raise ValueError(f"{self.name}: first row {' '.join(groups[1])!r} is not a permutation of the symbols")
            meta["row"] = tuple(groups[1])
        return meta

    def size_of(self, meta: Meta) -> int:
        return len(meta["symbols"])

    def args_length(self, size: int) -> int:
        return ORDER + (1 + ORDER) * self.first_row

    def content_length(self, size: int) -> int:
        return ORDER * ORDER

    def sample_answer(self, rng: random.Random, meta: Meta) -> tuple[str, ...]:
        return rng.choice(self._squares(meta))

    def reference_answer(self, meta: Meta) -> tuple[str, ...]:
        return self._squares(meta)[0]

    def is_valid(self, meta: Meta, words: tuple[str, ...]) -> bool:
        if not is_latin(words, meta["symbols"]):
            return False
        return not self.first_row or words[:ORDER] == tuple(meta["row"])

    def count_answers(self, meta: Meta) -> int:
        return 24 if self.first_row else 576

    def enumerate_answers(self, meta: Meta) -> list[tuple[str, ...]]:
        return self._squares(meta)


_COMMON = dict(min_size=ORDER, max_size=ORDER, default_sizes=(ORDER,), size_meaning="square order (always 4)")
register(LatinTask(name="latin4", description="any 4x4 Latin square over four given symbols", **_COMMON))
register(
    LatinTask(
        name="latin4_r1",
        description="complete a 4x4 Latin square whose symbols and first row are given",
        first_row=True,
        **_COMMON,
    ),
    aliases=("latin4-r1",),
)
