"""dllm.serve.http.app over a fake engine: the HTTP layer alone (shapes, errors, auth, limits, streaming,
disconnects, drain, metrics) against a live uvicorn on 127.0.0.1 with the official ``openai`` client.
The real backends and models: test_app_models.py."""

from __future__ import annotations

import json
import time

import httpx2 as httpx
import openai
import pytest

from dllm.serve.http.app import begin_drain, create_app
from tests.serve.servers import FakeBackend, LiveServer


def client(server: LiveServer, key: str = "none") -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{server.url}/v1", api_key=key, max_retries=0, timeout=30)


@pytest.fixture(scope="module")
def shared():
    """One fake engine and server for the module; ``engine`` resets it for each test."""
    engine = FakeBackend()
    with LiveServer(create_app(engine, max_body_bytes=4096)) as s:
        yield s, engine


@pytest.fixture
def engine(shared):
    e = shared[1]
    e.hold.set()
    deadline = time.monotonic() + 10
    while not all(j.finished for j in e.jobs) and time.monotonic() < deadline:
        time.sleep(0.01)
    e.jobs.clear()
    e.checked.clear()
    e.delay_s, e.fail_with, e.max_queue = 0.0, None, 4
    return e


@pytest.fixture
def server(shared, engine):
    return shared[0]


HTTP = httpx.Client(timeout=30)  # one connection pool for the module's raw requests


def post(server: LiveServer, path: str, body) -> httpx.Response:
    content = body if isinstance(body, (bytes, str)) else json.dumps(body)
    return HTTP.post(server.url + path, content=content, headers={"Content-Type": "application/json"})


def sse_events(text: str) -> list[tuple[str, str]]:
    """(event name or "message", data) of each SSE event in ``text``."""
    out = []
    for block in text.strip().split("\n\n"):
        name, data = "message", []
        for line in block.splitlines():
            if line.startswith("event: "):
                name = line[7:]
            elif line.startswith("data: "):
                data.append(line[6:])
        out.append((name, "\n".join(data)))
    return out


# ---- replies ----

def test_completion_text_usage_and_finish_reason(server, engine):
    c = client(server)
    out = c.completions.create(model="fake", prompt="1 2 3", max_tokens=5)
    assert out.object == "text_completion" and out.model == "fake"
    assert out.choices[0].text == FakeBackend.answer((1, 2, 3), 5) == "B C D B C"
    assert out.choices[0].finish_reason == "length"
    assert (out.usage.prompt_tokens, out.usage.completion_tokens, out.usage.total_tokens) == (3, 5, 8)
    assert out.choices[0].model_extra["dllm"]["nfe"] == 5
    # the request's fields reached the backend as they were given
    req = engine.checked[-1]
    assert req.prompt_ids == (1, 2, 3) and req.max_tokens == 5 and req.stop == ()


def test_streamed_deltas_concatenate_to_the_text(server):
    c = client(server)
    full = c.completions.create(model="fake", prompt=[4, 5], max_tokens=6, stop=["F E"]).choices[0]
    chunks = list(c.completions.create(model="fake", prompt=[4, 5], max_tokens=6, stop=["F E"], stream=True))
    assert "".join(ch.choices[0].text for ch in chunks) == full.text == "E F"
    assert [ch.choices[0].finish_reason for ch in chunks][-1] == full.finish_reason == "stop"
    assert len([ch for ch in chunks if ch.choices[0].text]) == 2  # one delta per final piece, not one blob


def test_chat_and_streamed_chat(server):
    c = client(server)
    msgs = [{"role": "system", "content": "1"}, {"role": "user", "content": [{"type": "text", "text": "2 3"}]}]
    out = c.chat.completions.create(model="fake", messages=msgs, max_tokens=3)
    assert out.object == "chat.completion"
    assert out.choices[0].message.role == "assistant" and out.choices[0].message.content == "B C D"
    chunks = list(c.chat.completions.create(model="fake", messages=msgs, max_tokens=3, stream=True,
                                            stream_options={"include_usage": True}))
    assert chunks[0].choices[0].delta.role == "assistant"
    assert "".join(ch.choices[0].delta.content or "" for ch in chunks if ch.choices) == "B C D"
    assert chunks[-1].choices == [] and chunks[-1].usage.completion_tokens == 3


