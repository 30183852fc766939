"""Where dllm serve follows OpenAI / vLLM on the details: an unknown model is 404 ``model_not_found``;
``stream_options`` needs ``stream: true``; completions' ``logprobs: 0`` is refused (no log-probabilities
are computed) rather than answered with null; a prompt the tokenizer cannot encode gets dllm's own
message; the ``Bearer`` scheme is case-insensitive; too many prompts name ``prompt``; an error message
quotes at most ~200 characters of the input; ``usage.completion_tokens`` ends at the stop string.
The HTTP layer over a fake engine on a live uvicorn (127.0.0.1), and the real tiny-llada engine for
the token counts."""

from __future__ import annotations

import json
import re

import httpx2 as httpx
import openai
import pytest

from dllm.serve.backends.base import BadRequest
from dllm.serve.backends.jobs import Done, JobRequest
from dllm.settings import DecodeSettings
from dllm.serve.backends.stream import TextStream, stop_end
from dllm.serve.http.app import bearer_token, create_app
from dllm.serve.http.errors import MESSAGE_LIMIT, QUOTE_LIMIT, ApiError, clip, clip_message, quote
from dllm.serve.http.protocol import MAX_CHOICES
from tests.serve.servers import FakeBackend, LiveServer

HTTP = httpx.Client(timeout=30)


@pytest.fixture(scope="module")
def shared():
    engine = FakeBackend()
    with LiveServer(create_app(engine)) as server:
        yield server, engine


@pytest.fixture
def server(shared):
    server, engine = shared
    engine.jobs.clear()
    engine.checked.clear()
    return server


@pytest.fixture
def engine(shared):
    return shared[1]


def post(server: LiveServer, body, path: str = "/v1/completions", **headers: str) -> httpx.Response:
    content = body if isinstance(body, bytes) else json.dumps(body)
    return HTTP.post(server.url + path, content=content, headers={"Content-Type": "application/json", **headers})


def error(r: httpx.Response, status: int) -> dict:
    assert r.status_code == status, r.text
    err = r.json()["error"]
    assert set(err) == {"message", "type", "param", "code"} and err["message"]
    return err


def client(server: LiveServer, key: str = "none") -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{server.url}/v1", api_key=key, max_retries=0, timeout=30)


# ---- 1. an unknown model: 404 model_not_found ----

@pytest.mark.parametrize("path,body", [
    ("/v1/completions", {"model": "gpt-4o", "prompt": "1"}),
    ("/v1/chat/completions", {"model": "gpt-4o", "messages": [{"role": "user", "content": "1"}]}),
])
def test_an_unknown_model_is_404_model_not_found(server, engine, path, body):
    err = error(post(server, body, path), 404)
    assert (err["code"], err["param"]) == ("model_not_found", "model")
    assert "'gpt-4o'" in err["message"] and "'fake'" in err["message"]
    assert engine.checked == []
    with pytest.raises(openai.NotFoundError) as info:
        client(server).completions.create(model="gpt-4o", prompt="1")
    assert info.value.body["code"] == "model_not_found"


# ---- 2. stream_options needs stream ----

@pytest.mark.parametrize("extra", [{}, {"stream": False}])
def test_stream_options_without_stream_is_400(server, engine, extra):
    err = error(post(server, {"model": "fake", "prompt": "1", "stream_options": {"include_usage": True}, **extra}),
                400)
    assert err["param"] == "stream_options" and "stream=true" in err["message"]
    assert engine.checked == []


def test_stream_options_null_or_with_stream_is_accepted(server):
    assert post(server, {"model": "fake", "prompt": "1", "stream_options": None}).status_code == 200
    r = post(server, {"model": "fake", "prompt": "1", "stream": True, "stream_options": {"include_usage": True}})
    assert r.status_code == 200 and '"usage"' in r.text


# ---- 3. logprobs: refused, never a silent null ----

