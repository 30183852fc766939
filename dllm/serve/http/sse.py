"""Server-sent events (https://html.spec.whatwg.org/multipage/server-sent-events.html) for streamed
replies, in OpenAI's framing: ``data: {chunk}`` lines, then ``data: [DONE]``.

Text deltas go out exactly as the backend's ``Delta`` events give them (a left prefix that is final,
never revised). A request with ``dllm_events`` also gets, in order with the chunks, one named event per
denoising step and one per finished choice just before ``[DONE]``::

    event: dllm.step
    data: {"index": 0, "step": 3, "block": 0, "nfe": 4, "tokens": ["A", null, ...], "trace": [0, -1, ...],
           "committed": [0]}

    event: dllm.done
    data: {"index": 0, "nfe": 5, "forwarded_tokens": ..., "completion_tokens": ..., "tokens_per_forward": ...,
           "tokens_per_s": ..., "wall_s": ..., "ttft_s": ...}

A choice that fails after it started (the backend's ``Failed``: a decode error, 500, or the server's
shutdown at its drain timeout, 503 ``shutting_down``) ends the stream with ``data: {"error": {...}}``
and ``[DONE]`` (the ``openai`` client raises it as an ``APIError``); the other choices of that request
are cancelled. When the client goes away, the stream is cancelled and every unfinished job of the
request with it (``Job.cancel``: its row leaves the batch).
"""

from __future__ import annotations

import asyncio
import json
from typing import Any, AsyncIterator, Callable, Optional, Sequence

from dllm.serve.http.errors import from_failed
from dllm.serve.backends.jobs import Delta, Done, Event, Failed, Job, Step
from dllm.serve.http.replies import Reply, choice_stats, step_data

DONE = "data: [DONE]\n\n"


def data(obj: Any) -> str:
    return f"data: {json.dumps(obj, separators=(',', ':'))}\n\n"


def named(event: str, obj: Any) -> str:
    return f"event: {event}\n{data(obj)}"


async def merged(jobs: Sequence[Job]) -> AsyncIterator[tuple[int, Event]]:
    """The events of several jobs as they come, tagged with the job's index; ends when every job has
    sent its final event."""
    if len(jobs) == 1:
        async for ev in jobs[0].aevents():
            yield 0, ev
        return
    q: asyncio.Queue = asyncio.Queue()

    async def pump(i: int, job: Job) -> None:
        async for ev in job.aevents():
            await q.put((i, ev))

    tasks = [asyncio.create_task(pump(i, j)) for i, j in enumerate(jobs)]
    try:
        left = len(jobs)
        while left:
            i, ev = await q.get()
            left -= isinstance(ev, (Done, Failed))
            yield i, ev
    finally:
        for t in tasks:
            t.cancel()


def cancel_unfinished(jobs: Sequence[Job]) -> None:
    for job in jobs:
        if not job.finished:
            job.cancel()


async def stream(jobs: Sequence[Job], reply: Reply, *, n: int, include_usage: bool = False,
                 step_events: bool = False, on_done: Optional[Callable[[Done, bool], None]] = None
                 ) -> AsyncIterator[str]:
    """The SSE text of a streamed reply to ``jobs`` (one per choice, ``n`` a prompt); ``on_done(done,
    whether it is its prompt's first choice)`` as each ends."""
    dones: dict[int, Done] = {}
    try:
        if reply.chat:
            for i in range(len(jobs)):
                yield data(reply.chunk(i, role=True))
        async for i, ev in merged(jobs):
            if isinstance(ev, Delta):
                if ev.text:
                    yield data(reply.chunk(i, text=ev.text))
            elif isinstance(ev, Step):
                if step_events:
                    yield named("dllm.step", step_data(i, ev))
            elif isinstance(ev, Done):
                dones[i] = ev
                if on_done is not None:
                    on_done(ev, i % n == 0)
                yield data(reply.chunk(i, finish_reason=ev.finish_reason))
            elif isinstance(ev, Failed):
                cancel_unfinished(jobs)
                err = from_failed(ev.message, ev.status)
                yield data(err.body())
                yield DONE
                return
        ordered = [dones[i] for i in range(len(jobs))]
        if include_usage:
            yield data(reply.usage_chunk(ordered, n))
        if step_events:
            for i, d in enumerate(ordered):
                yield named("dllm.done", {"index": i, **choice_stats(d)})
        yield DONE
    finally:  # the client went away (cancelled), or an error: no job of this request keeps its row
        cancel_unfinished(jobs)


__all__ = ["DONE", "cancel_unfinished", "data", "merged", "named", "stream"]
