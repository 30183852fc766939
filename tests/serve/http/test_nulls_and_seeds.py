"""OpenAI's nullable fields and seed range through the official ``openai`` client: ``n``, ``stream`` and
``echo`` are "integer / boolean or null" (the client sends ``n=None`` as ``"n": null``), null meaning the
default; ``seed`` is any 64-bit integer, negative ones read as ``torch.Generator.manual_seed`` reads them
(two's complement), and choice j of ``n`` draws with ``(seed + j) % 2**64``; a request without
``max_tokens`` gets the server's default, at most its limit. The HTTP layer over a fake engine on a live
uvicorn (127.0.0.1)."""

from __future__ import annotations

import openai
import pytest

from dllm.serve.http.app import create_app
from dllm.serve.http.translate import choice_seed
from tests.serve.servers import FakeBackend, LiveServer


@pytest.fixture(scope="module")
def shared():
    engine = FakeBackend()
    with LiveServer(create_app(engine)) as server:
        yield server, engine, openai.OpenAI(base_url=f"{server.url}/v1", api_key="none", max_retries=0, timeout=30)


@pytest.fixture
def setup(shared):
    shared[1].checked.clear()
    shared[1].jobs.clear()
    return shared


@pytest.mark.parametrize("extra", [{"n": None}, {"stream": None}, {"echo": None}, {"n": None, "stream": None}],
                         ids=["n", "stream", "echo", "n-stream"])
def test_null_n_stream_echo_mean_the_default(setup, extra):
    server, engine, c = setup
    out = c.completions.create(model="fake", prompt="1 2 3", max_tokens=3, **extra)
    assert [ch.text for ch in out.choices] == ["B C D"] and out.object == "text_completion"
    chat = c.chat.completions.create(model="fake", messages=[{"role": "user", "content": "1 2"}], max_tokens=3,
                                     **{k: v for k, v in extra.items() if k != "echo"})
    assert [ch.message.content for ch in chat.choices] == ["B C B"]
    assert all(not r.stream for r in engine.checked)


def test_null_stream_options_still_needs_stream(setup):
    server, engine, c = setup
    with pytest.raises(openai.BadRequestError) as err:
        c.completions.create(model="fake", prompt="1 2", max_tokens=2, stream=None,
                             stream_options={"include_usage": True})
    assert err.value.body["param"] == "stream_options"


@pytest.mark.parametrize("seed, n, seeds", [
    (-1, 1, [2 ** 64 - 1]),
    (-(2 ** 63), 2, [2 ** 63, 2 ** 63 + 1]),
    (2 ** 64 - 1, 3, [2 ** 64 - 1, 0, 1]),
    (5, 2, [5, 6]),
])
def test_seeds_are_wrapped_into_the_generators_range(setup, seed, n, seeds):
    server, engine, c = setup
    out = c.completions.create(model="fake", prompt="1 2", max_tokens=2, seed=seed, n=n)
    assert len(out.choices) == n
    assert [j.request.settings.seed for j in engine.jobs] == seeds


def test_choice_seed():
    assert [choice_seed(-2, j) for j in range(3)] == [2 ** 64 - 2, 2 ** 64 - 1, 0]
    assert choice_seed(7, 0) == 7


def test_the_default_max_tokens_is_at_most_the_limit():
    """``dllm serve --max-tokens-limit 8`` (default max_tokens 16): a request without max_tokens gets 8
    tokens, not a 400 about a max_tokens=16 it never sent."""
    import httpx2 as httpx

    engine = FakeBackend(max_tokens_limit=8)
    with LiveServer(create_app(engine, default_max_tokens=16)) as server:
        c = openai.OpenAI(base_url=f"{server.url}/v1", api_key="none", max_retries=0, timeout=30)
        out = c.completions.create(model="fake", prompt="1 2")
        assert out.usage.completion_tokens == 8 and out.choices[0].finish_reason == "length"
        assert httpx.get(server.url + "/v1/dllm/options").json()["default_max_tokens"] == 8
