"""Module-level entry points that dispatch on ``Example.task``: generation, scoring, answer sets,
oracle marginals, C(Y|X), and parsing a prompt back into an ``Example``."""

from __future__ import annotations

import random
from typing import Mapping, Sequence

from dllm.tasks.answers import Marginals, pad
from dllm.tasks.base import ENUMERATION_LIMIT, Example, Task, TooManyAnswersError, get_task
from dllm.tasks.format import answer_length, cut_answer
from dllm.tasks.vocab import BOS, SEP


def generate(task: str | Task, rng: random.Random, size: int) -> Example:
    """``get_task(task).generate(rng, size)``."""
    return get_task(task).generate(rng, size)


def is_valid_answer(ex: Example, words: Sequence[str]) -> bool:
    """Validity of answer words that were already cut at their EOS (no padding)."""
    return get_task(ex.task).is_valid(ex.meta, tuple(words))


def score(ex: Example, region: Sequence[str]) -> bool:
    """Exact score of a generated answer region (the words after ``[SEP]``).

    The region is cut at its first EOS (:func:`cut_answer`); no EOS, or any non-EOS word after it,
    scores False. The cut words must then be a valid answer (exact match for single-answer tasks,
    the task's validity rule for multi-answer tasks).
    """
    words = cut_answer(region)
    return words is not None and get_task(ex.task).is_valid(ex.meta, words)


def item_integrity(ex: Example, region: Sequence[str]) -> bool | None:
    """Two-token-item tasks: every item of the cut output is an input item (no chimeras, no swapped
    halves). False for an unreadable region; ``None`` for tasks without two-token items."""
    words = cut_answer(region)
    intact = get_task(ex.task).item_integrity(ex.meta, words or ())
    if intact is None:
        return None
    return words is not None and intact


def count_answers(ex: Example) -> int:
    """Number of valid answers (exact, never enumerated for ``chain``)."""
    return get_task(ex.task).count_answers(ex.meta)


def valid_answers(ex: Example, limit: int = ENUMERATION_LIMIT) -> list[tuple[str, ...]]:
    """Every valid answer, EOS-padded to L_ans; ``TooManyAnswersError`` above ``limit`` answers."""
    task = get_task(ex.task)
    count = task.count_answers(ex.meta)
    if count > limit:
        raise TooManyAnswersError(
            f"task {task.name!r} size {ex.size} has {count} valid answers (> limit {limit}); "
            f"use marginals() or count_answers() instead"
        )
    length = answer_length(task, ex.size)
    return [pad(a, length) for a in task.enumerate_answers(ex.meta)]


def marginals(ex: Example, committed: Mapping[int, str] | None = None) -> Marginals | None:
    """For each answer position 0..L_ans-1: word -> probability over the valid answers (uniform)
    that agree with ``committed`` (answer position -> word). ``None`` if no valid answer agrees.
    EOS-pad positions are ``{EOS: 1.0}``; committed positions are point masses."""
    return get_task(ex.task).marginals(ex.meta, dict(committed or {}))


def total_correlation(ex: Example) -> float | None:
    """C(Y|X) = sum_i H(Y_i) - H(Y) in bits, Y uniform over the valid answers."""
    return get_task(ex.task).total_correlation(ex.meta)


def parse_prompt(words: Sequence[str]) -> Example:
    """Rebuild the ``Example`` of a prompt ``[BOS] <task> <args...> [SEP]``.

    The problem (task, size, prompt, meta) is recovered exactly; the answer is the task's
    deterministic ``reference_answer`` (for multi-answer tasks not necessarily the one that
    ``generate`` drew). Raises ``ValueError`` on a malformed or non-canonical prompt.
    """
    words = tuple(words)
    if len(words) < 3 or words[0] != BOS or words[-1] != SEP:
        raise ValueError(f"a prompt must look like '{BOS} <task> <args...> {SEP}', got {' '.join(words)!r}")
    task = get_task(words[1])
    if words[1] != task.name:
        raise ValueError(f"task token {words[1]!r} is an alias; prompts use the canonical name {task.name!r}")
    args = words[2:-1]
    meta = task.parse_args(args)
    size = task.check_size(task.size_of(meta))
    if task.format_args(meta) != args:
        raise ValueError(f"prompt arguments {' '.join(args)!r} are not in the canonical {task.name!r} format")
    return Example(task.name, size, args, task.reference_answer(meta), meta)