def test_n_and_several_prompts_give_choices_in_order(server):
    c = client(server)
    out = c.completions.create(model="fake", prompt=[[1], [2]], max_tokens=2, n=2)
    assert [ch.index for ch in out.choices] == [0, 1, 2, 3]
    assert [ch.text for ch in out.choices] == ["B B", "B B", "C C", "C C"]
    assert out.usage.prompt_tokens == 2 and out.usage.completion_tokens == 8
    streamed: dict[int, str] = {}
    for ch in c.completions.create(model="fake", prompt=[[1], [2]], max_tokens=2, n=2, stream=True):
        streamed[ch.choices[0].index] = streamed.get(ch.choices[0].index, "") + ch.choices[0].text
    assert [streamed[i] for i in range(4)] == [ch.text for ch in out.choices]


def test_dllm_events_come_in_order_and_end_with_done(server):
    r = post(server, "/v1/completions", {"model": "fake", "prompt": "1 2", "max_tokens": 3, "stream": True,
                                         "dllm_events": True})
    assert r.status_code == 200 and r.headers["content-type"].startswith("text/event-stream")
    events = sse_events(r.text)
    names = [n for n, _ in events]
    assert names.count("dllm.step") == 3 and names[-2:] == ["dllm.done", "message"] and events[-1][1] == "[DONE]"
    steps = [json.loads(d) for n, d in events if n == "dllm.step"]
    assert [s["committed"] for s in steps] == [[0], [1], [2]]
    assert steps[1]["tokens"] == ["B", "C", None] and steps[1]["trace"] == [0, 1, -1]
    # each step's event comes before that step's text chunk
    first_text = next(i for i, (n, d) in enumerate(events) if n == "message" and '"text":"B"' in d)
    assert names.index("dllm.step") < first_text
    done = json.loads(events[-2][1])
    assert done["completion_tokens"] == 3 and done["nfe"] == 3 and "tokens_per_s" in done and "ttft_s" in done


def test_models_health_metrics_options():
    with LiveServer(create_app(FakeBackend())) as server:
        check_models_health_metrics_options(server)


def check_models_health_metrics_options(server):
    c = client(server)
    assert [m.id for m in c.models.list().data] == ["fake"]
    assert httpx.get(server.url + "/v1/models/fake").json()["id"] == "fake"
    r = httpx.get(server.url + "/v1/models/other")
    assert r.status_code == 404 and r.json()["error"]["param"] == "model"
    assert httpx.get(server.url + "/health").json()["status"] == "ok"
    c.completions.create(model="fake", prompt="1", max_tokens=2)
    post(server, "/v1/completions", {"model": "nope", "prompt": "1"})
    text = httpx.get(server.url + "/metrics").text
    assert 'dllm_requests_total{endpoint="completions",status="200"} 1.0' in text
    assert 'dllm_requests_total{endpoint="completions",status="404"} 1.0' in text
    for name in ("dllm_queue_depth", "dllm_running_batch", "dllm_time_to_first_token_seconds_count",
                 "dllm_time_per_output_token_seconds", "dllm_nfe_per_token_count", "dllm_tokens_per_forward_count",
                 "dllm_acceptance_length", "dllm_model_forwards_total"):
        assert name in text, name
    opts = httpx.get(server.url + "/v1/dllm/options").json()
    assert opts["kind"] == "diffusion" and opts["defaults"]["sampler"] == "low_confidence"
    names = {s["name"] for s in opts["samplers"]}
    assert {"low_confidence", "threshold"} <= names
    threshold = next(s for s in opts["samplers"] if s["name"] == "threshold")
    assert "threshold" in {o["name"] for o in threshold["options"]}
    assert "dual" in {c["name"] for c in opts["caches"]}


# ---- refusals: 400 naming the field, nothing queued ----