@pytest.mark.parametrize("path,extra,param", [
    ("/v1/completions", {"logprobs": 0}, "logprobs"),
    ("/v1/completions", {"logprobs": 1}, "logprobs"),
    ("/v1/chat/completions", {"logprobs": True}, "logprobs"),
    ("/v1/chat/completions", {"logprobs": False, "top_logprobs": 0}, "top_logprobs"),
])
def test_logprobs_are_refused_naming_the_field(server, engine, path, extra, param):
    body = {"model": "fake", **({"prompt": "1"} if path == "/v1/completions"
                                else {"messages": [{"role": "user", "content": "1"}]}), **extra}
    err = error(post(server, body, path), 400)
    assert (err["param"], err["code"]) == (param, "unsupported")
    assert "log-probabilities" in err["message"]
    assert engine.checked == []


def test_neutral_logprobs_are_accepted(server):
    assert post(server, {"model": "fake", "prompt": "1", "logprobs": None}).status_code == 200
    r = post(server, {"model": "fake", "messages": [{"role": "user", "content": "1"}], "logprobs": False},
             "/v1/chat/completions")
    assert r.status_code == 200 and r.json()["choices"][0]["logprobs"] is None


# ---- 4. a prompt the tokenizer cannot encode: dllm's words ----

def test_a_tokenizer_failure_is_400_in_dllms_words(server, engine, monkeypatch):
    def broken(prompt):
        raise RuntimeError("TextEncodeInput must be Union[TextInputSequence, Tuple[InputSequence, InputSequence]]")

    monkeypatch.setattr(engine, "encode_prompt", broken)
    err = error(post(server, {"model": "fake", "prompt": "1"}), 400)
    assert err["param"] == "prompt" and "TextEncodeInput" not in err["message"]
    assert err["message"].startswith("the model's tokenizer cannot encode this prompt (it raised RuntimeError)")
    err = error(post(server, {"model": "fake", "messages": [{"role": "user", "content": "1"}]},
                     "/v1/chat/completions"), 400)
    assert err["param"] == "messages" and "cannot encode these messages" in err["message"]


@pytest.mark.parametrize("path,body,param", [
    ("/v1/completions", b'{"model": "fake", "prompt": "1 \\ud800 2"}', "prompt"),
    ("/v1/completions", b'{"model": "fake", "prompt": ["1", "\\udfff"]}', "prompt[1]"),
    ("/v1/chat/completions", b'{"model": "fake", "messages": [{"role": "user", "content": "\\ud83d"}]}',
     "messages[0].content"),
    ("/v1/chat/completions",
     b'{"model": "fake", "messages": [{"role": "user", "content": [{"type": "text", "text": "1\\ud800"}]}]}',
     "messages[0].content[0].text"),
])
def test_a_lone_surrogate_is_not_text(server, engine, path, body, param):
    err = error(post(server, body, path), 400)
    assert err["param"] == param and "lone UTF-16 surrogate" in err["message"]
    assert engine.checked == []
    # a surrogate pair is one character, and text
    ok = post(server, {"model": "fake", "prompt": "1", "stop": ["\ud83d\ude00"]})
    assert ok.status_code == 200


@pytest.mark.parametrize("body", [b'{"model": "fake", "prompt": "1", "sampler_options": {"\\ud800": [1]}}',
                                  b'{"model": "fake", "prompt": "1", "logit_bias": {"\\ud800": "x"}}'])
def test_a_lone_surrogate_echoed_in_an_error_is_escaped(server, body):
    err = error(post(server, body), 400)  # not a 500 for an error body that would not encode
    assert "\\ud800" in err["param"] or "\ufffd" in err["param"]


def test_an_engine_refusal_of_a_chat_prompt_names_messages(server):
    err = error(post(server, {"model": "fake", "messages": [{"role": "user", "content": "hello"}]},
                     "/v1/chat/completions"), 400)
    assert err["param"] == "messages" and "ids as text" in err["message"]


# ---- 5. the Bearer scheme in any case ----

