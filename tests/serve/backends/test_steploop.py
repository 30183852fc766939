"""Continuous batching's step loop with a generate call per group (``join=False``; the running decode
that requests join is tests/serve/backends/test_joined.py): queued jobs of one key decode as one call,
the loop survives a failed decode, and a cancelled row of a group leaves its forwards and the others'
answers unchanged."""

from __future__ import annotations

import pytest

import dllm
from dllm.serve.backends.diffusion import DiffusionBackend
from dllm.serve.backends.jobs import Delta, Done, Failed, JobRequest
from dllm.settings import DecodeSettings

PROMPTS = ["[BOS] sort D A C B [SEP]", "[BOS] reverse A B C D [SEP]", "[BOS] copy A B C [SEP]",
           "[BOS] sort G F E D C B A [SEP]", "[BOS] reverse K J I H G F [SEP]", "[BOS] copy P O N M [SEP]"]
SEVEN = ["[BOS] sort D A C B [SEP]", "[BOS] reverse A B C D [SEP]", "[BOS] copy P O N M [SEP]",
         "[BOS] sort B C A D [SEP]", "[BOS] reverse E F G H [SEP]", "[BOS] copy K L M N [SEP]"]  # 7 tokens each
TEN = ["[BOS] sort G F E D C B A [SEP]", "[BOS] reverse A B C D E F G [SEP]", "[BOS] copy A B C D E F G [SEP]",
       "[BOS] sort P O N M L K J [SEP]"]  # 10 tokens each
SLOW = DecodeSettings(sampler="low_confidence")  # one token per step


@pytest.fixture(scope="module")
def llada():
    return dllm.load("tiny-llada")


def recording(engine):
    """Wrap the backend's decode: the size of every generate call it makes."""
    sizes, decode = [], engine._decode

    def wrapped(jobs, model):
        sizes.append(len(jobs))
        return decode(jobs, model)

    engine._decode = wrapped
    return sizes


def submit_together(engine, specs):
    """Queue every job before the loop can take any (it takes them under the same lock)."""
    with engine._cond:
        return [engine.submit(JobRequest(engine.encode_prompt(p), n, s, step_events=ev)) for p, n, s, ev in specs]


def offline(model, prompt, n, settings=SLOW):
    return dllm.generate(model, prompt, gen_length=n, **settings.generate_kwargs()).texts[0]


def test_prompts_have_the_lengths_the_tests_need(llada):
    engine = DiffusionBackend(llada, name="tiny-llada", mode="serial")
    try:
        assert {len(engine.encode_prompt(p)) for p in SEVEN} == {7}
        assert {len(engine.encode_prompt(p)) for p in TEN} == {10}
        assert len(engine.encode_prompt(PROMPTS[2])) == 6
    finally:
        engine.close()


def test_queued_jobs_of_one_key_decode_as_one_call_whatever_their_prompt_length(llada):
    engine = DiffusionBackend(llada, name="tiny-llada", max_group=4, max_running=16, join=False)
    sizes = recording(engine)
    other = DecodeSettings(sampler="threshold:threshold=0.8", cache="dual", block_length=4)
    specs = ([(p, 8, SLOW, False) for p in SEVEN]  # one key: 4 rows, then 2 ...
             + [(PROMPTS[2], 8, SLOW, False)]  # ... and the same key's 6-token prompt (padded): 3 rows
             + [(SEVEN[0], 12, SLOW, False), (SEVEN[1], 8, other, False)])  # other lengths or settings
    try:
        jobs = submit_together(engine, specs)
        for (p, n, s, _), job in zip(specs, jobs):
            done = job.result(timeout=120)
            assert isinstance(done, Done) and done.text == offline(llada, p, n, s)
    finally:
        engine.close()
    assert sizes == [4, 3, 1, 1]


def test_with_a_cache_prompts_of_other_lengths_share_the_call(llada):
    engine = DiffusionBackend(llada, name="tiny-llada", max_group=8, join=False)
    sizes = recording(engine)
    dual = DecodeSettings(sampler="threshold:threshold=0.8", cache="dual", block_length=4)
    prompts = [SEVEN[0], TEN[0], PROMPTS[2], SEVEN[1]]  # 7, 10, 6 and 7 tokens
    try:
        jobs = submit_together(engine, [(p, 8, dual, False) for p in prompts])
        for p, job in zip(prompts, jobs):
            done = job.result(timeout=120)
            assert isinstance(done, Done) and done.text == offline(llada, p, 8, dual)
    finally:
        engine.close()
    assert sizes == [4]


