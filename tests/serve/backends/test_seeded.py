"""Seeded requests are exact under any load: a job with a seed returns ``dllm.generate`` of its
prompt alone with that seed, whatever else shares its ``generate`` call or its forwards (one
generator per row, ``dllm.samplers.draws``), in every mode."""

from __future__ import annotations

import pytest

import dllm
from dllm.serve.backends.diffusion import DiffusionBackend
from dllm.serve.backends.jobs import Delta, Done, JobRequest
from dllm.settings import DecodeSettings

PROMPTS = ["[BOS] sort D A C B [SEP]", "[BOS] reverse A B C D [SEP]", "[BOS] copy A B C [SEP]",
           "[BOS] sort G F E D C B A [SEP]"]


@pytest.fixture(scope="module")
def llada():
    return dllm.load("tiny-llada")


def _mixed(n: int) -> list[tuple[str, DecodeSettings, int]]:
    """Greedy and sampled requests, seeds repeated across requests, three samplers (``threshold``'s rows
    fill their blocks at different steps), two caches."""
    out = []
    for i in range(n):
        sampled = i % 3 != 0
        settings = DecodeSettings(sampler=("low_confidence", "random", "threshold", "threshold")[i % 4],
                                     cache=("none", "dual")[(i // 2) % 2],
                                     block_length=4, temperature=1.0 if sampled else 0.0,
                                     seed=(5, 7)[i % 2] if sampled else None)
        out.append((PROMPTS[i % len(PROMPTS)], settings, (5, 8)[(i // 4) % 2]))
    return out


@pytest.mark.parametrize("mode", ["continuous", "static", "serial"])
def test_seeded_requests_equal_offline_under_load(llada, mode):
    engine = DiffusionBackend(llada, name="tiny-llada", mode=mode, max_running=16)
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
def test_seeded_rows_that_fill_their_blocks_at_different_steps(llada, mode):
    """``threshold`` at temperature 1: sharing a call, these four rows end blocks at different steps
    (a row whose block is done must draw nothing more in it); each still gets its offline text."""
    engine = DiffusionBackend(llada, name="tiny-llada", mode=mode, max_running=4)
    spec = [(p, DecodeSettings(sampler="threshold", block_length=4, temperature=1.0, seed=seed))
            for p, seed in zip(PROMPTS, (5, 7, 5, 7))]
    try:
        with engine._cond:
            jobs = [engine.submit(JobRequest(engine.encode_prompt(p), 8, s)) for p, s in spec]
        texts = [job.result(60).text for job in jobs]
    finally:
        engine.close()
    assert texts == [dllm.generate(llada, p, gen_length=8, **s.generate_kwargs()).texts[0] for p, s in spec]


@pytest.mark.parametrize("mode", ["continuous", "static"])
def test_identical_seeded_requests_sent_together_agree(llada, mode):
    """Eight identical requests (temperature 1, seed 5) queued at once: eight equal texts, the offline one."""
    engine = DiffusionBackend(llada, name="tiny-llada", mode=mode, max_running=8)
    s = DecodeSettings(sampler="low_confidence", temperature=1.0, seed=5)
    try:
        with engine._cond:
            jobs = [engine.submit(JobRequest(engine.encode_prompt(PROMPTS[0]), 8, s)) for _ in range(8)]
        texts = {job.result(60).text for job in jobs}
        assert texts == {dllm.generate(llada, PROMPTS[0], gen_length=8, **s.generate_kwargs()).texts[0]}
        assert engine.stats().forwarded_rows > engine.stats().forwards  # they did share forwards
    finally:
        engine.close()


async def _ask(c, i: int, prompt: str, s: DecodeSettings, n_tokens: int, stream: bool, n: int) -> list[str]:
    extra = {"sampler": s.sampler, "cache": s.cache, "block_length": s.block_length}
    kw = dict(model="tiny-llada", prompt=prompt, max_tokens=n_tokens, temperature=s.temperature, extra_body=extra)
    if s.seed is not None:
        kw["seed"] = s.seed
    if stream:
        texts = [""]
        async for chunk in await c.completions.create(stream=True, **kw):
            texts[0] += "".join(ch.text for ch in chunk.choices)
        return texts
    out = await c.completions.create(n=n, **kw)
    return [ch.text for ch in sorted(out.choices, key=lambda ch: ch.index)]


@pytest.mark.slow  # 3 servers x 64 requests through HTTP
@pytest.mark.parametrize("mode", ["continuous", "static", "serial"])
def test_64_concurrent_http_requests_equal_offline(llada, mode):
    """Through the server and the official client: greedy and seeded sampled requests, seeds repeated,
    two samplers, two caches, some streamed, some with n = 2 (choice j draws with seed + j)."""
    import asyncio

    import openai

    from dllm.serve.http.app import create_app
    from tests.serve.servers import LiveServer

    spec = [(p, s, n, i % 5 == 1, 2 if i % 7 == 3 and i % 5 != 1 and s.seed is not None else 1)
            for i, (p, s, n) in enumerate(_mixed(64))]
    engine = DiffusionBackend(llada, name="tiny-llada", mode=mode, max_running=16)
    with LiveServer(create_app(engine)) as server:
        async def main():
            async with openai.AsyncOpenAI(base_url=f"{server.url}/v1", api_key="none", max_retries=0,
                                          timeout=120) as c:
                return await asyncio.gather(*[_ask(c, i, *args) for i, args in enumerate(spec)])

        answers = asyncio.run(main())
    for (p, s, n, _, choices), got in zip(spec, answers):
        if s.seed is None and s.sampler == "random":
            continue  # unseeded random order: nothing to compare with
        want = [dllm.generate(llada, p, gen_length=n,
                              **s.replace(seed=None if s.seed is None else s.seed + j).generate_kwargs()).texts[0]
                for j in range(choices)]
        assert got == want, (p, s, n)
