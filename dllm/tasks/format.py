"""The common sequence format: ``[BOS] <task> <args...> [SEP] <answer...> [EOS]*``.

The answer region has a fixed length ``L_ans = answer_length(task, size)`` = the maximal answer
length for that size + 1, padded with EOS (LLaDA SFT style; pads are trained on). A generated
region is read by :func:`cut_answer`: the words before the first EOS, provided every later word is
EOS; a region without EOS, or with anything but EOS after it, is unreadable (``None``) and scores 0.
"""

from __future__ import annotations

from typing import Sequence

from dllm.tasks.answers import pad
from dllm.tasks.base import Example, Task, get_task
from dllm.tasks.vocab import BAR, BOS, EOS, SEP, word_id


def prompt_words(ex: Example) -> tuple[str, ...]:
    """``[BOS] <task> <args...> [SEP]`` (both ends inclusive)."""
    return (BOS, get_task(ex.task).task_word, *ex.prompt, SEP)


def prompt_ids(ex: Example) -> list[int]:
    """:func:`prompt_words` as token ids of the task tokenizer (ids = vocabulary indices)."""
    return [word_id(w) for w in prompt_words(ex)]


def prompt_length(task: str | Task, size: int) -> int:
    """Number of prompt words (BOS .. SEP) for this size; the same for every instance."""
    t = get_task(task)
    return t.args_length(t.check_size(size)) + 3


def answer_length(task: str | Task, size: int) -> int:
    """L_ans: the fixed answer-region length for this task and size (max answer length + 1)."""
    return get_task(task).answer_length(size)


def sequence_length(task: str | Task, size: int) -> int:
    return prompt_length(task, size) + answer_length(task, size)


def max_sequence_length(task: str | Task) -> int:
    """Longest full sequence over the task's whole size range."""
    t = get_task(task)
    return max(sequence_length(t, s) for s in t.sizes)


def target_words(ex: Example) -> tuple[str, ...]:
    """The answer EOS-padded to L_ans: the training target of the answer region."""
    return pad(ex.answer, answer_length(ex.task, ex.size))


def sequence_words(ex: Example) -> tuple[str, ...]:
    """Prompt and padded answer: the full training sequence."""
    return prompt_words(ex) + target_words(ex)


def cut_answer(region: Sequence[str]) -> tuple[str, ...] | None:
    """Words before the first EOS, or ``None`` if there is no EOS or a non-EOS word follows it."""
    words = tuple(region)
    if EOS not in words:
        return None
    cut = words.index(EOS)
    if any(w != EOS for w in words[cut + 1 :]):
        return None
    return words[:cut]


def split_sequence(words: Sequence[str]) -> tuple[tuple[str, ...], tuple[str, ...]]:
    """Split a full sequence at its first ``[SEP]``: (prompt words incl. SEP, answer region)."""
    words = tuple(words)
    if SEP not in words:
        raise ValueError(f"sequence has no {SEP} word: {' '.join(words)!r}")
    cut = words.index(SEP) + 1
    return words[:cut], words[cut:]


def split_groups(args: Sequence[str]) -> list[tuple[str, ...]]:
    """Split prompt arguments into their ``|``-separated groups."""
    groups: list[list[str]] = [[]]
    for w in args:
        if w == BAR:
            groups.append([])
        else:
            groups[-1].append(w)
    return [tuple(g) for g in groups]
