"""The one scheduler every backend runs on: the queue, admission, the running batch, its step loop.

Jobs wait in one FIFO queue (first come, first served: a request is never overtaken by a later
one). The admission policy (``dllm.serve.backends.scheduling.policy``: continuous, static, serial) says
when the head starts and which queued jobs of its key start with it as one group; a group starts only
while the running jobs (at most ``max_running``) and their token budget (prompt + max_tokens,
summed) leave room for it, so a long request waits at the head instead of being overtaken forever.
A full queue refuses new jobs (``QueueFull``: HTTP 429 with Retry-After); a queued job that is
cancelled (its client left) ends with a 499 and leaves the queue at the loop's next round with room
for a job to start, or at once when its slot is wanted, so it never holds a slot or keeps the head
waiting; ``close`` refuses new ones and lets the others finish, for at most a drain timeout, after
which (or at once, without a drain) every unfinished job ends with a 503.

One thread runs everything: each running group is a greenlet (the backend's ``_run_jobs``: a
``generate`` call, a speculative decode), run until it hands the loop a forward (``call``: the
model wrapped by ``dllm.serve.backends.scheduling.batcher.BatchedModel``) or yields its turn (``yield_turn``:
a speculative round) or ends. Once every running group waits, the loop runs the forwards (merged
where they can be: ``dllm.serve.backends.scheduling.batcher``), resumes each group with its result, and starts
what the policy admits between two such steps. A group's host read of a step (``read``: the canvas
for streamed text) is made together with the reads of the other groups resumed in that round, as
one copy, and the groups go on to their next forwards in the same round. So there is no lock handoff between a forward and
the samplers' work, and the model is only ever used from one thread.
"""

from __future__ import annotations

import collections
import dataclasses
import threading
import time
from typing import Any, Hashable, Optional

import greenlet
import torch

from dllm.serve.backends.base import Backend, BackendStats, BadRequest
from dllm.serve.backends.scheduling.batcher import BatcherConfig, Pending, merged_forward, plan_groups, read_together
from dllm.serve.backends.jobs import BackendClosed, Failed, Job, JobRequest, QueueFull
from dllm.serve.backends.scheduling.policy import SchedulePolicy, SchedulerConfig, max_tokens_limit


CLOSE_POLL_S = 0.1  # how often a draining close looks at the jobs (a job may finish without a notify)
LEAVE_GRACE_S = 10.0  # how long close waits for the ended jobs' rows to leave their decodes


