"""The serving backends without HTTP: every greedy job equals ``dllm.generate`` on its prompt alone,
under load, in every mode; deltas add up to the text; cancel, stops, limits and shutdown."""

from __future__ import annotations

import threading
import time

import pytest

import dllm
from dllm.serve.backends.base import BadRequest
from dllm.serve.backends.diffusion import DiffusionBackend
from dllm.serve.backends.jobs import BackendClosed, Delta, Done, Failed, JobRequest, QueueFull, Step
from dllm.settings import DecodeSettings

PROMPTS = ["[BOS] sort D A C B [SEP]", "[BOS] reverse A B C D [SEP]", "[BOS] copy A B C [SEP]",
           "[BOS] sort G F E D C B A [SEP]", "[BOS] reverse K J I H G F [SEP]", "[BOS] copy P O N M [SEP]"]
SETTINGS = [DecodeSettings(sampler="fast"), DecodeSettings(sampler="low_confidence", cache="dual"),
            DecodeSettings(sampler="threshold:threshold=0.8", cache="prefix", block_length=4),
            DecodeSettings(sampler="low_confidence", block_length=4, cache="dual")]


@pytest.fixture(scope="module")
def llada():
    return dllm.load("tiny-llada")


@pytest.fixture(scope="module")
def dream():
    return dllm.load("tiny-dream")


def run_all(engine, model, jobs_spec):
    jobs = [(p, s, n, engine.submit(JobRequest(engine.encode_prompt(p), n, s, step_events=ev)))
            for p, s, n, ev in jobs_spec]
    results = []
    for p, s, n, job in jobs:
        events = list(job.events(timeout=120))
        done = events[-1]
        assert isinstance(done, Done), done
        offline = dllm.generate(model, p, gen_length=n, **s.generate_kwargs()).texts[0]
        deltas = "".join(e.text for e in events if isinstance(e, Delta))
        results.append((done.text, offline, deltas, events))
    return results


def mixed(n):
    return [(PROMPTS[i % len(PROMPTS)], SETTINGS[i % len(SETTINGS)], (5, 8, 12)[i % 3], i % 4 == 0)
            for i in range(n)]


@pytest.mark.parametrize("mode", ["continuous", "static", "serial"])
def test_every_mode_equals_offline(llada, mode):
    engine = DiffusionBackend(llada, name="tiny-llada", mode=mode, max_running=8)
    try:
        for text, offline, deltas, _ in run_all(engine, llada, mixed(8)):
            assert text == offline == deltas
    finally:
        engine.close()


def test_continuous_merges_forwards_and_equals_offline_dream(dream):
    engine = DiffusionBackend(dream, name="tiny-dream", max_running=16)
    try:
        spec = [(PROMPTS[i % 6], DecodeSettings(sampler=("fast", "low_confidence")[i % 2]), (5, 9)[i % 2], False)
                for i in range(12)]
        for text, offline, deltas, _ in run_all(engine, dream, spec):
            assert text == offline == deltas
        stats = engine.stats()
        assert stats.forwarded_rows > stats.forwards  # some forwards carried several requests' rows
    finally:
        engine.close()


def test_step_events_trace_the_canvas(llada):
    engine = DiffusionBackend(llada, name="tiny-llada")
    try:
        job = engine.submit(JobRequest(engine.encode_prompt(PROMPTS[0]), 6, DecodeSettings(), step_events=True))
        events = list(job.events(timeout=60))
    finally:
        engine.close()
    steps = [e for e in events if isinstance(e, Step)]
    assert [s.step for s in steps] == list(range(len(steps))) and steps
    for s in steps:  # the committed positions are the ones whose trace is this step
        assert s.committed == tuple(i for i, t in enumerate(s.trace) if t == s.step)
        assert all((tok is None) == (t < 0) for tok, t in zip(s.tokens, s.trace))
    assert sum(len(s.committed) for s in steps) == sum(t >= 0 for t in steps[-1].trace)


def test_eos_ends_the_row_early_with_the_offline_text(llada):
    engine = DiffusionBackend(llada, name="tiny-llada")
    try:  # the tiny models answer exactly: four words, then EOS in the fifth position
        settings = DecodeSettings(sampler="low_confidence")
        job = engine.submit(JobRequest(engine.encode_prompt(PROMPTS[0]), 5, settings))
        done = job.result(timeout=60)
    finally:
        engine.close()
    out = dllm.generate(llada, PROMPTS[0], gen_length=5, stop_at_eos=True, **settings.generate_kwargs())
    assert done.text == out.texts[0] == "A B C D" and done.finish_reason == "stop"
    assert done.completion_tokens == 4 and done.nfe <= out.nfe


