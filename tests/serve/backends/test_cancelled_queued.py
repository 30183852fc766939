"""A queued job whose client left (``Job.cancel`` before it started) ends with a 499 and leaves the
queue: it holds no queue slot (the HTTP layer cancels the choices it queued when a later one is
refused) and never keeps the head waiting for rows or token budget that it would not use."""

from __future__ import annotations

import pytest

import dllm
from dllm.serve.backends.diffusion import DiffusionBackend
from dllm.serve.backends.jobs import Done, Failed, JobRequest
from dllm.settings import DecodeSettings

SLOW = DecodeSettings(sampler="low_confidence")  # one token per step
TEN = "[BOS] sort G F E D C B A [SEP]"  # 10 tokens
SEVEN = "[BOS] copy P O N M [SEP]"  # 7 tokens


@pytest.fixture(scope="module")
def llada():
    return dllm.load("tiny-llada")


def test_cancelled_queued_jobs_free_their_queue_slots(llada):
    engine = DiffusionBackend(llada, name="tiny-llada", mode="serial", max_queue=2)
    try:
        ids = engine.encode_prompt(TEN)
        long = engine.submit(JobRequest(ids, 24, SLOW, stream=True))
        next(long.events(timeout=60))  # running: the queue is empty
        queued = [engine.submit(JobRequest(ids, 4, SLOW)) for _ in range(2)]  # the queue is full
        for job in queued:
            job.cancel()  # e.g. a request of n = 3 whose third choice was refused: its two queued ones
        fresh = engine.submit(JobRequest(engine.encode_prompt(SEVEN), 4, SLOW))  # was QueueFull
        for job in queued:
            final = job.result(timeout=60)
            assert isinstance(final, Failed) and final.status == 499
        assert isinstance(fresh.result(timeout=60), Done) and isinstance(long.result(timeout=60), Done)
    finally:
        engine.close()


def test_a_cancelled_head_does_not_keep_the_next_job_waiting_for_the_token_budget(llada):
    # budget 50: the long job (10 + 24) runs; the cancelled head (10 + 24) would not fit beside it and
    # waited for it to end, and the short job behind it (7 + 4) with it, though it fits at once
    engine = DiffusionBackend(llada, name="tiny-llada", max_running=4, max_running_tokens=50)
    try:
        with engine._cond:  # queued together, the head cancelled before the loop takes any
            long = engine.submit(JobRequest(engine.encode_prompt(TEN), 24, SLOW))
            head = engine.submit(JobRequest(engine.encode_prompt(TEN), 24, SLOW))
            short = engine.submit(JobRequest(engine.encode_prompt(SEVEN), 4, SLOW))
            head.cancel()
            ended: list[str] = []  # the order the loop thread ends the two jobs in
            for name, job in (("long", long), ("short", short)):
                job.emit = _noting_the_end(job.emit, name, ended)
        final = head.result(timeout=60)
        assert isinstance(final, Failed) and final.status == 499
        s, lg = short.result(timeout=60), long.result(timeout=60)
        assert isinstance(s, Done) and isinstance(lg, Done)
        assert ended == ["short", "long"]  # 4 steps beside the long job's 24, not after them
        assert s.text == dllm.generate(llada, SEVEN, gen_length=4, sampler="low_confidence").texts[0]
    finally:
        engine.close()


def _noting_the_end(emit, name: str, ended: list[str]):
    """``emit`` that also notes ``name`` when the job's last event (Done / Failed) goes out."""
    def noted(event):
        if isinstance(event, (Done, Failed)):
            ended.append(name)
        emit(event)
    return noted