class Scheduler(Backend):
    """A backend's queue, admission and running batch, on one step-loop thread. Subclasses give the
    grouping key (``_key``), the decode of a group (``_run_jobs``) and the model whose forwards the
    loop runs (None: the jobs run their own forwards, yielding turns)."""

    def __init__(self, config: SchedulerConfig, policy: SchedulePolicy, model: Any = None,
                 batcher: BatcherConfig = BatcherConfig()) -> None:
        self.limits = dataclasses.replace(config, max_running=policy.max_running(config.max_running))
        # call_cost_tokens="auto": measured once, here, on the model the loop runs
        self.batcher = batcher.resolved(model) if model is not None else batcher
        self.policy, self.model_for_loop = policy, model
        self._cond = threading.Condition()
        self._queue: collections.deque[Job] = collections.deque()
        self._running: dict[int, Job] = {}
        self._running_tokens = 0
        self._closed = False
        self._stopped = False  # a close has begun stopping the loop
        self._keys: dict[int, Hashable] = {}  # job id -> its key, computed once while queued
        self.completed = 0
        self.forwards = 0  # model calls the loop ran (merged ones count once)
        self.forwarded_rows = 0  # rows summed over those calls
        self.merged_calls = 0  # group forwards served by merged calls
        self._main: Any = None  # the loop thread's own greenlet
        self._thread = threading.Thread(target=self._loop, name="dllm-scheduler", daemon=True)

    def start(self) -> None:
        """Start the loop thread (subclasses call it once their own state is set)."""
        self._thread.start()

    # ---- Backend ----
    def submit(self, request: JobRequest) -> Job:
        self.check(request)
        job = Job(request)
        with self._cond:
            if self._closed:
                raise BackendClosed("the server is shutting down and takes no new requests")
            if len(self._queue) >= self.limits.max_queue:
                self._drop_cancelled()  # jobs whose client left hold no slot
            if len(self._queue) >= self.limits.max_queue:
                raise QueueFull(f"the queue is full ({self.limits.max_queue} requests waiting); retry later",
                                retry_after=self.limits.retry_after_s)
            self._queue.append(job)
            self._cond.notify_all()
        return job

    def stats(self) -> BackendStats:
        """``running`` counts the jobs that have not sent their final event: a job whose ``Done`` a
        client already holds is not counted, though its group may not have left the loop yet."""
        with self._cond:
            forwards, rows = self._forwards()
            running = sum(not job.finished for job in self._running.values())
            return BackendStats(queued=len(self._queue), running=running,
                                max_running=self.limits.max_running, max_queue=self.limits.max_queue,
                                forwards=forwards, forwarded_rows=rows, closed=self._closed)

    def close(self, drain: bool = True, timeout: Optional[float] = None) -> None:
        """Refuse new jobs, then end the others. With ``drain``, queued and running jobs finish, for at
        most ``timeout`` seconds (None: as long as they need); without ``drain``, or once ``timeout``
        passes, every job still queued or running ends at once with ``Failed(..., 503)`` (a running one
        is also cancelled: its row leaves its decode at the next step; an event the decode sends after
        that is ignored, see ``Job.emit``). Then the loop thread stops (each ended row gets
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
        self._thread.join(timeout=5.0)  # the loop ends once the closed backend has nothing left

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
    def _run_jobs(self, jobs: list[Job]) -> Optional[list[Job]]:
        """Decode a group of jobs (one key), emitting each one's events (a Done or Failed last). Or hand
        some to a decode that already runs (a backend's running batch), returning them: that decode
        then ends them and calls ``_release`` for each."""
        raise NotImplementedError

    def _key(self, job: Job) -> Hashable:
        """Jobs of one key may decode as one group; default: every job alone."""
        return job.id

    def _forwards(self) -> tuple[int, int]:
        return self.forwards, self.forwarded_rows

    # ---- admission (under the lock) ----
    def _cost(self, job: Job) -> int:
        return len(job.request.prompt_ids) + job.request.max_tokens

    def _cached_key(self, job: Job) -> Hashable:
        key = self._keys.get(job.id)
        if key is None:
            key = self._keys[job.id] = self._key(job)
        return key

    def _next(self, wait: bool = True) -> Optional[list[Job]]:
        """The head job once the policy and the limits let it start, with its group; None once the
        backend is closed and nothing is queued; ``[]`` when nothing can start now and ``wait`` is False
        (else it waits). The running jobs never exceed ``max_running`` nor the token budget (a lone
        job that is over the budget runs when nothing else does)."""
        cfg, key = self.limits, self._cached_key
        with self._cond:
            while True:
                room = cfg.max_running - len(self._running)
                if room > 0:  # a job may start: first drop those whose client left (a full batch skips the scan)
                    self._drop_cancelled()
                if self._queue and room > 0:
                    head = self._queue[0]
                    cost = self._cost(head)
                    if ((not self._running or self._running_tokens + cost <= cfg.max_running_tokens)
                            and self.policy.may_start(head, self._queue, len(self._running), room, key)):
                        group = [head] + self.policy.group(head, self._queue, room - 1,
                                                           cfg.max_running_tokens - self._running_tokens - cost,
                                                           key, self._cost)
                        taken = {job.id for job in group}
                        kept = [job for job in self._queue if job.id not in taken]  # one pass
                        self._queue.clear()
                        self._queue.extend(kept)
                        for job in group:
                            self._keys.pop(job.id, None)
                            self._running[job.id] = job
                            self._running_tokens += self._cost(job)
                        return group
                elif not self._queue and self._closed:
                    return None
                if not wait:
                    return []
                self._cond.wait()

    def _drop_cancelled(self) -> None:
        """Under the lock: queued jobs whose client left end now (499) and leave the queue, so they
        hold no queue slot and never keep the head waiting for rows or token budget they would not use."""
        if not any(job.cancelled for job in self._queue):
            return
        kept = []
        for job in self._queue:
            if job.cancelled:
                job.emit(Failed("cancelled by the client", 499))
                self._keys.pop(job.id, None)
            else:
                kept.append(job)
        self._queue.clear()
        self._queue.extend(kept)

    def _serve_group(self, group: list[Job]) -> None:
        """Decode a group taken by ``_next`` (cancelled jobs fail at once); every job ends with a Done
        or a Failed, and leaves the running set."""
        handed: list[Job] = []
        try:
            live = [job for job in group if not job.cancelled]
            for job in group:
                if job.cancelled:
                    job.emit(Failed("cancelled by the client", 499))
            if live:
                handed = self._run_jobs(live) or []
        except BaseException as err:  # noqa: BLE001 - a failed job must not kill the loop
            for job in group:
                job.emit(Failed(f"{type(err).__name__}: {err}", 500))
        finally:
            gone = {job.id for job in handed}
            self._release([job for job in group if job.id not in gone])

    def _release(self, jobs: list[Job]) -> None:
        """Jobs whose decode is over leave the running set (one that sent no final event fails)."""
        for job in jobs:
            if not job.finished:
                job.emit(Failed("the decode ended without a result", 500))
        with self._cond:
            for job in jobs:
                if self._running.pop(job.id, None) is not None:
                    self._running_tokens -= self._cost(job)
                    self.completed += 1
            self._cond.notify_all()

    # ---- the loop (its thread; groups are greenlets) ----
    def call(self, method: str, input_ids: torch.Tensor, kwargs: dict[str, Any]) -> Any:
        """A group's forward: hand it to the loop, resume with its result."""
        item = Pending(input_ids, kwargs, method)
        self._switch(item, "a served model's forward")
        if item.error is not None:
            raise item.error
        return item.result

    def yield_turn(self) -> None:
        """Let every other running group take its turn (run to its next forward or turn), then go on."""
        self._switch(Pending(None, {}, "yield"), "yield_turn")

    def read(self, tensors: list[torch.Tensor]) -> list[list]:
        """A group's host read of ``tensors`` (each 1-D or 2-D, integer), as nested lists: batched with
        the reads every other running group makes in the same round, one device-to-host copy for all
        (``read_together``). Outside the loop's jobs it reads at once."""
        item = Pending(None, {"tensors": tensors}, "read")
        if self._main is None or greenlet.getcurrent().parent is not self._main:
            read_together([item])
        else:
            self._switch(item, "a served decode's read")
        if item.error is not None:
            raise item.error
        return item.result

    def _switch(self, item: Pending, what: str) -> None:
        if self._main is None or greenlet.getcurrent().parent is not self._main:
            raise RuntimeError(f"{what} runs only inside a job of the backend's step loop (submit a request to "
                               f"the backend; for a forward of your own use the model itself)")
        self._main.switch(item)

    def _loop(self) -> None:
        self._main = greenlet.getcurrent()
        pending: list[tuple[Pending, Any]] = []
        live = 0
        with torch.inference_mode():  # held for the loop's life: the decodes' own guards nest inside it
            while True:
                while True:  # start what can start (block only when nothing runs)
                    group = self._next(wait=live == 0 and not pending)
                    if not group:
                        break
                    live += self._resume(greenlet.greenlet(lambda g=group: self._serve_group(g)), None, pending,
                                         first=True)
                    live += self._settle_reads(pending)
                if group is None and live == 0:
                    return
                if not pending:
                    continue
                taken, pending = pending, []
                forwards = [item for item, _ in taken if item.method != "yield"]
                for calls in plan_groups(forwards, self.batcher):
                    self._execute(calls)
                for item, job in taken:
                    live += self._resume(job, item, pending) - 1
                live += self._settle_reads(pending)

    def _settle_reads(self, pending: list) -> int:
        """The reads the resumed groups asked for (``read``), made as one copy, each group resumed
        until its next forward or turn, within the same round: so the groups stay in step and their
        next forwards still merge. Returns the change in running groups (those that ended)."""
        change = 0
        while any(item.method == "read" for item, _ in pending):
            reads = [(item, job) for item, job in pending if item.method == "read"]
            pending[:] = [(item, job) for item, job in pending if item.method != "read"]
            read_together([item for item, _ in reads])
            for item, job in reads:
                change += self._resume(job, item, pending) - 1
        return change

    @staticmethod
    def _resume(job: Any, value: Any, pending: list, first: bool = False) -> int:
        """Run ``job`` until its next forward or turn (queued in ``pending``) or its end; 1 if it still
        runs. A group ends its jobs itself (``_serve_group``); an error that escapes it anyway ends
        only that group, never the loop."""
        try:
            item = job.switch() if first else job.switch(value)
        except BaseException:  # noqa: BLE001
            return 0
        if job.dead:
            return 0
        pending.append((item, job))
        return 1

    def _execute(self, calls: list[Pending]) -> None:
        """One planned call: a forward alone, or several merged; a merged call that fails runs each alone,
        so an error fails only the decodes whose own forward fails, not all those merged with it."""
        model = self.model_for_loop
        if len(calls) > 1:
            try:
                outputs = merged_forward(model, calls)
            except Exception:  # noqa: BLE001 - each forward alone says whose it is
                for item in calls:
                    self._execute([item])
                return
            except BaseException as err:  # noqa: BLE001 - handed to the groups, which raise it
                for item in calls:
                    item.error = err
                return
            for item, out in zip(calls, outputs):
                item.result = out
            self.merged_calls += len(calls)
            self.forwards += 1
            self.forwarded_rows += sum(item.rows for item in calls)
            return
        try:
            (item,) = calls
            fn = model if item.method == "forward" else getattr(model, item.method)
            item.result = fn(item.input_ids, **item.kwargs)
            self.forwards += 1
            self.forwarded_rows += item.rows
        except BaseException as err:  # noqa: BLE001 - handed to the group, which raises it
            for item in calls:
                item.error = err


__all__ = ["Scheduler", "SchedulerConfig", "max_tokens_limit", "read_together"]
