"""``Example``, the ``Task`` interface, and the ``tasks`` registry.

A task separates the *problem* (``meta``: what the prompt states, e.g. the list and the new item)
from the *answer* (one valid output). Every task implements the same small set of methods:

- problem side: ``sample_problem(rng, size) -> meta``, ``format_args(meta) -> words`` and its
  inverse ``parse_args(words) -> meta``, ``size_of(meta)``, ``args_length(size)``;
- answer side: ``content_length(size)`` (answer words without EOS), ``sample_answer(rng, meta)``
  (uniform over the valid answers), ``reference_answer(meta)`` (deterministic), ``is_valid(meta,
  words)``, ``count_answers(meta)``, ``enumerate_answers(meta)`` and ``marginals(meta, committed)``.

The module-level helpers in ``api.py`` / ``format.py`` dispatch on ``Example.task``.
"""

from __future__ import annotations

import math
import random
from abc import ABC, abstractmethod
from dataclasses import dataclass, field
from typing import Any, Mapping, Sequence

from dllm.tasks.answers import AnswerTable, Marginals, entropy_bits, table_marginals
from dllm.registry import Registry

Meta = Mapping[str, Any]

# Enumerating more answers than this is refused (valid_answers raises TooManyAnswersError).
ENUMERATION_LIMIT = 60_000


class TooManyAnswersError(ValueError):
    """The answer set is too large to enumerate; use marginals / count_answers instead."""


@dataclass(frozen=True)
class Example:
    """One problem instance.

    ``prompt`` holds the argument words only (after the task token, before ``[SEP]``);
    ``prompt_words(ex)`` adds ``[BOS] <task>`` and ``[SEP]``. ``answer`` is one valid answer
    without EOS padding (for multi-answer tasks drawn uniformly from the valid answers by
    ``generate``). ``meta`` is the parsed problem; it is a function of ``prompt`` and is excluded
    from the hash.
    """

    task: str
    size: int
    prompt: tuple[str, ...]
    answer: tuple[str, ...]
    meta: Mapping[str, Any] = field(default_factory=dict, hash=False)


