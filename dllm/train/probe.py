"""Exact match of a model or checkpoint on single ``TASK:SIZE`` cases, the curriculum variants included
(``lookup_kW`` / ``count_cM``, ``dllm/train/recipes/narrow_tasks.py``), which ``dllm eval-tasks`` does not
cover (they have no test split). What the long chains' stage notes were measured with (it replaces the
``eval`` command of the shell-era ``key_curriculum.py``)::

    python -m dllm.train --probe runs/tll/cc-9/checkpoint-0000400 lookup_long:42 count_c8:32 --n 16

One token per step (``low_confidence``, k = 1); the narrow variants are drawn from
``random.Random(123)``, the suite's tasks from their test split.
"""

from __future__ import annotations

import random
from typing import Callable, Sequence

import torch

from dllm import tasks as T
from dllm.train.recipes.narrow_tasks import NarrowCount, NarrowLookup, curriculum_task

DEFAULT_CASES = ("lookup_k1:8", "lookup_k1:16", "lookup_k2:8", "lookup_k2:32", "lookup_long:4", "lookup_long:8",
                 "lookup_long:16", "lookup_long:42", "lookup_long:85")


def parse_case(case: str) -> tuple[str, int]:
    """``TASK:SIZE`` -> (registered task name, size); a malformed case is refused by name."""
    name, _, size = case.partition(":")
    if not name or not size.isdigit():
        raise ValueError(f"{case!r}: expected TASK:SIZE, e.g. lookup_long:42")
    task = T.get_task(curriculum_task(name))
    task.check_size(int(size))
    return task.name, int(size)


def examples_of(task_name: str, size: int, n: int) -> list[T.Example]:
    """``n`` examples: the narrow variants from ``random.Random(123)``, the suite's from the test split."""
    task = T.get_task(task_name)
    if isinstance(task, (NarrowLookup, NarrowCount)):
        rng = random.Random(123)
        return [task.generate(rng, size) for _ in range(n)]
    return T.test_split(task_name, size, n=n)


def probe(model_name: str, cases: Sequence[str] = DEFAULT_CASES, n: int = 16, threads: int = 1,
          log: Callable[[str], None] = print) -> list[tuple[str, float]]:
    """Exact match (one token per step) of ``model_name`` on each ``TASK:SIZE`` case, ``n`` examples each;
    every case is checked before the model loads. Returns (case, percent) pairs and logs one line each."""
    from dllm.scoring.exact_match import decode_and_score, load_model

    if not isinstance(n, int) or n < 1:
        raise ValueError(f"probe: n must be an integer >= 1, got {n!r}")
    parsed = [(case, *parse_case(case)) for case in cases]
    torch.set_num_threads(threads)
    model = load_model(model_name)
    scores = []
    for case, task_name, size in parsed:
        tally = decode_and_score(model, examples_of(task_name, size, n))
        percent = 100 * sum(tally.correct.values()) / tally.examples
        words = T.get_task(task_name).args_length(size) + 3
        log(f"{model_name} {case} ({words} words): {percent:.1f}% of {tally.examples}")
        scores.append((case, percent))
    return scores


__all__ = ["DEFAULT_CASES", "examples_of", "parse_case", "probe"]