@pytest.mark.parametrize("cache", ["none", "dual"])
def test_a_cancelled_row_of_a_group_fails_alone(llada, cache):
    engine = DiffusionBackend(llada, name="tiny-llada", max_group=4, join=False)  # generate calls
    sizes = recording(engine)
    slow = DecodeSettings(sampler="low_confidence", cache=cache)
    specs = [(TEN[0], 24, slow, True)] + [(p, 24, slow, False) for p in TEN[1:]]
    try:
        victim, *others = submit_together(engine, specs)
        next(victim.events(timeout=60))  # the group is decoding
        victim.cancel()
        final = victim.result(timeout=60)
        assert isinstance(final, Failed) and final.status == 499
        for (p, n, s, _), job in zip(specs[1:], others):
            events = list(job.events(timeout=120))
            assert events[-1].text == offline(llada, p, n, s) == "".join(e.text for e in events if isinstance(e, Delta))
    finally:
        engine.close()
    assert sizes == [4]
    # the one call ran 24 forwards (one token per step); from the cancel on, they computed 3 rows, not 4
    assert engine.forwards == 24 and 3 * 24 <= engine.forwarded_rows < 4 * 24


def test_a_failed_decode_fails_its_jobs_and_the_loop_goes_on(llada):
    engine = DiffusionBackend(llada, name="tiny-llada", join=False)  # generate calls
    decode, calls = engine._decode, []

    def flaky(jobs, model):
        calls.append(len(jobs))
        if len(calls) == 1:
            raise RuntimeError("boom in the decode")
        return decode(jobs, model)

    engine._decode = flaky
    try:
        first = engine.submit(JobRequest(engine.encode_prompt(PROMPTS[0]), 6, SLOW)).result(timeout=60)
        assert isinstance(first, Failed) and first.status == 500 and "boom in the decode" in first.message
        second = engine.submit(JobRequest(engine.encode_prompt(PROMPTS[1]), 6, SLOW)).result(timeout=60)
        assert isinstance(second, Done) and second.text == offline(llada, PROMPTS[1], 6)
        assert engine.stats().running == 0
    finally:
        engine.close()


def test_a_job_whose_result_is_out_no_longer_counts_as_running(llada):
    import threading

    engine = DiffusionBackend(llada, name="tiny-llada", join=False)
    release, held = engine._release, threading.Event()

    def slow_release(jobs):  # the group leaves the loop only once the test has read the stats
        held.wait(timeout=30)
        release(jobs)

    engine._release = slow_release
    try:
        done = engine.submit(JobRequest(engine.encode_prompt(PROMPTS[0]), 6, SLOW)).result(timeout=60)
        assert isinstance(done, Done)
        assert engine.stats().running == 0  # its Done is out, though its group is still in the loop
    finally:
        held.set()
        engine.close()


def test_the_served_model_refuses_a_forward_from_outside_the_loop(llada):
    import torch

    engine = DiffusionBackend(llada, name="tiny-llada")
    try:
        with pytest.raises(RuntimeError, match="inside a job of the backend's step loop"):
            engine._served(torch.zeros(1, 4, dtype=torch.long))
        done = engine.submit(JobRequest(engine.encode_prompt(PROMPTS[2]), 4, SLOW)).result(timeout=60)
        assert isinstance(done, Done) and done.text == offline(llada, PROMPTS[2], 4)  # the loop is unharmed
    finally:
        engine.close()


@pytest.mark.parametrize("bad", [0, -2, True, 1.5])
def test_max_group_is_checked(llada, bad):
    with pytest.raises(ValueError, match="max_group"):
        DiffusionBackend(llada, name="tiny-llada", mode="serial", max_group=bad)


class Poisoned:
    """The served model, but a forward whose rows hold ``token`` raises (one request's bad input)."""

    def __init__(self, model, token: int) -> None:
        self.model, self.token = model, token

    def __call__(self, input_ids, **kwargs):
        if bool((input_ids == self.token).any()):
            raise RuntimeError("boom in one request's forward")
        return self.model(input_ids, **kwargs)

    def __getattr__(self, name):
        return getattr(self.model, name)


def test_a_failing_forward_fails_only_its_request_not_those_merged_with_it(llada):
    from dllm.serve.backends.scheduling.batcher import BatcherConfig

    # every forward merged (one call costs more than any padding); each request its own generate call
    engine = DiffusionBackend(llada, name="tiny-llada", join=False, batcher=BatcherConfig(call_cost_tokens=10 ** 6))
    poison = engine.encode_prompt("[BOS] copy sudoku4 [SEP]")[2]  # a word in no other prompt or answer
    engine.model_for_loop = Poisoned(llada, poison)
    specs = [("[BOS] copy sudoku4 [SEP]", 3)] + [(p, n) for p, n in zip(SEVEN[:3], (4, 5, 6))]  # four keys: four calls
    try:
        jobs = submit_together(engine, [(p, n, SLOW, False) for p, n in specs])
        bad = jobs[0].result(timeout=60)
        assert isinstance(bad, Failed) and bad.status == 500 and "boom in one request's forward" in bad.message
        for (p, n), job in zip(specs[1:], jobs[1:]):
            done = job.result(timeout=60)
            assert isinstance(done, Done) and done.text == offline(llada, p, n)
        assert engine.merged_calls > 0  # the others' forwards were merged meanwhile
    finally:
        engine.close()
