"""The app over the real backends and embedded models (tiny-llada; tiny-ar with a DFlash drafter) on a
live uvicorn, through the official ``openai`` client: completions, chat, streaming, refusals; every
greedy reply equals the offline ``dllm.generate`` / ``dllm.speculative_generate`` of its prompt."""

from __future__ import annotations

import json

import httpx2 as httpx
import openai
import pytest

from dllm.serve.http.app import create_app
from tests.serve.servers import CHAT_TEMPLATE, LiveServer, offline_diffusion, offline_speculative
from tests.serve.http.test_app import post, sse_events

SORT = "[BOS] sort D A C B [SEP]"
REVERSE = "[BOS] reverse A B C D E F [SEP]"
DFLASH = "dflash:model=tiny-ar-dflash"


@pytest.fixture(scope="module")
def llada():
    import dllm
    from dllm.serve.backends.diffusion import DiffusionBackend

    model = dllm.load("tiny-llada")
    engine = DiffusionBackend(model, name="tiny-llada", max_tokens_limit=64, chat_template=CHAT_TEMPLATE)
    with LiveServer(create_app(engine)) as server:
        yield model, server, openai.OpenAI(base_url=f"{server.url}/v1", api_key="none", max_retries=0, timeout=60)


@pytest.mark.parametrize("extra", [{}, {"sampler": "threshold:threshold=0.7", "cache": "dual", "block_length": 4}],
                         ids=["default", "threshold-dual"])
def test_diffusion_completion_equals_offline_and_stream_equals_completion(llada, extra):
    model, server, c = llada
    out = c.completions.create(model="tiny-llada", prompt=REVERSE, max_tokens=8, extra_body=extra)
    kw = {k: v for k, v in extra.items() if k != "sampler"}
    text, n = offline_diffusion(model, REVERSE, 8, sampler=extra.get("sampler", "low_confidence"), **kw)
    assert out.choices[0].text == text and out.usage.completion_tokens == n
    assert out.choices[0].finish_reason == ("stop" if n < 8 else "length")
    chunks = list(c.completions.create(model="tiny-llada", prompt=REVERSE, max_tokens=8, stream=True, extra_body=extra))
    assert "".join(ch.choices[0].text for ch in chunks) == text
    assert chunks[-1].choices[0].finish_reason == out.choices[0].finish_reason


def test_diffusion_chat_uses_the_template(llada):
    model, server, c = llada
    out = c.chat.completions.create(model="tiny-llada", messages=[{"role": "user", "content": "sort D A C B"}],
                                    max_tokens=5)
    assert out.choices[0].message.content == offline_diffusion(model, SORT, 5)[0] == "A B C D"
    assert out.usage.prompt_tokens == 7  # [BOS] sort D A C B [SEP]


def test_diffusion_step_events_show_the_canvas_filling(llada):
    model, server, c = llada
    r = post(server, "/v1/completions", {"model": "tiny-llada", "prompt": SORT, "max_tokens": 5, "stream": True,
                                         "dllm_events": True, "stop": ["C"]})
    events = sse_events(r.text)
    steps = [json.loads(d) for n, d in events if n == "dllm.step"]
    texts = "".join(json.loads(d)["choices"][0]["text"] for n, d in events if n == "message" and d != "[DONE]")
    assert texts == "A B "  # cut before the stop string
    assert steps and all(len(s["tokens"]) == 5 for s in steps)
    # each step commits what its trace says, and a committed position never changes
    for prev, s in zip(steps, steps[1:]):
        assert s["committed"] == [i for i, t in enumerate(s["trace"]) if t == s["step"]]
        assert all(p is None or p == q for p, q in zip(prev["tokens"], s["tokens"]))
    done = json.loads(next(d for n, d in events if n == "dllm.done"))
    assert done["nfe"] == steps[-1]["nfe"] and done["completion_tokens"] >= 2


@pytest.mark.parametrize("extra,param,says", [
    ({"sampler": "nope"}, "sampler", "threshold"),
    ({"cache": "nope"}, "cache", "dual"),
    ({"sampler": "threshold", "sampler_options": {"treshold": 0.5}}, "sampler_options", "threshold"),
    ({"sampler_options": {"threshold": 2.0}, "sampler": "threshold"}, "sampler_options.threshold", "2.0"),
    ({"block_length": 9}, "block_length", "9"),
    ({"steps": 100}, "steps", "100"),
    ({"max_tokens": 65}, "max_tokens", "64"),
    ({"prompt": "[BOS] sort D A C B zebra [SEP]"}, "prompt", "zebra"),
    ({"prompt": "[BOS] " + "A " * 2050 + "[SEP]"}, "prompt", "2048"),
])
def test_diffusion_refusals_name_the_field(llada, extra, param, says):
    model, server, c = llada
    body = {"model": "tiny-llada", "prompt": SORT, "max_tokens": 8, **extra}
    r = post(server, "/v1/completions", body)
    assert r.status_code == 400, r.text
    err = r.json()["error"]
    assert err["param"] == param and says in err["message"], err
    assert server.server.started and httpx.get(server.url + "/health").json()["running"] == 0


