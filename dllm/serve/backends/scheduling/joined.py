"""Continuous batching with one decode state per setting: requests join a running decode.

In ``continuous`` mode a group of requests whose settings can share one canvas
(``dllm.engine.running.unsupported_reason``: no cache or ``prefix`` / ``dual``, guidance without a
cache, a sampler whose step reads no step index; greedy or sampled, each row drawing from its own
generator) does not start a ``generate`` call of its own: it joins the ``RunningDecode`` of its key
(the settings, seeds aside, and ``group_of``: answers of any length that commit the same count per
step), if one runs, at that decode's next step, and every step of the decode is one sampler step and
one commit for all of its rows, whatever block and step each row is at. Without a cache its forward
is split into calls of rows of neighbouring lengths by the loop's own cost model (``split_rows``;
under a cache its calls are the rows at a full forward and the cached rows of each block width), and
the loop may merge those calls with the other decodes' forwards (``dllm.serve.backends.scheduling.batcher``). A
row ends after its last step, after a block that ends its answer (an EOS, as
``generate(stop_at_eos=True)``), as soon as its answer is final (EOS or a stop string in its final
prefix, streamed or not), or when its client leaves; it then leaves the decode. The decode's
greenlet (the first group's) runs until no row is left, ending each job itself
(``Scheduler._release``).

Each answer equals ``dllm.generate`` of its prompt alone with its seed
(tests/serve/backends/test_joined.py, test_seeded.py), and its counts are that call's
(``dllm.engine.running``); a request with ``step_events`` gets the ``Step`` events that call's step
callback gives it (the trace of each answer position kept here, from the answers read each step).
"""

from __future__ import annotations

import time
from typing import Any

from dllm.engine.running import RunningDecode
from dllm.serve.backends.scheduling.batcher import split_rows
from dllm.serve.backends.jobs import Failed, Job
from dllm.settings import DecodeSettings


class JoinedDecode:
    """The running decode of one key and its jobs' rows (``backend``: a ``DiffusionBackend``)."""

    def __init__(self, backend: Any, settings: DecodeSettings, group: tuple) -> None:
        self.backend = backend
        self.decode = RunningDecode(backend._served, settings, group, read=backend.read,
                                    split=lambda lengths: split_rows(lengths, backend.batcher))
        self.mask_id = self.decode.mask_id
        self.rows: dict[int, Any] = {}  # job id -> its row (dllm.serve.backends.diffusion._Row)
        self.started: dict[int, float] = {}
        self.traces: dict[int, list[int]] = {}  # job id -> the step that committed each answer position (-1: none yet)

    def admit(self, jobs: list[Job]) -> None:
        """The jobs' rows join at the decode's next step."""
        now = time.perf_counter()
        for job in jobs:
            self.rows[job.id] = self.backend._new_row(job, len(self.rows), False)
            self.started[job.id] = now
            self.decode.add(job.request.prompt_ids, job.request.max_tokens, job.id, seed=job.request.settings.seed)

    def run(self) -> None:
        """Step until no row is left; every job ends with a Done or Failed (an error fails them all)."""
        try:
            while len(self.decode):
                self._leave_cancelled()
                watch = any(r.job.request.stream or r.job.request.stop or r.job.request.step_events
                            for r in self.rows.values())
                for st in self.decode.step(watch):
                    row = self.rows[st.tag]
                    row.nfe, row.forwarded = st.nfe, st.forwarded_tokens
                    if row.job.request.step_events and st.ids is not None:
                        self._step_event(row, st)
                    if st.done:
                        self._end(st.tag, st.ids)
                    elif st.ids is not None and self._observe(row, st.ids):
                        self._end(st.tag, None)  # final early: the text the whole decode would give
                        self.decode.remove([st.tag])
        except BaseException as err:  # noqa: BLE001 - every job of the decode fails, the loop goes on
            for row in self.rows.values():
                row.job.emit(Failed(f"{type(err).__name__}: {err}", 500))
        finally:
            self.backend._release([row.job for row in self.rows.values()])
            self.rows.clear()

    def _observe(self, row, ids: list[int]) -> bool:
        """Whether the row's answer is final after a step (``_Row.observe_answer``, which also streams
        its new final text). A request that is not streamed and has no stop strings gets no text
        before its end (as a ``generate`` call's rows), so its answer is decoded only once an EOS is in
        its final prefix, where it ends."""
        request = row.job.request
        if request.stream or request.stop or self.decode.answer_ended(ids):
            return row.observe_answer(ids, self.mask_id)
        return False

    def _step_event(self, row, st) -> None:
        """The row's ``Step`` event, as its own ``generate`` call's step callback makes it: the answer
        after the step (None where masked), the step that committed each position, this step's commits."""
        canvas = st.canvas if st.canvas is not None else st.ids
        trace = self.traces.setdefault(st.tag, [-1] * len(canvas))
        for i, t in enumerate(canvas):
            if t != self.mask_id and trace[i] == -1:
                trace[i] = st.step
        row.emit_step(st.step, st.block, st.nfe, canvas, trace, self.mask_id)

    def _leave_cancelled(self) -> None:
        gone = [tag for tag, row in self.rows.items() if row.job.cancelled]
        for tag in gone:
            self.rows[tag].job.emit(Failed("cancelled by the client", 499))
            self._release(tag)
        self.decode.remove(gone)

    def _end(self, tag: int, ids) -> None:
        row = self.rows[tag]
        row.finish(ids, row.job.request.max_tokens, self.started[tag])
        self._release(tag)

    def _release(self, tag: int) -> None:
        row = self.rows.pop(tag)
        self.started.pop(tag, None)
        self.traces.pop(tag, None)
        self.backend._release([row.job])


__all__ = ["JoinedDecode"]
