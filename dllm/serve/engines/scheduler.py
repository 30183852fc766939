"""The queue and the worker threads every engine shares: admission, fairness, limits, shutdown.

Jobs wait in one FIFO queue (first come, first served: a request is never overtaken by a later
one). ``max_running`` worker threads take jobs from its head; a job starts only while the running
jobs' token budget (prompt + max_tokens, summed) leaves room for it, so a long request waits at the
head instead of being overtaken forever. A full queue refuses new jobs (``QueueFull``: HTTP 429 with
Retry-After); ``close`` refuses new ones and lets the others finish, for at most a drain timeout,
after which (or at once, without a drain) every unfinished job ends with a 503.
"""

from __future__ import annotations

import collections
import threading
import time
from dataclasses import dataclass
from typing import Optional

from dllm.serve.engines.base import BadRequest, Engine, EngineStats
from dllm.serve.engines.jobs import EngineClosed, Failed, Job, JobRequest, QueueFull


@dataclass(frozen=True)
class SchedulerConfig:
    max_running: int = 32  # jobs decoding at once (rows of the running batch)
    max_queue: int = 256  # jobs waiting; more are refused (429)
    max_running_tokens: int = 1 << 20  # prompt + max_tokens summed over running jobs
    retry_after_s: float = 1.0

    def __post_init__(self) -> None:
        for name in ("max_running", "max_queue", "max_running_tokens"):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise ValueError(f"{name} must be an integer >= 1, got {value!r}")


CLOSE_POLL_S = 0.1  # how often a draining close looks at the jobs (a job may finish without a notify)
LEAVE_GRACE_S = 10.0  # how long close waits for the ended jobs' rows to leave their decodes


def max_tokens_limit(given: Optional[int], max_positions: Optional[int]) -> int:
    """The largest max_tokens a request may ask for: ``given``, else the positions after a one-token
    prompt, else 4096."""
    return int(given if given is not None else (max_positions - 1 if max_positions else 4096))


