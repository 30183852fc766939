"""The flags ``dllm bench spec`` shares with ``dllm bench trees``, and how a skipped method's reason is
written: ``split_list`` (comma/space separated values), ``check_temperatures``, ``check_common_args``,
``failure_reason``."""

from __future__ import annotations

import argparse
from typing import Optional, Sequence

from dllm import tasks as T


def split_list(values: Optional[Sequence[str]]) -> list[str]:
    """``["a,b", "c"]`` -> ``["a", "b", "c"]`` (argparse ``nargs="+"`` items, each comma separated)."""
    return [v.strip() for item in values or () for v in item.split(",") if v.strip()]


def check_temperatures(temps: Sequence[float]) -> None:
    bad = [t for t in temps if isinstance(t, bool) or not isinstance(t, (int, float)) or not 0 <= t < float("inf")]
    if bad or not temps:
        raise ValueError(f"temperatures must be finite numbers >= 0 (0 = greedy), got {list(temps)!r}")


def failure_reason(err: Exception) -> str:
    """One line (at most 300 characters) naming why a method was skipped."""
    text = str(err).strip()
    return f"{type(err).__name__}: {text.splitlines()[0] if text else ''}"[:300]


def check_common_args(args: argparse.Namespace, positive: Sequence[str]) -> argparse.Namespace:
    """The flags ``dllm bench spec`` shares with ``dllm bench trees``: temperatures (numbers >= 0),
    tasks (registered; default the long-answer suite), and the integer flags ``positive`` (>= 1)."""
    try:
        args.temperatures = [float(t) for t in split_list(args.temperatures)]
    except ValueError:
        raise ValueError(f"--temperatures must be numbers >= 0 such as 0,1, got {args.temperatures!r}") from None
    check_temperatures(args.temperatures)
    args.tasks = split_list(args.tasks) or list(T.suite_task_names("long-answer"))
    known = [e.name for e in T.tasks]
    bad = [t for t in args.tasks if t not in known]
    if bad:
        raise ValueError(f"unknown task(s) {bad}; valid tasks: {', '.join(known)}")
    for flag in positive:
        value = getattr(args, flag)
        if value is not None and value != "auto" and value < 1:
            raise ValueError(f"--{flag.replace('_', '-')} must be an integer >= 1, got {value}")
    if getattr(args, "seed", None) is not None and not 0 <= args.seed < 2**64:
        raise ValueError(f"--seed must be an integer in [0, 2**64 - 1], got {args.seed}")
    return args


def check_not_all_skipped(rows: Sequence) -> None:
    """ValueError when no row but ``target.generate``'s baseline ran (every method or configuration
    skipped, as bad settings make them): the command then fails, naming the first reason, rather than
    report a table of nothing. ``rows``: ``report.Row``s."""
    tried = [r for r in rows if r.method != "generate"]
    if tried and all(r.status == "skipped" for r in tried):
        raise ValueError(f"every method was skipped, so nothing was measured; the first reason: {tried[0].reason}")


__all__ = ["check_common_args", "check_not_all_skipped", "check_temperatures", "failure_reason", "split_list"]
