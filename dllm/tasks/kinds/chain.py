"""``chain`` / ``chain_must``: a domino chain of digits with many valid answers.

Prompt: ``s | m`` (start digit s in 1..9, length m = the size); ``chain_must`` adds ``| r``, a
required digit with r != s (r = s would already be satisfied, so the generator never draws it).
Answer: 2m digits ``d1 e1 d2 e2 ... dm em`` with ``d1 = s``, ``d(i+1) = e(i)``, all digits 1-9
(``chain_must``: r appears somewhere). Writing x0 = s and xi = ei, answer position p (0-based)
holds x((p+1)//2), so the answers are the free choices of x1..xm: 9^m of them (9^m - 8^m with r),
and C(Y|X) = (m-1) log2 9 for ``chain``.

Too many answers to enumerate (9^8 = 43M), so marginals come from exact counting: committed words
shrink each variable's allowed set A_v, and with the must-digit r the number of answers with
x_v = x is prod_{u != v} |A_u| if x = r, else prod_{u != v} |A_u| - prod_{u != v} |A_u minus r|.

The prompt space is tiny (9 prompts per length, 72 with r), so these tasks do not hold their test
prompts out of training (``holdout=False``).
"""

from __future__ import annotations

import itertools
import math
import random
from dataclasses import dataclass
from typing import Any, Mapping, Sequence

from dllm.tasks.answers import Marginals, check_committed
from dllm.tasks.base import Meta, Task, register
from dllm.tasks.format import split_groups
from dllm.tasks.vocab import BAR, DIGITS, EOS, vocabulary

CHAIN_DIGITS: tuple[str, ...] = DIGITS[1:]  # 1..9


def chain_words(xs: Sequence[int]) -> tuple[str, ...]:
    """Answer words of the chain x0 -> x1 -> ... -> xm: d1 e1 d2 e2 ... = x0 x1 x1 x2 ..."""
    return tuple(str(v) for i in range(1, len(xs)) for v in (xs[i - 1], xs[i]))


def variable_of(pos: int) -> int:
    """Index of the chain variable written at answer position ``pos``."""
    return (pos + 1) // 2


@dataclass(frozen=True, kw_only=True)
class ChainTask(Task):
    must: bool = False

    # --------------------------------------------------------------------------- problem side
    def sample_problem(self, rng: random.Random, size: int) -> dict[str, Any]:
        start = rng.randint(1, 9)
        meta: dict[str, Any] = {"start": start, "length": size}
        if self.must:
            meta["must"] = rng.choice([d for d in range(1, 10) if d != start])
        return meta

    def format_args(self, meta: Meta) -> tuple[str, ...]:
        words = (str(meta["start"]), BAR, str(meta["length"]))
        return words + ((BAR, str(meta["must"])) if self.must else ())

    def parse_args(self, args: Sequence[str]) -> dict[str, Any]:
        groups = split_groups(args)
        want = 3 if self.must else 2
        if len(groups) != want or any(len(g) != 1 or g[0] not in CHAIN_DIGITS for g in groups):
            form = "s | m | r" if self.must else "s | m"
            raise ValueError(f"{self.name}: expected '{form}' with digits 1-9, got {' '.join(args)!r}")
        meta: dict[str, Any] = {"start": int(groups[0][0]), "length": int(groups[1][0])}
        if self.must:
            meta["must"] = int(groups[2][0])
            if meta["must"] == meta["start"]:
                raise ValueError(f"{self.name}: required digit {meta['must']} equals the start digit")
        return meta

    def size_of(self, meta: Meta) -> int:
        return meta["length"]

    def args_length(self, size: int) -> int:
        return 5 if self.must else 3

    # --------------------------------------------------------------------------- answer side
    def content_length(self, size: int) -> int:
        return 2 * size

    def sample_answer(self, rng: random.Random, meta: Meta) -> tuple[str, ...]:
        m = meta["length"]
        while True:
            xs = [meta["start"]] + [rng.randint(1, 9) for _ in range(m)]
            if not self.must or meta["must"] in xs:
                return chain_words(xs)

    def reference_answer(self, meta: Meta) -> tuple[str, ...]:
        """Lexicographically smallest answer: x1..xm = 1 ... 1 (r)."""
        free = [1] * meta["length"]
        if self.must:
            free[-1] = meta["must"]
        return chain_words([meta["start"], *free])

    def is_valid(self, meta: Meta, words: tuple[str, ...]) -> bool:
        if len(words) != 2 * meta["length"] or any(w not in CHAIN_DIGITS for w in words):
            return False
        linked = all(words[i] == words[i - 1] for i in range(2, len(words), 2))
        return linked and words[0] == str(meta["start"]) and (not self.must or str(meta["must"]) in words)

    def count_answers(self, meta: Meta) -> int:
        m = meta["length"]
        return 9**m - 8**m if self.must else 9**m

    def enumerate_answers(self, meta: Meta) -> list[tuple[str, ...]]:
        out = []
        for free in itertools.product(range(1, 10), repeat=meta["length"]):
            if not self.must or meta["must"] in free:
                out.append(chain_words([meta["start"], *free]))
        return out

    def marginals(self, meta: Meta, committed: Mapping[int, str]) -> Marginals | None:
        m = meta["length"]
        length = self.answer_length(m)
        vocab = vocabulary()
        allowed = [{str(meta["start"])}] + [set(CHAIN_DIGITS) for _ in range(m)]
        for pos, wid in check_committed(committed, length).items():
            word = vocab[wid]
            if pos >= 2 * m:
                if word != EOS:
                    return None
                continue
            allowed[variable_of(pos)] &= {word}
        if not all(allowed):
            return None
        per_var = self._variable_marginals(allowed, str(meta["must"]) if self.must else None)
        if per_var is None:
            return None
        return [per_var[variable_of(p)] if p < 2 * m else {EOS: 1.0} for p in range(length)]

    @staticmethod
    def _variable_marginals(allowed: list[set[str]], must: str | None) -> list[dict[str, float]] | None:
        """Distribution of each chain variable over the answers allowed by ``allowed`` (exact counts)."""
        sizes = [len(a) for a in allowed]
        without = [len(a - {must}) for a in allowed]
        total = math.prod(sizes) - (math.prod(without) if must else 0)
        if total == 0:
            return None
        out = []
        for v, values in enumerate(allowed):
            rest = math.prod(sizes[:v] + sizes[v + 1 :])
            rest_without = math.prod(without[:v] + without[v + 1 :])
            counts = {x: rest if (must is None or x == must) else rest - rest_without for x in sorted(values)}
            out.append({x: c / total for x, c in counts.items() if c})
        return out


_COMMON = dict(min_size=2, max_size=8, default_sizes=(4, 6, 8), size_meaning="chain length m", holdout=False)
register(ChainTask(name="chain", description="any digit chain d1 e1 d2 e2 ... with d1 = s, d(i+1) = e(i)", **_COMMON))
register(
    ChainTask(
        name="chain_must",
        description="a digit chain from s of length m that contains the digit r somewhere",
        must=True,
        **_COMMON,
    )
)
