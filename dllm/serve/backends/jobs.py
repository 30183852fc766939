"""What a served request is and what it yields: the settings, the job handle and its events.

The HTTP layer (``dllm.serve.http.app``) turns an OpenAI-style body into a ``JobRequest``, hands it to a
backend (``dllm.serve.backends.diffusion.DiffusionBackend`` or
``dllm.serve.backends.speculative.SpeculativeBackend``) and reads the job's events: ``Delta`` (text that
is final: a committed left prefix, never revised), ``Step`` (one per denoising step when the request
asked for ``step_events``), then exactly one ``Done`` or ``Failed``. Backends run jobs on their own
threads; a job's events are read from any thread (``Job.events``) or from an asyncio loop
(``Job.aevents``).
"""

from __future__ import annotations

import asyncio
import itertools
import queue
import threading
import time
from dataclasses import dataclass, field
from typing import AsyncIterator, Iterator, Optional, Union

from dllm.settings import DecodeSettings


@dataclass(frozen=True)
class SpeculativeSettings:
    """How one speculative request decodes (the keywords of ``dllm.speculative_generate``)."""

    temperature: float = 0.0
    top_p: float = 1.0
    top_k: int = 0
    seed: Optional[int] = None


Settings = Union[DecodeSettings, SpeculativeSettings]  # a diffusion request: dllm.settings.DecodeSettings


@dataclass(frozen=True)
class JobRequest:
    """One completion: the prompt's token ids, how many tokens at most, stops and settings."""

    prompt_ids: tuple[int, ...]
    max_tokens: int
    settings: Settings
    stop: tuple[str, ...] = ()  # stop strings: the text ends before the first one (not included)
    step_events: bool = False  # also one ``Step`` event per denoising step (diffusion only)
    stream: bool = False  # the client reads text deltas as they become final (else: the text at the end)


@dataclass(frozen=True)
class Delta:
    """New final text: ``text`` extends what earlier deltas sent; ``token_ids`` are the tokens made final
    since the last delta (a tail held back from ``text``, which may still grow into a stop string,
    comes with the tokens before it)."""

    text: str
    token_ids: tuple[int, ...]


@dataclass(frozen=True)
class Step:
    """One denoising step of a diffusion request: the generated region after it.

    ``tokens[i]`` is the text piece of generated position i, None while masked; ``trace[i]`` the step
    that committed it (-1 while masked); ``committed`` the positions committed by this step."""

    step: int
    block: int
    nfe: int
    tokens: tuple[Optional[str], ...]
    trace: tuple[int, ...]
    committed: tuple[int, ...]


@dataclass(frozen=True)
class Done:
    """The finished request. ``text`` equals the concatenated deltas. ``finish_reason`` is "stop"
    (EOS or a stop string) or "length" (max_tokens reached)."""

    text: str
    token_ids: tuple[int, ...]
    finish_reason: str
    prompt_tokens: int
    completion_tokens: int
    nfe: int  # model forwards (diffusion) or target forwards (speculative)
    forwarded_tokens: int = 0
    queue_s: float = 0.0  # submitted -> started
    ttft_s: Optional[float] = None  # submitted -> first non-empty delta
    wall_s: float = 0.0  # submitted -> done
    acceptance: Optional[float] = None  # speculative: mean tokens per round (accepted + bonus)

    @property
    def tokens_per_forward(self) -> float:
        return self.completion_tokens / self.nfe if self.nfe else 0.0


@dataclass(frozen=True)
class Failed:
    """The request failed after it was accepted (cancelled, or an error in the decode loop)."""

    message: str
    status: int = 500  # 499: cancelled by the client; 503: the backend shut down before it ended


Event = Union[Delta, Step, Done, Failed]


class QueueFull(Exception):
    """The backend's queue is full; retry after ``retry_after`` seconds (HTTP 429 + Retry-After)."""

    def __init__(self, message: str, retry_after: float = 1.0) -> None:
        super().__init__(message)
        self.retry_after = retry_after


class BackendClosed(Exception):
    """The backend is shutting down and takes no new requests (HTTP 503)."""


_ids = itertools.count(1)


@dataclass
class Job:
    """A submitted request: its events arrive in order, ending with one ``Done`` or ``Failed``."""

    request: JobRequest
    id: int = field(default_factory=lambda: next(_ids))
    submitted: float = field(default_factory=time.perf_counter)
    _queue: "queue.Queue[Event]" = field(default_factory=queue.Queue, repr=False)
    _cancel: threading.Event = field(default_factory=threading.Event, repr=False)
    _final: Optional[Event] = field(default=None, repr=False)
    _emit_lock: threading.Lock = field(default_factory=threading.Lock, repr=False)
    _loop: Optional[asyncio.AbstractEventLoop] = field(default=None, repr=False)  # an aevents reader's loop
    _wake: Optional[asyncio.Event] = field(default=None, repr=False)

    # ---- the backend's side ----
    def emit(self, event: Event) -> None:
        """Send ``event`` to the reader; ignored once a final event (Done/Failed) was sent, so the
        backend's thread and a closing one (``close``: a 503 at the drain timeout) may both end a job:
        the first final event wins and nothing follows it."""
        with self._emit_lock:
            if self._final is not None:
                return
            if isinstance(event, (Done, Failed)):
                self._final = event
            self._queue.put(event)
        loop, wake = self._loop, self._wake
        if loop is not None and wake is not None:
            try:
                loop.call_soon_threadsafe(wake.set)  # wake the asyncio reader now
            except RuntimeError:  # its loop is closed: nobody is reading
                pass

    @property
    def cancelled(self) -> bool:
        return self._cancel.is_set()

    @property
    def finished(self) -> bool:
        return self._final is not None

    # ---- the reader's side ----
    def cancel(self) -> None:
        """Ask the backend to drop this job (a client that went away): its row leaves the batch at
        the next step and the job ends with ``Failed(status=499)``."""
        self._cancel.set()

    def events(self, timeout: Optional[float] = None) -> Iterator[Event]:
        """The events in order, ending with the final one (blocking; ``timeout`` per event)."""
        while True:
            event = self._queue.get(timeout=timeout)
            yield event
            if isinstance(event, (Done, Failed)):
                return

    async def aevents(self, poll_s: float = 1.0) -> AsyncIterator[Event]:
        """``events`` for an asyncio loop: ``emit`` wakes the reader through its loop
        (``call_soon_threadsafe``), so there is no polling; ``poll_s`` is only the longest wait
        between two looks at the queue (a safety net)."""
        self._wake = asyncio.Event()
        self._loop = asyncio.get_running_loop()
        while True:
            try:
                event = self._queue.get_nowait()
            except queue.Empty:
                self._wake.clear()
                if self._queue.empty():  # an emit between get_nowait and clear set the event again
                    try:
                        await asyncio.wait_for(self._wake.wait(), timeout=poll_s)
                    except asyncio.TimeoutError:
                        pass
                continue
            yield event
            if isinstance(event, (Done, Failed)):
                return

    def result(self, timeout: Optional[float] = None) -> Union[Done, Failed]:
        """Block until the job ends; its final event."""
        last: Optional[Event] = None
        for last in self.events(timeout=timeout):
            pass
        assert isinstance(last, (Done, Failed))
        return last


__all__ = ["SpeculativeSettings", "Settings", "JobRequest", "Delta", "Step", "Done", "Failed", "Event", "Job",
           "QueueFull", "BackendClosed"]
