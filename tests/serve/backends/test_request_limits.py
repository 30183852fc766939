"""What a request may ask of a diffusion server: no model or file of its choosing (``Sampler.loads``),
no size that only the decode loop would refuse or allocate, the OpenAI "off" values of ``top_p`` /
``top_k`` over the server's defaults, a server default ``steps`` that fits a short request, and
``/metrics`` counting a prompt's tokens once whatever ``n``."""

from __future__ import annotations

import re

import httpx2 as httpx
import openai
import pytest

import dllm
from dllm.serve.backends.base import BadRequest
from dllm.serve.backends.diffusion import DiffusionBackend
from dllm.serve.backends.jobs import JobRequest
from dllm.serve.http.app import create_app
from dllm.serve.http.protocol import CompletionBody
from dllm.serve.http.translate import diffusion_settings, sampler_options, samplers_with
from dllm.settings import DecodeSettings
from tests.serve.servers import FakeBackend, LiveServer

PROMPT = "[BOS] sort D A C B [SEP]"


@pytest.fixture(scope="module")
def llada():
    return dllm.load("tiny-llada")


def _backend(llada, **defaults) -> DiffusionBackend:
    return DiffusionBackend(llada, name="tiny-llada", defaults=DecodeSettings.of(**defaults))


def _check(engine: DiffusionBackend, settings: DecodeSettings, n: int = 8) -> None:
    engine.check(JobRequest(engine.encode_prompt(PROMPT), n, settings))


def test_a_request_cannot_name_the_model_a_sampler_loads(llada):
    engine = _backend(llada)
    try:
        _check(engine, DecodeSettings(sampler="apd"))  # the option's default: the server's own value
        for settings, param in ((DecodeSettings.of(sampler="apd", options={"verifier": "some-org/some-model"}),
                                 "sampler_options.verifier"),
                                (DecodeSettings(sampler="apd:verifier=/tmp"), "sampler")):
            with pytest.raises(BadRequest, match="verifier loads a model or file, which this server fixes "
                                                 r"\('tiny-ar-mini'; set it when starting") as err:
                _check(engine, settings)
            assert err.value.param == param
        with pytest.raises(BadRequest, match="verifier must be a causal LM or the name of one .* got 5") as err:
            _check(engine, DecodeSettings.of(sampler="apd", options={"verifier": 5}))
        assert err.value.param == "sampler_options.verifier"
    finally:
        engine.close()
    engine = _backend(llada, sampler="apd", options={"verifier": "tiny-ar"})  # the operator's choice
    try:
        _check(engine, DecodeSettings.of(sampler="apd", options={"verifier": "tiny-ar"}))
        with pytest.raises(BadRequest, match=r"fixes \('tiny-ar'"):
            _check(engine, DecodeSettings.of(sampler="apd", options={"verifier": "tiny-ar-mini"}))
    finally:
        engine.close()


def _body(**fields) -> CompletionBody:
    return CompletionBody(model="tiny-llada", prompt=PROMPT, **fields)


@pytest.mark.parametrize("sampler,fields,options", [
    ("entropy", {"top_p": 1.0}, {"top_p": 1.0}),
    ("fastdllm_v2", {"top_p": 1.0}, {"top_p": 1.0}),  # over its own default, 0.95
    ("entropy", {"top_k": 0}, {"top_k": None}),  # each sampler's own "off"
    ("sdar", {"top_k": 0}, {"top_k": 0}),
    ("low_confidence", {"top_p": 1.0, "top_k": 0}, {}),  # no such option: nothing to turn off
    ("entropy", {"top_p": 0.5, "top_k": 3}, {"top_p": 0.5, "top_k": 3}),
])
def test_the_openai_off_values_turn_a_samplers_option_off(sampler, fields, options):
    assert sampler_options(_body(**fields), sampler) == options


def test_off_over_the_servers_default(llada):
    engine = _backend(llada, sampler="entropy", options={"top_p": 0.5})
    try:
        assert dict(diffusion_settings(_body(), engine, 8).options) == {"top_p": 0.5}
        off = diffusion_settings(_body(top_p=1.0, temperature=1.0, seed=1), engine, 8)
        assert dict(off.options) == {"top_p": 1.0}
        kw = dict(sampler="entropy", gen_length=8, temperature=1.0, seed=1)
        assert (dllm.generate(llada, PROMPT, **off.generate_kwargs(), gen_length=8).texts
                == dllm.generate(llada, PROMPT, **kw).texts)
    finally:
        engine.close()
    assert samplers_with("top_p") == ["entropy", "fastdllm_v2", "maskgit_plus", "origin", "sdar", "topk_margin"]
    with pytest.raises(Exception, match=r"has no top_p option \(samplers with one: entropy, fastdllm_v2"):
        sampler_options(_body(top_p=0.5), "low_confidence")


def test_a_default_steps_above_a_short_requests_length_is_one_token_a_step(llada):
    engine = _backend(llada, steps=8, block_length=8)
    try:
        for n, steps in ((4, 4), (6, 6), (8, 8), (16, 8)):
            settings = engine.resolve_settings(max_tokens=n)
            assert settings.steps == steps, n
            _check(engine, settings, n)
        assert engine.resolve_settings(max_tokens=4, steps=2).steps == 2  # the request's own
        with pytest.raises(BadRequest) as err:
            _check(engine, engine.resolve_settings(max_tokens=4, steps=8), 4)
        assert err.value.param == "steps"
    finally:
        engine.close()


def test_metrics_count_a_prompts_tokens_once_whatever_n():
    with LiveServer(create_app(FakeBackend())) as server:
        client = openai.OpenAI(base_url=server.url + "/v1", api_key="x")
        client.completions.create(model="fake", prompt="1 2 3 4", max_tokens=2, n=3)
        list(client.completions.create(model="fake", prompt="5 6 7", max_tokens=2, n=2, stream=True))
        text = httpx.get(server.url + "/metrics").text
    assert re.search(r"^dllm_prompt_tokens_total 7\.0$", text, re.M), text  # 4 + 3, as the replies' usage
    assert re.search(r'^dllm_request_success_total\{finish_reason="length"\} 5\.0$', text, re.M)  # one a choice