@pytest.mark.parametrize("header,status", [
    ("Bearer s3cret", 200), ("bearer s3cret", 200), ("BEARER s3cret", 200), ("bEaReR  s3cret", 200),
    ("Bearer S3CRET", 401), ("Basic s3cret", 401), ("s3cret", 401), ("Bearer", 401), ("", 401),
])
def test_the_bearer_scheme_is_case_insensitive_the_key_is_not(header, status):
    with LiveServer(create_app(FakeBackend(), api_key="s3cret")) as s:
        r = post(s, {"model": "fake", "prompt": "1", "max_tokens": 1}, **({"Authorization": header} if header else {}))
        assert r.status_code == status, r.text
        if status == 401:
            assert r.json()["error"]["code"] == "invalid_api_key"


def test_bearer_token_parsing():
    assert bearer_token(b"Bearer k") == bearer_token(b"bearer k") == bearer_token(b"BEARER   k ") == b"k"
    assert bearer_token(b"Basic k") is None and bearer_token(b"") is None and bearer_token(b"Bearer") == b""


# ---- 6. too many prompts name "prompt" ----

@pytest.mark.parametrize("prompt,n", [([[1]] * (MAX_CHOICES + 1), 1), ([[1]] * 5, 16), (["1"] * 40, 2)])
def test_too_many_prompts_is_400_naming_prompt(server, engine, prompt, n):
    err = error(post(server, {"model": "fake", "prompt": prompt, "n": n}), 400)
    assert err["param"] == "prompt" and f"at most {MAX_CHOICES}" in err["message"]
    assert engine.checked == []  # refused before any prompt was encoded or checked


def test_more_choices_than_the_queue_holds_is_400_not_a_429_forever(server, engine):
    """A request whose choices can never be queued at once (n > the queue's size) is refused naming
    n (several prompts: prompt); a 429's "retry later" would never succeed."""
    assert engine.max_queue == 4
    err = error(post(server, {"model": "fake", "prompt": "1 2", "n": 5}), 400)
    assert err["param"] == "n" and "queue holds (4)" in err["message"]
    err = error(post(server, {"model": "fake", "prompt": ["1", "2", "3"], "n": 2}), 400)
    assert err["param"] == "prompt"
    assert engine.jobs == []
    assert post(server, {"model": "fake", "prompt": "1 2", "n": 4, "max_tokens": 1}).status_code == 200


# ---- 7. error messages quote at most ~200 characters of the input ----

HUGE = "x" * 20000

LONG_INPUTS = [
    ("/v1/completions", {"model": HUGE, "prompt": "1"}, "model"),
    ("/v1/completions", {"model": "fake", "prompt": "1", HUGE: 1}, None),
    ("/v1/completions", {"model": "fake", "prompt": "1", "sampler_options": {HUGE: [1]}}, None),
    ("/v1/completions", {"model": "fake", "prompt": "1", "sampler": HUGE}, "sampler"),
    ("/v1/completions", {"model": "fake", "prompt": "1", "sampler": HUGE, "top_p": 0.5}, "sampler"),
    ("/v1/completions", {"model": "fake", "prompt": "1", "logit_bias": {HUGE: "a"}}, None),
    ("/v1/completions", {"model": "fake", "prompt": HUGE}, "prompt"),
    ("/v1/completions", {"model": "fake", "prompt": [HUGE, 1]}, "prompt"),
    ("/v1/completions", {"model": "fake", "prompt": "1", "stop": [HUGE, 1]}, "stop"),
    ("/v1/completions", {"model": "fake", "prompt": "1", "user": [HUGE]}, "user"),
    ("/v1/chat/completions", {"model": "fake", "messages": [{"role": HUGE, "content": "1"}]}, "messages[0].role"),
    ("/v1/chat/completions", {"model": "fake", "messages": [{"role": "user", "content": "1", HUGE: 1}]}, None),
    ("/v1/chat/completions", {"model": "fake", "messages": [{"role": "user", "content": "1" + HUGE}]}, "messages"),
]


@pytest.mark.parametrize("path,body,param", LONG_INPUTS, ids=[str(i) for i in range(len(LONG_INPUTS))])
def test_error_messages_quote_at_most_200_characters_of_the_input(server, path, body, param):
    r = post(server, body, path)
    assert r.status_code in (400, 404), r.text
    err = r.json()["error"]
    assert len(err["message"]) <= MESSAGE_LIMIT and len(err["param"] or "") <= QUOTE_LIMIT, err
    assert max(len(run) for run in re.findall("x+", err["message"] + "x")) < QUOTE_LIMIT, err["message"]
    assert "\u2026" in err["message"] or "\u2026" in (err["param"] or ""), err  # the cut is marked
    if param is not None:
        assert err["param"] == param


