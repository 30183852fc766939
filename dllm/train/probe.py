"""Exact match of a model or checkpoint on single ``TASK:SIZE`` cases, the curriculum variants included
(``lookup_kW`` / ``count_cM``, ``dllm/train/recipes/narrow_tasks.py``), which ``dllm eval-tasks`` does not
cover (they have no test split). What the long chains' stage notes were measured with (it replaces the
``eval`` command of the shell-era ``key_curriculum.py``)::

    python -m dllm.train.probe runs/tll/cc-9/checkpoint-0000400 lookup_long:42 count_c8:32 --n 16

One token per step (``low_confidence``, k = 1); the narrow variants are drawn from
``random.Random(123)``, the suite's tasks from their test split.
"""

from __future__ import annotations

import argparse
import random
import sys
from typing import Optional, Sequence

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


def main(argv: Optional[Sequence[str]] = None) -> int:
    from dllm.eval.exact_match import decode_and_score, load_model

    ap = argparse.ArgumentParser(prog="python -m dllm.train.probe", description=__doc__.split("\n\n")[0])
    ap.add_argument("model", help="an embedded model name or a checkpoint directory")
    ap.add_argument("cases", nargs="*", default=list(DEFAULT_CASES), help="TASK:SIZE cases")
    ap.add_argument("--n", type=int, default=16, help="examples per case")
    ap.add_argument("--threads", type=int, default=1)
    args = ap.parse_args(argv)
    if args.n < 1:
        ap.error(f"--n must be >= 1, got {args.n}")
    try:
        cases = [(case, *parse_case(case)) for case in args.cases]
    except (ValueError, KeyError) as err:
        ap.error(str(err))
    torch.set_num_threads(args.threads)
    model = load_model(args.model)
    for case, task_name, size in cases:
        tally = decode_and_score(model, examples_of(task_name, size, args.n))
        words = T.get_task(task_name).args_length(size) + 3
        print(f"{args.model} {case} ({words} words): {100 * sum(tally.correct.values()) / tally.examples:.1f}% "
              f"of {tally.examples}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
