"""Admission policies of the scheduler (``dllm.serve.backends.scheduling.scheduler``): when the head of the queue
may start, and which queued jobs start with it as one group (one ``generate`` call).

Jobs are taken first come, first served; a policy never lets a later job overtake the head. Jobs of
one group share a *key* (a backend's notion of "can decode as one call": the same settings, length
and stops for diffusion; never for speculative jobs, whose key is their id).

- ``continuous``: start whenever rows are free; a group is at most ``max_group`` jobs. The head waits
  while something runs and the free rows cannot hold its whole group: a group split in two runs its
  steps twice (sampler and engine work per step), for the same rows.
- ``static``: start only once nothing runs, the head with every queued job of its key (the classic
  batch: the next one waits for the whole batch to end).
- ``serial``: one job at a time.

The limits every policy admits within (``SchedulerConfig``: running jobs, queue length, running
tokens) and the default ``max_tokens`` bound of a served model (``max_tokens_limit``) live here too.
"""

from __future__ import annotations

import abc
from dataclasses import dataclass
from typing import Callable, Hashable, Iterable, Optional

from dllm.serve.backends.jobs import Job

Key = Callable[[Job], Hashable]


@dataclass(frozen=True)
class SchedulerConfig:
    """The scheduler's admission limits (the policy decides within them)."""

    max_running: int = 32  # jobs decoding at once (rows of the running batch)
    max_queue: int = 256  # jobs waiting; more are refused (429)
    max_running_tokens: int = 1 << 20  # prompt + max_tokens summed over running jobs
    retry_after_s: float = 1.0

    def __post_init__(self) -> None:
        for name in ("max_running", "max_queue", "max_running_tokens"):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise ValueError(f"{name} must be an integer >= 1, got {value!r}")


def max_tokens_limit(given: Optional[int], max_positions: Optional[int]) -> int:
    """The largest max_tokens a request may ask for: ``given``, else the positions after a one-token
    prompt, else 4096."""
    return int(given if given is not None else (max_positions - 1 if max_positions else 4096))


class SchedulePolicy(abc.ABC):
    """When the head may start, and its group. Called under the scheduler's lock."""

    name: str

    def max_running(self, configured: int) -> int:
        """The rows the policy runs at once, given the configured limit."""
        return configured

    @abc.abstractmethod
    def may_start(self, head: Job, queue: Iterable[Job], running: int, room: int, key: Key) -> bool:
        """Whether ``head`` starts now: ``running`` jobs decode, ``room`` more may."""

    def group(self, head: Job, queue: Iterable[Job], room: int, tokens: int, key: Key,
              cost: Callable[[Job], int]) -> list[Job]:
        """Queued jobs (not ``head``) that start with it, in queue order: ``head``'s key, at most
        ``min(room, self.group_limit(room))`` of them and ``tokens`` prompt + max_tokens in all."""
        k, left, out = key(head), self.group_limit(room), []
        for job in queue:
            if len(out) >= left:
                break
            if job is not head and key(job) == k and cost(job) <= tokens:
                out.append(job)
                tokens -= cost(job)
        return out

    def group_limit(self, room: int) -> int:
        return room


@dataclass(frozen=True)
class Continuous(SchedulePolicy):
    max_group: int = 32  # jobs of one group (rows of one generate call)
    name: str = "continuous"

    def __post_init__(self) -> None:
        if isinstance(self.max_group, bool) or not isinstance(self.max_group, int) or self.max_group < 1:
            raise ValueError(f"max_group must be an integer >= 1, got {self.max_group!r}")

    def may_start(self, head, queue, running, room, key) -> bool:
        if not running:
            return True
        k, want = key(head), 0
        for job in queue:  # the head's group as it would start: stops counting past what matters
            if key(job) == k:
                want += 1
                if want > room or want >= self.max_group:
                    break
        return want <= room

    def group_limit(self, room: int) -> int:
        return min(room, self.max_group - 1)


@dataclass(frozen=True)
class Static(SchedulePolicy):
    name: str = "static"

    def may_start(self, head, queue, running, room, key) -> bool:
        return not running


@dataclass(frozen=True)
class Serial(SchedulePolicy):
    name: str = "serial"

    def max_running(self, configured: int) -> int:
        return 1

    def may_start(self, head, queue, running, room, key) -> bool:
        return True

    def group_limit(self, room: int) -> int:
        return 0


MODES = ("continuous", "static", "serial")


def make_policy(mode: str, max_group: Optional[int] = None, max_running: int = 32) -> SchedulePolicy:
    """The policy of a ``--mode``; ``max_group``: continuous groups' size (default ``max_running``;
    checked in every mode)."""
    if max_group is not None:
        Continuous(max_group)  # its check, whatever the mode
    if mode == "continuous":
        return Continuous(max_running if max_group is None else max_group)
    if mode == "static":
        return Static()
    if mode == "serial":
        return Serial()
    raise ValueError(f"mode must be one of {', '.join(MODES)}, got {mode!r}")


__all__ = ["Continuous", "MODES", "SchedulePolicy", "SchedulerConfig", "Serial", "Static", "make_policy",
           "max_tokens_limit"]