BAD = [
    (b"{not json", None, "invalid_json"),
    (b'{"model": "fake", "prompt": "1", "temperature": NaN}', None, "invalid_json"),
    (b"[1, 2]", None, "invalid_json"),
    (b"\xff\xfe", None, "invalid_json"),
    ({"prompt": "1"}, "model", "missing_field"),
    ({"model": "fake"}, "prompt", "missing_field"),
    ({"model": "fake", "prompt": "1", "max_tokens": "5"}, "max_tokens", "invalid_value"),
    ({"model": "fake", "prompt": "1", "max_tokens": 0}, "max_tokens", "invalid_value"),
    ({"model": "fake", "prompt": "1", "max_tokens": 33}, "max_tokens", "invalid_value"),  # the backend's limit
    ({"model": "fake", "prompt": "1", "max_tokens": True}, "max_tokens", "invalid_value"),
    ({"model": "fake", "prompt": "1", "temperature": 3}, "temperature", "invalid_value"),
    ({"model": "fake", "prompt": "1", "n": 17}, "n", "invalid_value"),
    ({"model": "fake", "prompt": "1", "stream": "yes"}, "stream", "invalid_value"),
    ({"model": "fake", "prompt": "1", "stop": [1]}, "stop", "invalid_value"),
    ({"model": "fake", "prompt": "1", "stop": ""}, "stop", "invalid_value"),
    ({"model": "fake", "prompt": 5}, "prompt", "invalid_value"),
    ({"model": "fake", "prompt": [[1], "2"]}, "prompt", "invalid_value"),
    ({"model": "fake", "prompt": "x y"}, "prompt", "invalid_value"),  # the backend's encoder refuses it
    ({"model": "fake", "prompt": "1", "max_tokens": 30, "n": 1, "seed": "1"}, "seed", "invalid_value"),
    ({"model": "fake", "prompt": "1", "sampler": "nope"}, "sampler", "invalid_value"),
    ({"model": "fake", "prompt": "1", "sampler_options": {"threshold": [1]}}, "sampler_options.threshold",
     "invalid_value"),
    ({"model": "fake", "prompt": "1", "top_p": 0.5}, "top_p", "invalid_value"),  # low_confidence has no top_p
    ({"model": "fake", "prompt": "1", "samplr": "threshold"}, "samplr", "unknown_field"),
    ({"model": "fake", "prompt": "1", "stream_options": 1}, "stream_options", "invalid_value"),
    ({"model": "fake", "prompt": "1", "stream": True, "stream_options": {"usage": True}}, "stream_options.usage",
     "unknown_field"),
    ({"model": "fake", "prompt": "1", "logprobs": 2}, "logprobs", "unsupported"),
    ({"model": "fake", "prompt": "1", "echo": True}, "echo", "unsupported"),
    ({"model": "fake", "prompt": "1", "presence_penalty": 0.5}, "presence_penalty", "unsupported"),
    ({"model": "fake", "prompt": "1", "dllm_events": True}, "dllm_events", "invalid_value"),
    ({"model": "fake", "prompt": "1" * 5000}, "body", "body_too_large"),
]


@pytest.mark.parametrize("body,param,code", BAD, ids=[str(i) for i in range(len(BAD))])
def test_bad_completion_is_400_naming_the_field(server, engine, body, param, code):
    r = post(server, "/v1/completions", body)
    assert r.status_code == 400, r.text
    err = r.json()["error"]
    assert (err["param"], err["code"], err["type"]) == (param, code, "invalid_request_error"), err
    assert err["message"]
    assert engine.jobs == []  # nothing reached the decode loop


BAD_CHAT = [
    ({"model": "fake", "messages": []}, "messages"),
    ({"model": "fake", "messages": "hi"}, "messages"),
    ({"model": "fake", "messages": [{"role": "robot", "content": "1"}]}, "messages[0].role"),
    ({"model": "fake", "messages": [{"role": "user", "content": 1}]}, "messages[0].content"),
    ({"model": "fake", "messages": [{"role": "user", "content": [{"type": "image_url", "image_url": "x"}]}]},
     "messages[0].content[0]"),
    ({"model": "fake", "messages": [{"role": "user", "content": "1", "tool_calls": []}]}, "messages[0].tool_calls"),
    ({"model": "fake", "messages": [{"role": "user", "content": "1"}], "max_tokens": 2,
      "max_completion_tokens": 3}, "max_completion_tokens"),
    ({"model": "fake", "messages": [{"role": "user", "content": "1"}], "logprobs": True}, "logprobs"),
    ({"model": "fake", "messages": [{"role": "user", "content": "1"}], "tools": []}, "tools"),
]


