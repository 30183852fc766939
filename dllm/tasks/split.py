"""The fixed, versioned test split and the training-side hold-out check.

Instance i of ``test_split(task, size)`` is generated from ``random.Random(seed)`` with ``seed`` =
the first 8 bytes (big-endian) of SHA-256 of ``f"{SPLIT_VERSION}|{task}|{size}|{i}"``, so the split
is the same on every machine and Python build. Changing a generator changes the split: bump
``SPLIT_VERSION`` when that is intended (``tests/eval`` pins digests of a few prompts).

Training draws fresh examples and drops those for which :func:`is_test_prompt` is true: the prompt
appears among the first ``TEST_SPLIT_SIZE`` instances of the test split of *any* size in the task's
range. Tasks with ``holdout=False`` (``chain``, ``chain_must``: a handful of distinct prompts)
hold nothing out. Duplicated prompts inside a split are kept.
"""

from __future__ import annotations

import hashlib
import random
from functools import lru_cache

from dllm.tasks.base import Example, get_task

SPLIT_VERSION = "pbmini-v1"
TEST_SPLIT_SIZE = 50  # instances per (task, size) in the canonical split


def instance_seed(task: str, size: int, index: int) -> int:
    """Seed of test instance ``index`` (stable across machines; not Python's ``hash``)."""
    digest = hashlib.sha256(f"{SPLIT_VERSION}|{task}|{size}|{index}".encode()).digest()
    return int.from_bytes(digest[:8], "big")


def test_split(task: str, size: int | None = None, n: int = TEST_SPLIT_SIZE) -> list[Example]:
    """``n`` instances per size (all ``default_sizes`` if ``size`` is None), in a fixed order."""
    t = get_task(task)
    if not isinstance(n, int) or isinstance(n, bool) or n < 0:
        raise ValueError(f"test_split({t.name!r}): n must be an integer >= 0 (instances per size), got {n!r}")
    sizes = t.default_sizes if size is None else (t.check_size(size),)
    return [t.generate(random.Random(instance_seed(t.name, s, i)), s) for s in sizes for i in range(n)]


test_split.__test__ = False  # type: ignore[attr-defined]  # not a pytest test despite the name


@lru_cache(maxsize=None)
def _held_out_prompts(task: str) -> frozenset[tuple[str, ...]]:
    t = get_task(task)
    if not t.holdout:
        return frozenset()
    return frozenset(ex.prompt for s in t.sizes for ex in test_split(t.name, s, TEST_SPLIT_SIZE))


def is_test_prompt(ex: Example) -> bool:
    """True if ``ex``'s prompt belongs to the canonical test split of its task (any size)."""
    return ex.prompt in _held_out_prompts(get_task(ex.task).name)
