"""Deterministic digit tasks (C(Y|X) = 0): ``add_lsb``, ``add_msb``, ``cumsum``.

``add_*``: the prompt is ``a | b`` with a and b uniform d-digit numbers (no leading zero), d is the
size; the answer is a + b zero-padded to d + 1 digits. ``add_msb`` writes operands and answer in the
usual order (most significant digit first: a left-to-right decoder meets each carry before its
cause, the hard variant); ``add_lsb`` writes operands *and* answer least significant digit first
(the easy variant). ``cumsum``: n digits 1-9, answer = prefix sums mod 10.
"""

from __future__ import annotations

import random
from dataclasses import dataclass
from typing import Any, Sequence

from dllm.tasks.base import Meta, SingleAnswerTask, register
from dllm.tasks.format import split_groups
from dllm.tasks.vocab import BAR, DIGITS


def digits(value: int, width: int, lsb_first: bool) -> tuple[str, ...]:
    """``value`` as ``width`` zero-padded digit words, optionally least significant first."""
    text = str(value).zfill(width)
    if len(text) != width:
        raise ValueError(f"{value} does not fit in {width} digits")
    return tuple(reversed(text)) if lsb_first else tuple(text)


def _parse_number(words: Sequence[str], lsb_first: bool, what: str) -> int:
    if not words or any(w not in DIGITS for w in words):
        raise ValueError(f"{what} {' '.join(words)!r} is not a digit sequence")
    text = "".join(reversed(words) if lsb_first else words)
    if len(text) > 1 and text[0] == "0":
        raise ValueError(f"{what} {' '.join(words)!r} has a leading zero")
    return int(text)


@dataclass(frozen=True, kw_only=True)
class AddTask(SingleAnswerTask):
    lsb_first: bool

    def sample_problem(self, rng: random.Random, size: int) -> dict[str, Any]:
        lo, hi = 10 ** (size - 1), 10**size - 1
        return {"a": rng.randint(lo, hi), "b": rng.randint(lo, hi), "digits": size}

    def format_args(self, meta: Meta) -> tuple[str, ...]:
        d = meta["digits"]
        return (*digits(meta["a"], d, self.lsb_first), BAR, *digits(meta["b"], d, self.lsb_first))

    def parse_args(self, args: Sequence[str]) -> dict[str, Any]:
        groups = split_groups(args)
        if len(groups) != 2 or len(groups[0]) != len(groups[1]):
            raise ValueError(f"{self.name}: expected 'a | b' with equally many digits, got {' '.join(args)!r}")
        a = _parse_number(groups[0], self.lsb_first, "operand")
        b = _parse_number(groups[1], self.lsb_first, "operand")
        return {"a": a, "b": b, "digits": len(groups[0])}

    def size_of(self, meta: Meta) -> int:
        return meta["digits"]

    def args_length(self, size: int) -> int:
        return 2 * size + 1

    def content_length(self, size: int) -> int:
        return size + 1

    def reference_answer(self, meta: Meta) -> tuple[str, ...]:
        return digits(meta["a"] + meta["b"], meta["digits"] + 1, self.lsb_first)


@dataclass(frozen=True, kw_only=True)
class CumsumTask(SingleAnswerTask):
    def sample_problem(self, rng: random.Random, size: int) -> dict[str, Any]:
        return {"values": tuple(rng.randint(1, 9) for _ in range(size))}

    def format_args(self, meta: Meta) -> tuple[str, ...]:
        return tuple(str(v) for v in meta["values"])

    def parse_args(self, args: Sequence[str]) -> dict[str, Any]:
        if not args or any(w not in DIGITS[1:] for w in args):
            raise ValueError(f"{self.name}: expected digits 1-9, got {' '.join(args)!r}")
        return {"values": tuple(int(w) for w in args)}

    def size_of(self, meta: Meta) -> int:
        return len(meta["values"])

    def args_length(self, size: int) -> int:
        return size

    def content_length(self, size: int) -> int:
        return size

    def reference_answer(self, meta: Meta) -> tuple[str, ...]:
        out, total = [], 0
        for v in meta["values"]:
            total = (total + v) % 10
            out.append(str(total))
        return tuple(out)


_ADD = dict(min_size=2, max_size=8, default_sizes=(2, 3, 4, 5), size_meaning="operand digits d")
register(AddTask(name="add_lsb", description="a + b, digits least significant first", lsb_first=True, **_ADD))
register(AddTask(name="add_msb", description="a + b, digits most significant first", lsb_first=False, **_ADD))
register(
    CumsumTask(
        name="cumsum",
        description="prefix sums mod 10 of n digits 1-9",
        min_size=3,
        max_size=8,
        default_sizes=(4, 6, 8),
        size_meaning="number of digits n",
    )
)