@pytest.mark.parametrize("body,param", BAD_CHAT, ids=[str(i) for i in range(len(BAD_CHAT))])
def test_bad_chat_is_400_naming_the_field(server, engine, body, param):
    r = post(server, "/v1/chat/completions", body)
    assert r.status_code == 400, r.text
    assert r.json()["error"]["param"] == param
    assert engine.jobs == []


def test_openai_client_sees_bad_request_with_param(server):
    with pytest.raises(openai.BadRequestError) as info:
        client(server).completions.create(model="fake", prompt="1", max_tokens=2, extra_body={"cache": 3})
    assert info.value.body["param"] == "cache" and "string" in info.value.body["message"]


def test_unknown_route_and_method_are_openai_errors(server):
    r = httpx.get(server.url + "/v1/nothing")
    assert r.status_code == 404 and r.json()["error"]["code"] == "not_found"
    r = httpx.get(server.url + "/v1/completions")
    assert r.status_code == 405 and "GET" in r.json()["error"]["message"]


def test_speculative_server_refuses_diffusion_fields():
    engine = FakeBackend(kind="speculative")
    with LiveServer(create_app(engine)) as s:
        for field, value in (("sampler", "threshold"), ("cache", "dual"), ("block_length", 4), ("steps", 2),
                             ("sampler_options", {"threshold": 0.5})):
            r = post(s, "/v1/completions", {"model": "fake", "prompt": "1", field: value})
            assert r.status_code == 400 and r.json()["error"]["param"] == field, r.text
        out = client(s).completions.create(model="fake", prompt="1", max_tokens=2, top_p=0.5, extra_body={"top_k": 3})
        assert out.choices[0].model_extra["dllm"]["acceptance"] == 2.0
        assert engine.checked[-1].settings.top_p == 0.5 and engine.checked[-1].settings.top_k == 3
        opts = httpx.get(s.url + "/v1/dllm/options").json()
        assert opts["kind"] == "speculative" and opts["samplers"] == [] and opts["defaults"]["temperature"] == 0.0


# ---- auth, limits, faults ----

def test_api_key_is_required_on_v1_only():
    with LiveServer(create_app(FakeBackend(), api_key="s3cret")) as s:
        with pytest.raises(openai.AuthenticationError) as info:
            client(s, "wrong").completions.create(model="fake", prompt="1", max_tokens=1)
        assert info.value.status_code == 401 and info.value.body["code"] == "invalid_api_key"
        r = post(s, "/v1/completions", {"model": "fake", "prompt": "1"})
        assert r.status_code == 401 and r.headers["www-authenticate"] == "Bearer"
        assert httpx.get(s.url + "/v1/models").status_code == 401
        assert client(s, "s3cret").completions.create(model="fake", prompt="1", max_tokens=1).choices[0].text == "B"
        assert httpx.get(s.url + "/health").status_code == 200


def test_full_queue_is_429_with_retry_after(server, engine):
    engine.hold.clear()  # jobs wait: the queue fills
    try:
        for _ in range(engine.max_queue):
            engine.submit(engine_request(engine))
        with pytest.raises(openai.RateLimitError) as info:
            client(server).completions.create(model="fake", prompt="1", max_tokens=1)
        assert info.value.response.headers["retry-after"] == "3"  # 2.5 s rounded up
        assert info.value.body["code"] == "queue_full"
        # n choices are queued all or none
        engine.max_queue += 1
        r = post(server, "/v1/completions", {"model": "fake", "prompt": "1", "n": 2})
        assert r.status_code == 429
        assert [j.cancelled for j in engine.jobs] == [False] * (engine.max_queue - 1) + [True]
    finally:
        engine.hold.set()


def engine_request(engine: FakeBackend):
    from dllm.serve.backends.jobs import JobRequest
    from dllm.settings import DecodeSettings

    return JobRequest(prompt_ids=(1,), max_tokens=1, settings=DecodeSettings())


