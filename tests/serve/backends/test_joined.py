"""Continuous mode's running decodes (``dllm.serve.backends.scheduling.joined``): requests that arrive while a
decode of their settings runs join it at its next step and answer as ``dllm.generate`` alone; a
cancelled row leaves it; a failing decode fails its jobs and the loop goes on. Jobs are submitted
from inside the decode's step (the loop's thread), so the joins happen at a known step."""

from __future__ import annotations

from collections import Counter

import pytest

import dllm
from dllm.engine.running import RunningDecode
from dllm.serve.backends.diffusion import DiffusionBackend
from dllm.serve.backends.jobs import Delta, Done, Failed, JobRequest, Step
from dllm.settings import DecodeSettings

PROMPTS = ["[BOS] sort D A C B [SEP]", "[BOS] reverse A B C D [SEP]", "[BOS] copy A B C [SEP]",
           "[BOS] sort G F E D C B A [SEP]", "[BOS] reverse K J I H G F [SEP]", "[BOS] copy P O N M [SEP]"]
SLOW = DecodeSettings(sampler="low_confidence")  # one token per step: joinable
THRESHOLD = DecodeSettings(sampler="threshold:threshold=0.8")  # joinable, another decode
DUAL = DecodeSettings(sampler="threshold:threshold=0.8", cache="dual", block_length=4)  # joinable, K/V buffers
BLOCKS = DecodeSettings(sampler="threshold:threshold=0.8", block_length=4)  # joinable: rows at different blocks


@pytest.fixture(scope="module")
def llada():
    return dllm.load("tiny-llada")


def offline(model, prompt, n, settings=SLOW):
    return dllm.generate(model, prompt, gen_length=n, **settings.generate_kwargs()).texts[0]


def at_step(monkeypatch, when: int, action):
    """Run ``action()`` inside the running decodes' step number ``when`` (counted over every decode)."""
    step, calls = RunningDecode.step, []

    def wrapped(self, watch=False):
        calls.append(self)
        if len(calls) == when:
            action()
        return step(self, watch)

    monkeypatch.setattr(RunningDecode, "step", wrapped)
    return calls


def request(engine, prompt, n, settings, stream=False, step_events=False):
    return JobRequest(engine.encode_prompt(prompt), n, settings, stream=stream, step_events=step_events)


def test_requests_arriving_mid_decode_join_it_and_answer_as_alone(llada, monkeypatch):
    engine = DiffusionBackend(llada, name="tiny-llada")
    first = [(PROMPTS[0], 12, SLOW, True), (PROMPTS[1], 12, SLOW, False), (PROMPTS[2], 12, BLOCKS, False)]
    later = [(PROMPTS[2], 4, SLOW, True), (PROMPTS[3], 16, SLOW, False), (PROMPTS[4], 8, THRESHOLD, True),
             (PROMPTS[5], 8, DUAL, False), (PROMPTS[0], 16, BLOCKS, True), (PROMPTS[1], 10, BLOCKS, False)]
    jobs: list = []
    decodes = at_step(monkeypatch, 3, lambda: jobs.extend(engine.submit(request(engine, p, n, s, stream))
                                                          for p, n, s, stream in later))
    try:
        jobs[:0] = [engine.submit(request(engine, p, n, s, stream)) for p, n, s, stream in first]
        slow = []
        for (p, n, s, stream), job in zip(first + later, jobs):
            events = list(job.events(timeout=120))
            done = events[-1]
            assert isinstance(done, Done) and done.text == offline(llada, p, n, s), p
            if stream:
                assert "".join(e.text for e in events if isinstance(e, Delta)) == done.text
            if s is SLOW:
                slow.append(done.nfe)
        assert slow == [12, 12, 4, 16]  # each row's own forwards, as alone
    finally:
        engine.close()
    low = {id(d) for d in decodes if d.group == ("fixed", 1)}
    assert len(low) == 1  # the four low_confidence rows (answers of 4 to 16 tokens) shared one decode
    assert len({id(d) for d in decodes}) == 4  # threshold's, the blocks' and the cached one's their own
    assert sorted(d.policy.name for d in {id(d): d for d in decodes}.values() if d.policy) == ["dual"]