def test_clip_quote_and_clip_message():
    assert clip("abc", 5) == "abc" and clip("abcdef", 5) == "abcd\u2026"
    assert quote("a" * 500) == "'" + "a" * 198 + "\u2026" and len(quote("a" * 500)) == QUOTE_LIMIT
    engine_text = f"Unknown sampler {'y' * 5000!r}. Valid samplers: fast, threshold"
    clipped = clip_message(engine_text)
    assert clipped.endswith("'. Valid samplers: fast, threshold") and len(clipped) < 250
    assert clip_message(f"got {'9' * 5000}") == "got " + "9" * (QUOTE_LIMIT - 1) + "\u2026"
    assert clip_message(f"unknown model {quote('m' * 5000)};") == f"unknown model {quote('m' * 5000)};"  # clipped once
    assert clip_message("plain words, 'short quotes'") == "plain words, 'short quotes'"
    assert len(clip_message("a b " * 1000)) == MESSAGE_LIMIT
    assert ApiError(400, "x" * 5000, param="p" * 5000).param == "p" * (QUOTE_LIMIT - 1) + "\u2026"


# ---- 8. usage.completion_tokens ends at the stop string ----

WORDS = {1: "A", 2: "B", 3: "C", 4: "D", 5: "E", 6: "F", 9: "<eos>"}


def words(ids):
    return " ".join(WORDS[i] for i in ids)


def test_the_answer_ids_end_with_the_token_that_completes_the_stop_string():
    assert stop_end([1, 2, 3, 4, 5, 6], words, ["D E"]) == 5  # "A B C D E": the stop string is whole
    assert stop_end([1, 2, 3, 4, 5, 6], words, ["C", "B"]) == 2
    assert stop_end([1, 2], words, ["X"]) == 2
    s = TextStream(words, frozenset({9}), ("D E",))
    s.update([1, 2, 3, 4, 5, 6, 9], complete=True)  # a diffusion block committed F and EOS after the stop
    assert (s.text, s.ended, s.answer_ids) == ("A B C ", "stop", [1, 2, 3, 4, 5])


def test_usage_of_a_stopped_diffusion_reply_ends_at_the_stop_string():
    """tiny-llada answers "A B C D E ..." in one block; with stop "D E" the reply is "A B C " and
    counts the five tokens up to the end of the stop string, not every token the block committed."""
    import dllm
    from dllm.serve.backends.diffusion import DiffusionBackend

    model = dllm.load("tiny-llada")
    prompt = "[BOS] sort G F E D C B A [SEP]"
    engine = DiffusionBackend(model, name="tiny-llada")
    try:
        done = engine.submit(JobRequest(engine.encode_prompt(prompt), 7, DecodeSettings(),
                                        stop=("D E",))).result(timeout=60)
        plain = engine.submit(JobRequest(engine.encode_prompt(prompt), 7, DecodeSettings())).result(timeout=60)
    finally:
        engine.close()
    assert isinstance(done, Done) and isinstance(plain, Done)
    assert plain.text.startswith("A B C D E") and plain.completion_tokens > 5
    assert done.text == "A B C " and done.finish_reason == "stop"
    assert done.completion_tokens == 5 and done.token_ids == plain.token_ids[:5]


# ---- a refusal the backend words, clipped the same way ----

def test_an_engine_message_with_a_long_value_is_clipped(server, engine, monkeypatch):
    def check(request):
        raise BadRequest("sampler", f"Unknown sampler {HUGE!r}. Valid samplers: low_confidence, threshold")

    monkeypatch.setattr(engine, "check", check)
    err = error(post(server, {"model": "fake", "prompt": "1"}), 400)
    assert err["message"].endswith("\u2026'. Valid samplers: low_confidence, threshold") and len(err["message"]) < 300