def test_client_disconnect_mid_stream_cancels_its_job(server, engine):
    engine.delay_s = 0.05
    s = server
    body = {"model": "fake", "prompt": "1 2", "max_tokens": 30, "stream": True}
    with httpx.stream("POST", s.url + "/v1/completions", json=body, timeout=30) as r:
        for line in r.iter_lines():
            if line.startswith("data: ") and '"text":"B"' in line:
                break
    deadline = time.monotonic() + 5
    while not engine.jobs[0].finished and time.monotonic() < deadline:
        time.sleep(0.01)
    final = engine.jobs[0]._final
    assert final is not None and final.status == 499  # left at its next step, not after 30 tokens
    assert time.monotonic() < deadline


def test_client_disconnect_while_waiting_cancels_its_job(server, engine):
    engine.delay_s = 0.05
    s = server
    with pytest.raises(httpx.TimeoutException):
        httpx.post(s.url + "/v1/completions", json={"model": "fake", "prompt": "1", "max_tokens": 30}, timeout=0.3)
    deadline = time.monotonic() + 5
    while not engine.jobs[0].finished and time.monotonic() < deadline:
        time.sleep(0.01)
    assert engine.jobs[0]._final.status == 499


def test_failed_job_is_an_error_reply_and_an_error_chunk(server, engine):
    engine.fail_with = "RuntimeError: boom"
    s = server
    r = post(s, "/v1/completions", {"model": "fake", "prompt": "1"})
    assert r.status_code == 500 and r.json()["error"]["message"] == "RuntimeError: boom"
    with pytest.raises(openai.APIError, match="boom"):
        list(client(s).completions.create(model="fake", prompt="1", max_tokens=2, stream=True))
    assert httpx.get(s.url + "/health").status_code == 200  # the server stays up


def test_drain_refuses_new_requests_and_lets_running_ones_finish():
    engine = FakeBackend(delay_s=0.02)
    app = create_app(engine)
    s = LiveServer(app).__enter__()
    try:
        with httpx.stream("POST", s.url + "/v1/completions", timeout=30,
                          json={"model": "fake", "prompt": "1", "max_tokens": 20, "stream": True}) as r:
            lines = r.iter_lines()
            next(line for line in lines if line.startswith("data: "))
            begin_drain(app)  # what SIGTERM does under `dllm serve`
            refused = post(s, "/v1/completions", {"model": "fake", "prompt": "1"})
            assert refused.status_code == 503 and refused.headers["retry-after"] == "5"
            assert refused.json()["error"]["code"] == "shutting_down"
            assert httpx.get(s.url + "/health").status_code == 503
            s.server.should_exit = True  # uvicorn's graceful shutdown, as after SIGTERM
            rest = list(lines)
        text = "B" + "".join(json.loads(x[6:])["choices"][0]["text"] for x in rest
                             if x.startswith("data: {"))
        assert text == FakeBackend.answer((1,), 20) and [x for x in rest if x][-1] == "data: [DONE]"
    finally:
        s.stop()
    assert not s.thread.is_alive() and engine.closed  # the app closed the backend on shutdown


def test_the_page_and_its_static_files_are_served(tmp_path):
    (tmp_path / "index.html").write_text("<html>dllm page</html>")
    (tmp_path / "page.js").write_text("console.log('x')")
    with LiveServer(create_app(FakeBackend(), static_dir=tmp_path)) as s:
        r = httpx.get(s.url + "/")
        assert r.status_code == 200 and r.text == "<html>dllm page</html>" and "text/html" in r.headers["content-type"]
        assert httpx.get(s.url + "/static/page.js").text == "console.log('x')"
        assert httpx.get(s.url + "/static/nope.js").status_code == 404
    with LiveServer(create_app(FakeBackend(), static_dir=tmp_path / "missing")) as s:
        r = httpx.get(s.url + "/")
        assert r.status_code == 404 and "index.html is missing" in r.json()["error"]["message"]


def test_a_chunked_body_over_the_limit_is_refused_as_it_streams(server, engine):
    def chunks():
        yield b'{"model": "fake", "prompt": "'
        for _ in range(100):
            yield b"1 " * 50  # 10 kB in all, past the 4 kB limit, with no Content-Length
        yield b'"}'

    r = HTTP.post(server.url + "/v1/completions", content=chunks(), headers={"Content-Type": "application/json"})
    assert "content-length" not in r.request.headers and r.request.headers["transfer-encoding"] == "chunked"
    assert r.status_code == 400 and r.json()["error"]["param"] == "body", r.text
    assert engine.jobs == []
