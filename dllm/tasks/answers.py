"""Answer sets as tables of word ids: marginals consistent with committed words, entropies.

The oracle denoiser needs, for each answer position, the distribution of the word there over the
valid answers that agree with the words already committed (uniform over valid answers). For every
task whose answer set is small (<= 8! rows) this is a filter over an ``[N, L_ans]`` id table plus one
``bincount`` per position; tables are cached per (task, prompt).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from functools import lru_cache
from typing import TYPE_CHECKING, Any, Mapping, Sequence

import numpy as np

from dllm.tasks.vocab import EOS, vocabulary, word_id

if TYPE_CHECKING:
    from dllm.tasks.base import Task

# One dict per answer position: word -> probability (only words with probability > 0).
Marginals = list[dict[str, float]]


def pad(words: Sequence[str], length: int) -> tuple[str, ...]:
    """``words`` followed by EOS up to ``length`` (``ValueError`` if it does not fit)."""
    if len(words) > length:
        raise ValueError(f"answer of {len(words)} words does not fit an answer region of {length}")
    return tuple(words) + (EOS,) * (length - len(words))


def entropy_bits(dist: Mapping[str, float]) -> float:
    return -sum(p * math.log2(p) for p in dist.values() if p > 0.0)


def check_committed(committed: Mapping[int, str], length: int) -> dict[int, int]:
    """Validate positions (0-based within the answer region) and words; return position -> id."""
    out = {}
    for pos, word in committed.items():
        if not isinstance(pos, int) or not 0 <= pos < length:
            raise ValueError(f"committed position {pos!r} is outside the answer region 0..{length - 1}")
        out[pos] = word_id(word)
    return out


@dataclass(frozen=True, eq=False)
class AnswerTable:
    ids: np.ndarray  # [N, L_ans] int16 word ids, EOS-padded, one row per valid answer

    @classmethod
    def build(cls, answers: Sequence[Sequence[str]], length: int) -> "AnswerTable":
        rows = [[word_id(w) for w in pad(a, length)] for a in answers]
        return cls(np.asarray(rows, dtype=np.int16).reshape(len(rows), length))

    def marginals(self, committed: Mapping[int, str]) -> Marginals | None:
        n, length = self.ids.shape
        keep = np.ones(n, dtype=bool)
        for pos, wid in check_committed(committed, length).items():
            keep &= self.ids[:, pos] == wid
        rows = self.ids[keep]  # [N', L_ans]
        total = rows.shape[0]
        if total == 0:
            return None
        vocab = vocabulary()
        out: Marginals = []
        for pos in range(length):
            counts = np.bincount(rows[:, pos], minlength=len(vocab))
            out.append({vocab[i]: counts[i] / total for i in np.flatnonzero(counts)})
        return out


@lru_cache(maxsize=32)
def _table(task: "Task", args: tuple[str, ...]) -> AnswerTable:
    return task.answer_table(task.parse_args(args))


def table_marginals(task: "Task", meta: Mapping[str, Any], committed: Mapping[int, str]) -> Marginals | None:
    """Marginals by filtering the enumerated answer table (cached per task and prompt)."""
    return _table(task, task.format_args(meta)).marginals(committed)
