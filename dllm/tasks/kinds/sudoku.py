"""``sudoku4``: complete a 4x4 Sudoku with a unique solution (C(Y|X) = 0).

Prompt: 16 digits row-major, ``0`` = blank, digits 1-4 otherwise. Answer: the 16 digits of the
solution. The size is the clue count c. Generation: enumerate the 288 valid grids once; draw a
solution uniformly; visit the cells in random order and blank each one only if the puzzle keeps a
unique solution (checked against all 288 grids), stopping at c clues; a pass that cannot get down to
c clues is discarded and a fresh solution drawn.
"""

from __future__ import annotations

import random
from dataclasses import dataclass
from functools import lru_cache
from typing import Any, Sequence

import numpy as np

from dllm.tasks.base import Meta, SingleAnswerTask, register

CELLS = 16


def _peers(cell: int) -> set[int]:
    r, c = divmod(cell, 4)
    box = [(r // 2 * 2 + i) * 4 + c // 2 * 2 + j for i in range(2) for j in range(2)]
    return ({r * 4 + k for k in range(4)} | {k * 4 + c for k in range(4)} | set(box)) - {cell}


@lru_cache(maxsize=1)
def all_grids() -> np.ndarray:
    """The 288 valid 4x4 Sudoku grids, ``[288, 16]`` int8, in backtracking (lexicographic) order."""
    peers = [_peers(i) for i in range(CELLS)]
    grid = [0] * CELLS
    found: list[list[int]] = []

    def fill(cell: int) -> None:
        if cell == CELLS:
            found.append(list(grid))
            return
        for d in range(1, 5):
            if all(grid[p] != d for p in peers[cell]):
                grid[cell] = d
                fill(cell + 1)
                grid[cell] = 0

    fill(0)
    return np.asarray(found, dtype=np.int8)


def solutions(puzzle: Sequence[int]) -> np.ndarray:
    """Indices of the grids consistent with the clues (non-zero cells) of ``puzzle``."""
    cells = [i for i, v in enumerate(puzzle) if v]
    grids = all_grids()
    match = np.all(grids[:, cells] == np.asarray([puzzle[i] for i in cells], dtype=np.int8), axis=1)
    return np.flatnonzero(match)


def make_puzzle(rng: random.Random, clues: int) -> tuple[tuple[int, ...], tuple[int, ...]]:
    """(puzzle, solution) with exactly ``clues`` clues and a unique solution."""
    grids = all_grids()
    while True:
        solution = tuple(int(v) for v in grids[rng.randrange(len(grids))])
        puzzle = list(solution)
        order = list(range(CELLS))
        rng.shuffle(order)
        for cell in order:
            if sum(1 for v in puzzle if v) == clues:
                break
            puzzle[cell] = 0
            if len(solutions(puzzle)) != 1:
                puzzle[cell] = solution[cell]
        if sum(1 for v in puzzle if v) == clues:
            return tuple(puzzle), solution


@dataclass(frozen=True, kw_only=True)
class SudokuTask(SingleAnswerTask):
    def sample_problem(self, rng: random.Random, size: int) -> dict[str, Any]:
        puzzle, solution = make_puzzle(rng, size)
        return {"puzzle": puzzle, "solution": solution}

    def format_args(self, meta: Meta) -> tuple[str, ...]:
        return tuple(str(v) for v in meta["puzzle"])

    def parse_args(self, args: Sequence[str]) -> dict[str, Any]:
        if len(args) != CELLS or any(w not in "01234" or len(w) != 1 for w in args):
            raise ValueError(f"{self.name}: expected 16 digits 0-4 (0 = blank), got {' '.join(args)!r}")
        puzzle = tuple(int(w) for w in args)
        found = solutions(puzzle)
        if len(found) != 1:
            raise ValueError(f"{self.name}: puzzle {''.join(args)} has {len(found)} solutions, not exactly 1")
        return {"puzzle": puzzle, "solution": tuple(int(v) for v in all_grids()[found[0]])}

    def size_of(self, meta: Meta) -> int:
        return sum(1 for v in meta["puzzle"] if v)

    def args_length(self, size: int) -> int:
        return CELLS

    def content_length(self, size: int) -> int:
        return CELLS

    def reference_answer(self, meta: Meta) -> tuple[str, ...]:
        return tuple(str(v) for v in meta["solution"])



register(
    SudokuTask(
        name="sudoku4",
        description="complete a 4x4 Sudoku (16 digits row-major, 0 = blank) with a unique solution",
        min_size=4,
        max_size=12,
        default_sizes=(6, 8, 10, 12),
        size_meaning="number of clues c",
    )
)
