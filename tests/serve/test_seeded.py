"""Seeded requests are exact under any load: a job with a seed returns ``dllm.generate`` of its
prompt alone with that seed, whatever else shares its ``generate`` call or its forwards (one
generator per row, ``dllm.samplers.draws``), in every mode."""

from __future__ import annotations

import pytest

import dllm
from dllm.serve.engines.diffusion import DiffusionEngine
from dllm.serve.engines.jobs import Delta, Done, JobRequest
from dllm.settings import DecodeSettings

PROMPTS = ["[BOS] sort D A C B [SEP]", "[BOS] reverse A B C D [SEP]", "[BOS] copy A B C [SEP]",
           "[BOS] sort G F E D C B A [SEP]"]


@pytest.fixture(scope="module")
def llada():
    return dllm.load("tiny-llada")


def _mixed(n: int) -> list[tuple[str, DecodeSettings, int]]:
    """Greedy and sampled requests, seeds repeated across requests, two samplers, two caches."""
    out = []
    for i in range(n):
        sampled = i % 3 != 0
        settings = DecodeSettings(sampler=("low_confidence", "random")[i % 2], cache=("none", "dual")[(i // 2) % 2],
                                     block_length=4, temperature=1.0 if sampled else 0.0,
                                     seed=(5, 7)[i % 2] if sampled else None)
        out.append((PROMPTS[i % len(PROMPTS)], settings, (5, 8)[(i // 4) % 2]))
    return out


@pytest.mark.parametrize("mode", ["continuous", "static", "serial"])
def test_seeded_requests_equal_offline_under_load(llada, mode):
    engine = DiffusionEngine(llada, name="tiny-llada", mode=mode, max_running=16)
    try:
        spec = _mixed(48)
        with engine._cond:  # queued together: they share calls and forwards
            jobs = [engine.submit(JobRequest(engine.encode_prompt(p), n, s)) for p, s, n in spec]
        for (p, s, n), job in zip(spec, jobs):
            events = list(job.events(timeout=120))
            done = events[-1]
            assert isinstance(done, Done), done
            if s.seed is None and s.sampler == "random":
                continue  # unseeded random order: nothing to compare with
            offline = dllm.generate(llada, p, gen_length=n, **s.generate_kwargs()).texts[0]
            assert done.text == offline == "".join(e.text for e in events if isinstance(e, Delta)), (p, s, n)
    finally:
        engine.close()


@pytest.mark.parametrize("mode", ["continuous", "static"])
def test_identical_seeded_requests_sent_together_agree(llada, mode):
    """Eight identical requests (temperature 1, seed 5) queued at once: eight equal texts, the offline one."""
    engine = DiffusionEngine(llada, name="tiny-llada", mode=mode, max_running=8)
    s = DecodeSettings(sampler="low_confidence", temperature=1.0, seed=5)
    try:
        with engine._cond:
            jobs = [engine.submit(JobRequest(engine.encode_prompt(PROMPTS[0]), 8, s)) for _ in range(8)]
        texts = {job.result(60).text for job in jobs}
        assert texts == {dllm.generate(llada, PROMPTS[0], gen_length=8, **s.generate_kwargs()).texts[0]}
        assert engine.stats().forwarded_rows > engine.stats().forwards  # they did share forwards
    finally:
        engine.close()