def test_stop_string_cuts_before_it(llada):
    engine = DiffusionBackend(llada, name="tiny-llada")
    try:
        job = engine.submit(JobRequest(engine.encode_prompt(PROMPTS[3]), 7, DecodeSettings(), stop=("D E",)))
        events = list(job.events(timeout=60))
    finally:
        engine.close()
    offline = dllm.generate(llada, PROMPTS[3], gen_length=7).texts[0]
    assert offline.startswith("A B C D E")
    done = events[-1]
    assert done.text == offline[:offline.index("D E")] == "A B C " and done.finish_reason == "stop"
    assert "".join(e.text for e in events if isinstance(e, Delta)) == done.text


@pytest.mark.parametrize("steps", [1, 5])
def test_overlapping_stop_strings_give_one_answer_whatever_a_step_commits(llada, steps):
    # "B" is completed by the 2nd answer token, "A B C" (starting earlier) by the 3rd: the answer stops
    # after "A B" with the text "A " (as speculative_generate and vLLM stop), whether one step commits
    # the whole answer (steps=1) or one token (steps=5)
    engine = DiffusionBackend(llada, name="tiny-llada")
    try:
        job = engine.submit(JobRequest(engine.encode_prompt(PROMPTS[0]), 5, DecodeSettings(steps=steps),
                                       stop=("A B C", "B"), stream=True))
        events = list(job.events(timeout=60))
    finally:
        engine.close()
    done = events[-1]
    assert dllm.generate(llada, PROMPTS[0], gen_length=5, steps=steps).texts[0] == "A B C D"
    assert done.text == "A " and done.completion_tokens == 2 and done.finish_reason == "stop"
    assert "".join(e.text for e in events if isinstance(e, Delta)) == done.text


def test_cancel_leaves_the_batch_and_others_are_unchanged(llada):
    engine = DiffusionBackend(llada, name="tiny-llada", max_running=4)
    try:
        slow = DecodeSettings(sampler="low_confidence")  # one token per step: 24 steps
        victim = engine.submit(JobRequest(engine.encode_prompt(PROMPTS[3]), 24, slow, step_events=True))
        others = [engine.submit(JobRequest(engine.encode_prompt(p), 8, slow)) for p in PROMPTS[:3]]
        first = next(victim.events(timeout=60))
        assert isinstance(first, (Step, Delta))
        victim.cancel()
        final = victim.result(timeout=60)
        assert isinstance(final, Failed) and final.status == 499
        for p, job in zip(PROMPTS[:3], others):
            assert job.result(timeout=60).text == dllm.generate(llada, p, gen_length=8, sampler="low_confidence").texts[0]
    finally:
        engine.close()


def test_bad_requests_name_the_field(llada):
    engine = DiffusionBackend(llada, name="tiny-llada", max_tokens_limit=64)
    ids = engine.encode_prompt(PROMPTS[0])
    cases = [
        (DecodeSettings(sampler="nope"), 5, "sampler"),
        (DecodeSettings(cache="nope"), 5, "cache"),
        (DecodeSettings(sampler="threshold", options=(("bogus", 1),)), 5, "sampler_options"),
        (DecodeSettings(block_length=7), 5, "block_length"),
        (DecodeSettings(temperature=-1.0), 5, "temperature"),
        (DecodeSettings(seed=-3), 5, "seed"),
        (DecodeSettings(), 65, "max_tokens"),
        (DecodeSettings(), 0, "max_tokens"),
    ]
    try:
        for settings, n, param in cases:
            with pytest.raises(BadRequest) as err:
                engine.submit(JobRequest(ids, n, settings))
            assert err.value.param == param, (settings, n, err.value)
        with pytest.raises(BadRequest) as err:
            engine.encode_prompt("[BOS] sort ZZTOP [SEP]")
        assert err.value.param == "prompt" and "ZZTOP" in str(err.value)
        with pytest.raises(BadRequest) as err:
            engine.submit(JobRequest(ids * 300, 8, DecodeSettings()))
        assert err.value.param == "prompt" and "positions" in str(err.value)
        with pytest.raises(BadRequest) as err:
            engine.encode_chat([{"role": "user", "content": "sort A B"}])
        assert err.value.param == "messages" and "--chat-template" in str(err.value)
        assert engine.stats().queued == 0 and engine.stats().running == 0  # nothing reached the loop
    finally:
        engine.close()