def test_a_negative_seed_is_its_twos_complement(llada):
    """OpenAI's seeds are signed 64-bit: seed -1 is served (as torch reads it, 2**64 - 1), and n = 2 from
    the last seed wraps to 0 for its second choice."""
    model, server, c = llada
    kw = dict(model="tiny-llada", prompt=REVERSE, max_tokens=8, temperature=1.0)
    wrapped = c.completions.create(seed=-1, **kw).choices[0].text
    assert wrapped == c.completions.create(seed=2 ** 64 - 1, **kw).choices[0].text
    pair = c.completions.create(seed=-1, n=2, **kw)
    assert [ch.text for ch in pair.choices] == [wrapped, c.completions.create(seed=0, **kw).choices[0].text]


@pytest.mark.slow  # loading the transformers target takes seconds; http/test_load.py covers it under load too
def test_speculative_server_equals_offline():
    import dllm
    from dllm.serve.backends.speculative import SpeculativeBackend

    target, tok = dllm.load_target("tiny-ar")
    engine = SpeculativeBackend(target, tok, drafter=DFLASH, name="tiny-ar", max_tokens_limit=64,
                                chat_template=CHAT_TEMPLATE)
    with LiveServer(create_app(engine)) as server:
        c = openai.OpenAI(base_url=f"{server.url}/v1", api_key="none", max_retries=0, timeout=60)
        out = c.completions.create(model="tiny-ar", prompt=REVERSE, max_tokens=10)
        assert out.choices[0].text == offline_speculative(target, tok, DFLASH, REVERSE, 10)
        assert out.choices[0].model_extra["dllm"]["acceptance"] >= 1.0
        chunks = list(c.chat.completions.create(model="tiny-ar", messages=[{"role": "user", "content":
                                                "reverse A B C D E F"}], max_tokens=10, stream=True))
        assert "".join(ch.choices[0].delta.content or "" for ch in chunks) == out.choices[0].text
        r = post(server, "/v1/completions", {"model": "tiny-ar", "prompt": REVERSE, "sampler": "threshold"})
        assert r.status_code == 400 and r.json()["error"]["param"] == "sampler"


@pytest.mark.parametrize("extra,text_or_param", [
    ({"sampler": "entropy:top_p=0.9", "top_p": 1}, None),  # a client that always sends top_p=1
    ({"sampler": "entropy:top_k=3", "top_k": 0}, None),
    ({"sampler": "entropy:top_p=0.9", "top_p": 0.9}, None),
    ({"sampler": "entropy:top_p=0.9", "top_p": 0.5}, "top_p"),
])
def test_openai_top_p_top_k_beside_a_spec_that_sets_them(llada, extra, text_or_param):
    """The "off" values 1 / 0 (and the spec's own value) are dropped beside a sampler spec that sets the
    option; another value is refused naming the OpenAI field, not a ``sampler_options`` the client never sent."""
    model, server, c = llada
    r = post(server, "/v1/completions", {"model": "tiny-llada", "prompt": SORT, "max_tokens": 5, **extra})
    if text_or_param is None:
        spec = extra["sampler"]
        assert r.status_code == 200, r.text
        assert r.json()["choices"][0]["text"] == offline_diffusion(model, SORT, 5, sampler=spec)[0]
    else:
        assert r.status_code == 400 and r.json()["error"]["param"] == text_or_param, r.text
        assert "0.9" in r.json()["error"]["message"]


def test_openai_top_p_beside_the_servers_default_spec():
    """A server started with ``--sampler entropy:top_p=0.9``: a client's top_p=1 does not turn every request
    into a 400; another top_p is refused naming top_p and the server's sampler."""
    import dllm
    from dllm.serve.backends.diffusion import DiffusionBackend
    from dllm.settings import DecodeSettings

    model = dllm.load("tiny-llada")
    engine = DiffusionBackend(model, name="tiny-llada", defaults=DecodeSettings(sampler="entropy:top_p=0.9"))
    with LiveServer(create_app(engine)) as server:
        body = {"model": "tiny-llada", "prompt": SORT, "max_tokens": 5}
        r = post(server, "/v1/completions", {**body, "top_p": 1.0})
        assert r.status_code == 200, r.text
        r = post(server, "/v1/completions", {**body, "top_p": 0.5})
        assert r.status_code == 400 and r.json()["error"]["param"] == "top_p"
        assert "server's default sampler 'entropy:top_p=0.9'" in r.json()["error"]["message"]