def test_a_cancelled_row_leaves_the_running_decode(llada, monkeypatch):
    engine = DiffusionBackend(llada, name="tiny-llada")
    specs = [(p, 12, SLOW, i == 0) for i, p in enumerate(PROMPTS[:4])]
    jobs: list = []
    at_step(monkeypatch, 4, lambda: jobs[0].cancel())
    try:
        jobs.extend(engine.submit(request(engine, p, n, s, stream)) for p, n, s, stream in specs)
        final = jobs[0].result(timeout=60)
        assert isinstance(final, Failed) and final.status == 499
        for (p, n, s, _), job in zip(specs[1:], jobs[1:]):
            done = job.result(timeout=60)
            assert isinstance(done, Done) and done.text == offline(llada, p, n, s)
        assert engine.stats().running == 0
    finally:
        engine.close()


def test_a_failing_running_decode_fails_its_jobs_and_the_loop_goes_on(llada, monkeypatch):
    engine = DiffusionBackend(llada, name="tiny-llada")
    step, steps, armed, alive = RunningDecode.step, Counter(), [True], []

    def boom_at_second_step(self, watch=False):  # every decode's own second step while armed: whether the
        alive.append(self)  # jobs joined one decode or a busy loop started them in two, each fails; the
        steps[id(self)] += 1  # decodes are kept alive so that a new one never takes a failed one's id
        if armed[0] and steps[id(self)] == 2:
            raise RuntimeError("boom in the running decode")
        return step(self, watch)

    monkeypatch.setattr(RunningDecode, "step", boom_at_second_step)
    try:
        jobs = [engine.submit(request(engine, p, 8, SLOW)) for p in PROMPTS[:3]]
        for job in jobs:
            final = job.result(timeout=60)
            assert isinstance(final, Failed) and final.status == 500 and "boom in the running decode" in final.message
        armed[0] = False
        done = engine.submit(request(engine, PROMPTS[3], 8, SLOW)).result(timeout=60)
        assert isinstance(done, Done) and done.text == offline(llada, PROMPTS[3], 8)
        assert engine.stats().running == 0
    finally:
        engine.close()


def test_join_false_runs_generate_calls(llada):
    engine = DiffusionBackend(llada, name="tiny-llada", join=False)
    calls = []
    decode = engine._decode
    engine._decode = lambda jobs, model, decode=decode: (calls.append(len(jobs)), decode(jobs, model))[1]
    try:
        jobs = [engine.submit(request(engine, PROMPTS[0], 6, SLOW)) for _ in range(2)]
        for job in jobs:
            assert isinstance(job.result(timeout=60), Done)
    finally:
        engine.close()
    assert sum(calls) == 2


def test_step_events_of_a_running_decode_are_its_own_generate_calls(llada):
    """A request with step events joins a running decode and gets the Step events (step, block, NFE,
    tokens, trace, commits) that its own ``generate`` call gives it (``join=False``, one request per
    call: every request here has its own settings or length)."""
    specs = [(PROMPTS[0], 12, SLOW), (PROMPTS[1], 8, THRESHOLD), (PROMPTS[2], 16, BLOCKS), (PROMPTS[3], 8, DUAL),
             (PROMPTS[4], 10, DecodeSettings(sampler="fast")), (PROMPTS[5], 9, SLOW)]

    def events(join: bool) -> list:
        engine = DiffusionBackend(llada, name="tiny-llada", join=join)
        try:
            jobs = [engine.submit(request(engine, p, n, s, stream=True, step_events=True)) for p, n, s in specs]
            out = [list(job.events(timeout=60)) for job in jobs]
        finally:
            engine.close()
        return [([e for e in ev if isinstance(e, Step)], ev[-1].text) for ev in out]

    joined, alone = events(True), events(False)
    assert all(steps for steps, _ in joined)
    assert joined == alone