def test_chat_template_given_to_the_engine(llada):
    template = "[BOS] {% for m in messages %}{{ m['content'] }}{% endfor %} [SEP]"
    engine = DiffusionBackend(llada, name="tiny-llada", chat_template=template)
    try:
        ids = engine.encode_chat([{"role": "user", "content": "sort D A C B"}])
        assert ids == engine.encode_prompt(PROMPTS[0])
    finally:
        engine.close()


def test_full_queue_and_closed_engine_refuse(llada):
    engine = DiffusionBackend(llada, name="tiny-llada", mode="serial", max_queue=2)
    ids = engine.encode_prompt(PROMPTS[0])
    slow = DecodeSettings(sampler="low_confidence")
    jobs = []
    with pytest.raises(QueueFull) as err:
        for _ in range(10):
            jobs.append(engine.submit(JobRequest(ids, 24, slow)))
    assert err.value.retry_after > 0 and len(jobs) >= 2
    engine.close(drain=True, timeout=60)  # queued and running jobs finish
    assert all(isinstance(j.result(timeout=1), Done) for j in jobs)
    with pytest.raises(BackendClosed):
        engine.submit(JobRequest(ids, 5, slow))


def test_close_without_drain_fails_the_queued(llada):
    engine = DiffusionBackend(llada, name="tiny-llada", mode="serial")
    ids = engine.encode_prompt(PROMPTS[0])
    jobs = [engine.submit(JobRequest(ids, 24, DecodeSettings(sampler="low_confidence"))) for _ in range(4)]
    time.sleep(0.05)
    engine.close(drain=False, timeout=30)
    finals = [j.result(timeout=5) for j in jobs]
    assert any(isinstance(f, Failed) and f.status in (499, 503) for f in finals)


def test_resolve_settings_over_defaults(llada):
    engine = DiffusionBackend(llada, name="tiny-llada", defaults=DecodeSettings(
        sampler="threshold", options=(("threshold", 0.7),), block_length=32, cache="dual"))
    try:
        s = engine.resolve_settings(max_tokens=5)
        assert (s.sampler, s.options, s.block_length, s.cache) == ("threshold", (("threshold", 0.7),), 5, "dual")
        s = engine.resolve_settings(max_tokens=40, sampler="fast", options={"tau_conf": 0.8})
        assert (s.sampler, s.options, s.block_length) == ("fast", (("tau_conf", 0.8),), 32)
        engine.check(JobRequest(engine.encode_prompt(PROMPTS[0]), 5, engine.resolve_settings(max_tokens=5)))
    finally:
        engine.close()