class ThreadedEngine(Engine):
    """An engine whose jobs run on ``max_running`` worker threads (``_run_job`` in subclasses)."""

    def __init__(self, scheduler: SchedulerConfig) -> None:
        self.scheduler = scheduler
        self._cond = threading.Condition()
        self._queue: collections.deque[Job] = collections.deque()
        self._running: dict[int, Job] = {}
        self._running_tokens = 0
        self._closed = False
        self._stopped = False  # a close has begun stopping the workers
        self._workers: list[threading.Thread] = []
        self.completed = 0

    def _start_workers(self, n: int) -> None:
        for i in range(n):
            t = threading.Thread(target=self._work, name=f"dllm-serve-{i}", daemon=True)
            t.start()
            self._workers.append(t)

    # ---- Engine ----
    def submit(self, request: JobRequest) -> Job:
        self.check(request)
        job = Job(request)
        with self._cond:
            if self._closed:
                raise EngineClosed("the server is shutting down and takes no new requests")
            if len(self._queue) >= self.scheduler.max_queue:
                raise QueueFull(f"the queue is full ({self.scheduler.max_queue} requests waiting); retry later",
                                retry_after=self.scheduler.retry_after_s)
            self._queue.append(job)
            self._cond.notify_all()
        return job

    def stats(self) -> EngineStats:
        with self._cond:
            return EngineStats(queued=len(self._queue), running=len(self._running),
                               max_running=self.scheduler.max_running, max_queue=self.scheduler.max_queue,
                               forwards=self._forwards()[0], forwarded_rows=self._forwards()[1],
                               closed=self._closed)

    def close(self, drain: bool = True, timeout: Optional[float] = None) -> None:
        """Refuse new jobs, then end the others. With ``drain``, queued and running jobs finish, for at
        most ``timeout`` seconds (None: as long as they need); without ``drain``, or once ``timeout``
        passes, every job still queued or running ends at once with ``Failed(..., 503)`` (a running one
        is also cancelled: its row leaves its decode at the next step; an event the decode sends after
        that is ignored, see ``Job.emit``). Then the worker threads stop (each ended row gets
        ``LEAVE_GRACE_S`` to leave its decode). Safe to call again and from several threads: a
        ``drain=False`` call during a draining one ends that drain at once."""
        deadline = None if timeout is None else time.monotonic() + timeout
        with self._cond:
            self._closed = True
            self._cond.notify_all()
            if not drain:
                self._end_unfinished("it stopped without waiting for the requests in flight")
            while self._unfinished():
                left = None if deadline is None else deadline - time.monotonic()
                if left is not None and left <= 0:
                    self._end_unfinished(f"the drain timeout of {timeout:g} s passed")
                    break
                self._cond.wait(timeout=CLOSE_POLL_S if left is None else min(left, CLOSE_POLL_S))
            grace = time.monotonic() + LEAVE_GRACE_S
            while self._running and time.monotonic() < grace:
                self._cond.wait(timeout=min(grace - time.monotonic(), CLOSE_POLL_S))
            if self._stopped:
                return
            self._stopped = True
        for t in self._workers:
            t.join(timeout=1.0)
        self._shutdown()

    def _unfinished(self) -> bool:
        """Under the lock: a job is queued, or a running one has not sent its final event yet."""
        return bool(self._queue) or any(not job.finished for job in self._running.values())

    def _end_unfinished(self, why: str) -> None:
        """Under the lock: every queued job and every unfinished running one ends now with a 503
        (``why`` says why); the running ones are cancelled too, so their rows leave their decode."""
        while self._queue:
            self._queue.popleft().emit(Failed(f"the server shut down before this request started: {why}; "
                                              f"retry it", 503))
        for job in self._running.values():
            job.emit(Failed(f"the server shut down before this request finished: {why}; retry it", 503))
            job.cancel()
        self._cond.notify_all()

    @property
    def closed(self) -> bool:
        return self._closed

    def check_length(self, request: JobRequest, what: str) -> None:
        """max_tokens within the limit, a non-empty prompt, and prompt + max_tokens within the
        positions of ``what`` ("model", "target"); BadRequest naming the field otherwise."""
        n = request.max_tokens
        if isinstance(n, bool) or not isinstance(n, int) or not 1 <= n <= self.max_tokens_limit:
            raise BadRequest("max_tokens", f"max_tokens must be an integer in [1, {self.max_tokens_limit}], got {n!r}")
        if not request.prompt_ids:
            raise BadRequest("prompt", "the prompt is empty")
        lp = len(request.prompt_ids)
        if self.max_positions is not None and lp + n > self.max_positions:
            raise BadRequest("prompt" if lp >= self.max_positions else "max_tokens",
                             f"prompt ({lp} tokens) + max_tokens ({n}) = {lp + n} exceeds the {what}'s "
                             f"{self.max_positions} positions")

    # ---- subclasses ----
    def _run_jobs(self, jobs: list[Job]) -> None:
        """Decode a group of jobs (``_companions`` of the first), emitting each one's events (a Done or
        Failed last). Default: the one job alone (``_run_job``)."""
        (job,) = jobs
        self._run_job(job)

    def _run_job(self, job: Job) -> None:
        """Decode one job, emitting its events (a Done or Failed last)."""
        raise NotImplementedError

    def _companions(self, head: Job, room: int, tokens: int) -> list[Job]:
        """Queued jobs (not ``head``) to decode in one call with ``head``, at most ``room`` of them and
        ``tokens`` prompt + max_tokens in all; default none (every job alone)."""
        return []

    def _forwards(self) -> tuple[int, int]:
        return 0, 0

    def _may_start(self) -> bool:
        """The admission policy beyond the row and token limits (called under the lock); default:
        whenever a row is free."""
        return True

    def _shutdown(self) -> None:
        pass

    # ---- workers ----
    def _cost(self, job: Job) -> int:
        return len(job.request.prompt_ids) + job.request.max_tokens

    def _next(self, wait: bool = True) -> Optional[list[Job]]:
        """The head job once it fits the token budget, with its companions; None once the engine is
        closed and nothing is queued; ``[]`` when nothing can start now and ``wait`` is False (else
        it waits). The running jobs never exceed ``max_running`` nor the token budget (a lone job that
        is over the budget runs when nothing else does)."""
        cfg = self.scheduler
        with self._cond:
            while True:
                if self._queue and len(self._running) < cfg.max_running and self._may_start():
                    job = self._queue[0]
                    cost = self._cost(job)
                    if not self._running or self._running_tokens + cost <= cfg.max_running_tokens:
                        self._queue.popleft()
                        group = [job] + self._companions(job, cfg.max_running - len(self._running) - 1,
                                                         cfg.max_running_tokens - self._running_tokens - cost)
                        for member in group:
                            self._running[member.id] = member
                            self._running_tokens += self._cost(member)
                        return group
                elif not self._queue and self._closed:
                    return None
                if not wait:
                    return []
                self._cond.wait()

    def _work(self) -> None:
        """A worker thread: groups from the queue, one after another, until the engine closes."""
        while True:
            group = self._next()
            if group is None:
                return
            self._serve_group(group)

    def _serve_group(self, group: list[Job]) -> None:
        """Decode a group taken by ``_next`` (cancelled jobs fail at once); every job ends with a Done
        or a Failed, and leaves the running set."""
        try:
            live = [job for job in group if not job.cancelled]
            for job in group:
                if job.cancelled:
                    job.emit(Failed("cancelled by the client", 499))
            if live:
                self._run_jobs(live)
        except BaseException as err:  # noqa: BLE001 - a failed job must not kill the worker
            for job in group:
                job.emit(Failed(f"{type(err).__name__}: {err}", 500))
        finally:
            for job in group:
                if not job.finished:
                    job.emit(Failed("the decode ended without a result", 500))
            with self._cond:
                for job in group:
                    self._running.pop(job.id, None)
                    self._running_tokens -= self._cost(job)
                    self.completed += 1
                self._cond.notify_all()


__all__ = ["SchedulerConfig", "ThreadedEngine"]