@dataclass(frozen=True, kw_only=True)
class Task(ABC):
    name: str
    description: str
    min_size: int
    max_size: int
    default_sizes: tuple[int, ...]
    size_meaning: str  # what the size parameter counts, e.g. "list length n"
    holdout: bool = True  # False: the prompt space is too small to hold test prompts out of training
    suite: str = "pb-mini"  # the suite whose default runs include the task (``SUITES``)
    word: str = ""  # the prompt's task word; "" = ``name`` (a training-only variant may carry a suite task's word)

    @property
    def task_word(self) -> str:
        """The word after ``[BOS]`` in this task's prompts."""
        return self.word or self.name

    def __post_init__(self) -> None:
        bad = [s for s in self.default_sizes if not self.min_size <= s <= self.max_size]
        if bad:
            raise ValueError(f"task {self.name!r}: default sizes {bad} outside [{self.min_size}, {self.max_size}]")

    # ----------------------------------------------------------------------------- sizes
    @property
    def sizes(self) -> range:
        return range(self.min_size, self.max_size + 1)

    def check_size(self, size: int) -> int:
        if not isinstance(size, int) or isinstance(size, bool) or not self.min_size <= size <= self.max_size:
            raise ValueError(
                f"size {size!r} is out of range for task {self.name!r} ({self.size_meaning}); "
                f"valid sizes: {self.min_size}..{self.max_size}"
            )
        return size

    def answer_length(self, size: int) -> int:
        """L_ans: the fixed answer region (maximal answer length for this size + 1 EOS)."""
        return self.content_length(self.check_size(size)) + 1

    # ----------------------------------------------------------------------------- problem side
    @abstractmethod
    def sample_problem(self, rng: random.Random, size: int) -> dict[str, Any]: ...

    @abstractmethod
    def format_args(self, meta: Meta) -> tuple[str, ...]: ...

    @abstractmethod
    def parse_args(self, args: Sequence[str]) -> dict[str, Any]:
        """Inverse of ``format_args``; raises ``ValueError`` on a malformed argument list."""

    @abstractmethod
    def size_of(self, meta: Meta) -> int: ...

    @abstractmethod
    def args_length(self, size: int) -> int:
        """Number of argument words for this size (the prompt is this + 3)."""

    # ----------------------------------------------------------------------------- answer side
    @abstractmethod
    def content_length(self, size: int) -> int:
        """Maximal answer length (words, without EOS) for this size."""

    @abstractmethod
    def sample_answer(self, rng: random.Random, meta: Meta) -> tuple[str, ...]:
        """One answer drawn uniformly from the valid answers."""

    @abstractmethod
    def reference_answer(self, meta: Meta) -> tuple[str, ...]:
        """A deterministic valid answer (used by ``parse_prompt``)."""

    @abstractmethod
    def is_valid(self, meta: Meta, words: tuple[str, ...]) -> bool:
        """Exact validity of an answer (already cut at its EOS)."""

    @abstractmethod
    def count_answers(self, meta: Meta) -> int: ...

    @abstractmethod
    def enumerate_answers(self, meta: Meta) -> list[tuple[str, ...]]:
        """All valid answers, unpadded, in a fixed order (callers check ``count_answers`` first)."""

    def answer_table(self, meta: Meta) -> AnswerTable:
        """The enumerated answers as an EOS-padded id table (override for a faster build)."""
        return AnswerTable.build(self.enumerate_answers(meta), self.answer_length(self.size_of(meta)))

    def marginals(self, meta: Meta, committed: Mapping[int, str]) -> Marginals | None:
        """Per answer position (EOS region included), the word distribution over the valid answers
        consistent with ``committed``; ``None`` if none is. Default: filter the enumerated table."""
        return table_marginals(self, meta, committed)

    def item_integrity(self, meta: Meta, words: tuple[str, ...]) -> bool | None:
        """For tasks with two-token items: every output item is an input item. ``None`` elsewhere."""
        return None

    # ----------------------------------------------------------------------------- derived
    def generate(self, rng: random.Random, size: int) -> Example:
        """A seeded, deterministic instance: same ``rng`` state and size give the same example."""
        self.check_size(size)
        meta = self.sample_problem(rng, size)
        answer = self.sample_answer(rng, meta)
        return Example(self.name, size, self.format_args(meta), answer, meta)

    def total_correlation(self, meta: Meta) -> float | None:
        """C(Y|X) in bits under the uniform distribution over valid answers."""
        margs = self.marginals(meta, {})
        if margs is None:
            return None
        c = sum(entropy_bits(m) for m in margs) - math.log2(self.count_answers(meta))
        return max(c, 0.0)  # clamp float round-off below zero


tasks: Registry[Task] = Registry("task")


def register(task: Task, *, aliases: tuple[str, ...] = ()) -> Task:
    """Add a task instance to the registry under its own name."""
    tasks.add(task.name, task, aliases=aliases, description=task.description)
    return task


def get_task(name: str | Task) -> Task:
    """The registered task called ``name``; the error lists the valid task names."""
    if isinstance(name, Task):
        return name
    return tasks.get(name)


class SingleAnswerTask(Task):
    """Single-answer task: every method follows from ``reference_answer``."""

    def sample_answer(self, rng: random.Random, meta: Meta) -> tuple[str, ...]:
        return self.reference_answer(meta)

    def is_valid(self, meta: Meta, words: tuple[str, ...]) -> bool:
        return words == self.reference_answer(meta)

    def count_answers(self, meta: Meta) -> int:
        return 1

    def enumerate_answers(self, meta: Meta) -> list[tuple[str, ...]]:
        return [self.reference_answer(meta)]