def test_concurrent_submitters(llada):
    """Submitting from many threads at once: every job ends, each equal to its offline text."""
    engine = DiffusionBackend(llada, name="tiny-llada", max_running=8)
    results: dict[int, str] = {}

    def client(i):
        p = PROMPTS[i % len(PROMPTS)]
        results[i] = engine.submit(JobRequest(engine.encode_prompt(p), 6, DecodeSettings(sampler="fast"))).result(60).text

    try:
        threads = [threading.Thread(target=client, args=(i,)) for i in range(12)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(90)
        for i, text in results.items():
            assert text == dllm.generate(llada, PROMPTS[i % len(PROMPTS)], gen_length=6, sampler="fast").texts[0]
        assert len(results) == 12
    finally:
        engine.close()


def test_aevents_wakes_without_polling(llada):
    import asyncio

    engine = DiffusionBackend(llada, name="tiny-llada")

    async def read():
        job = engine.submit(JobRequest(engine.encode_prompt(PROMPTS[0]), 5, DecodeSettings(), step_events=True))
        t0 = time.perf_counter()
        events = [e async for e in job.aevents(poll_s=30.0)]  # a 30 s safety net: only emit's wakeups are fast
        return events, time.perf_counter() - t0

    try:
        events, took = asyncio.run(read())
    finally:
        engine.close()
    assert isinstance(events[-1], Done) and events[-1].text == "A B C D" and took < 20


def test_block_causal_model_served_continuously_equals_offline():
    """SDAR (block-causal): prompts ending at different offsets of the block grid share merged
    forwards (the block mask comes from positions) and each equals generate alone; approximate
    caches are refused before decoding, naming the cache."""
    sdar = dllm.load("tiny-random-sdar")
    bs = sdar.config.block_size
    engine = DiffusionBackend(sdar, name="tiny-random-sdar", max_running=8)
    try:
        prompts = [[5 + (i * 7 + j) % 40 for j in range(3 + i)] for i in range(6)]  # lengths 3..8: every offset
        settings = [DecodeSettings(sampler="sdar", cache="block"), DecodeSettings(sampler="low_confidence")]
        jobs = [(p, s, engine.submit(JobRequest(tuple(p), 2 * bs, s))) for p in prompts for s in settings]
        for p, s, job in jobs:
            done = job.result(timeout=120)
            assert isinstance(done, Done), done
            out = dllm.generate(sdar, [p], gen_length=2 * bs, **s.generate_kwargs())
            assert list(done.token_ids) == [t for t in out.sequences[0, out.prompt_length:].tolist()
                                            if t not in sdar.eos_ids][:len(done.token_ids)]
            assert done.text == out.texts[0]
        with pytest.raises(BadRequest) as err:
            engine.submit(JobRequest(tuple(prompts[0]), 2 * bs, DecodeSettings(cache="dual")))
        assert err.value.param == "cache" and "block" in str(err.value)
    finally:
        engine.close()


def test_soft_input_requests_under_load_equal_offline(llada):
    """DMax feeds mixed input embeddings (soft inputs): its forwards run alone, never merged with
    the other requests' (a merged forward would drop the soft inputs and decode other tokens)."""
    engine = DiffusionBackend(llada, name="tiny-llada", max_running=8)
    settings = [DecodeSettings(sampler="dmax"), DecodeSettings(sampler="low_confidence")]
    try:
        with engine._cond:  # every job queued before the loop takes any: they decode together
            jobs = [(p, s, engine.submit(JobRequest(engine.encode_prompt(p), 8, s)))
                    for p in PROMPTS[:4] for s in settings]
        for p, s, job in jobs:
            done = job.result(timeout=120)
            assert isinstance(done, Done), done
            assert done.text == dllm.generate(llada, p, gen_length=8, **s.generate_kwargs()).texts[0]
    finally:
        engine.close()


@pytest.mark.parametrize("n,block_length", [(5, None), (10, 5)])
def test_a_refining_samplers_stream_is_final_only_left_of_its_block(llada, n, block_length):
    """DMax rewrites the committed tokens of its current block until the block settles
    (``Sampler.refines``): a streamed or stop-string request sends only the blocks before it, so its
    text is the offline one (the committed left prefix of a mid-block step is not final)."""
    settings = DecodeSettings(sampler="dmax", block_length=block_length)
    prompt = PROMPTS[3]  # its blocks take several steps each: the committed tokens are rewritten
    offline = dllm.generate(llada, prompt, gen_length=n, **settings.generate_kwargs()).texts[0]
    engine = DiffusionBackend(llada, name="tiny-llada")
    try:
        for stream, stop in [(True, ()), (False, ("Z",))]:
            job = engine.submit(JobRequest(engine.encode_prompt(prompt), n, settings, stream=stream, stop=stop))
            events = list(job.events(timeout=60))
            assert isinstance(events[-1], Done) and events[-1].text == offline
            assert "".join(e.text for e in events if isinstance(e, Delta)) == offline
    finally:
        engine.close()


@pytest.mark.parametrize("mode,join", [("static", True), ("continuous", False), ("continuous", True)])
def test_tokens_per_step_settings_decode_in_every_mode(llada, mode, join):
    """Settings with ``tokens_per_step`` (k, as ``DecodeSettings.parse("low_confidence:k=2")`` gives
    them) pass the checks, so every mode decodes them: k tokens a step, as generate with those steps."""
    settings = DecodeSettings(sampler="low_confidence", tokens_per_step=2, block_length=4)
    ids = None
    engine = DiffusionBackend(llada, name="tiny-llada", mode=mode, join=join)
    try:
        ids = engine.encode_prompt(PROMPTS[0])
        done = engine.submit(JobRequest(ids, 8, settings)).result(timeout=60)
    finally:
        engine.close()
    out = dllm.generate(llada, PROMPTS[0], gen_length=8, **settings.with_steps(llada, [ids], 8).generate_kwargs())
    assert isinstance(done, Done), done
    assert done.text == out.texts[0] and done.nfe == out.nfe == 4
