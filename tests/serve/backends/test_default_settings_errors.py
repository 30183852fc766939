"""A server default (``dllm serve --steps 16 --block-length 8 ...``) that ``generate`` refuses with a
request's fields: the refusal's ``param`` names the request field that meets it (never one the request
did not send) and the message names the server option and what the request can send instead."""

from __future__ import annotations

import re
from typing import Optional

import pytest

import dllm
from dllm.serve.backends.base import BadRequest
from dllm.serve.backends.diffusion import DiffusionBackend
from dllm.serve.backends.jobs import JobRequest
from dllm.serve.http.app import create_app
from dllm.settings import DecodeSettings
from tests.serve.http.test_app import post
from tests.serve.servers import LiveServer

PROMPT = "[BOS] sort D A C B [SEP]"


@pytest.fixture(scope="module")
def llada():
    return dllm.load("tiny-llada")


def _backend(llada, limit: int = 64, **defaults) -> DiffusionBackend:
    return DiffusionBackend(llada, name="tiny-llada", max_tokens_limit=limit, defaults=DecodeSettings.of(**defaults))


def _refusal(engine: DiffusionBackend, max_tokens: int, **fields) -> Optional[BadRequest]:
    """What the HTTP layer does with a request's fields (``resolve_settings``, then ``check`` on the prompt):
    its refusal, None when it passes."""
    try:
        settings = engine.resolve_settings(max_tokens=max_tokens, **fields)
        engine.check(JobRequest(engine.encode_prompt(PROMPT), max_tokens, settings))
    except BadRequest as err:
        return err
    return None


def test_a_default_steps_that_max_tokens_cannot_split_names_max_tokens_and_the_server_options(llada):
    engine = _backend(llada, block_length=8, steps=16)
    try:
        err = _refusal(engine, 24)
        assert err is not None and err.param == "max_tokens", err and err.param
        for said in ("steps=16 cannot be split evenly over 3 blocks", "--steps 16 --block-length 8",
                     "not this request's", "max_tokens=24 makes 3 blocks of 8", "send steps with the request"):
            assert said in str(err), str(err)
        assert _refusal(engine, 24, steps=12) is None  # the request's own steps, as the message says
    finally:
        engine.close()


@pytest.mark.parametrize("block_length,steps", [(8, 16), (4, 6), (3, 12)])
def test_the_max_tokens_the_message_lists_are_those_the_defaults_fit(llada, block_length, steps):
    engine = _backend(llada, limit=48, block_length=block_length, steps=steps)
    try:
        refused = [n for n in range(1, 49) if _refusal(engine, n) is not None]
        assert refused, "these defaults fit every max_tokens: nothing to list"
        listed = set()
        for lo, hi in re.findall(r"(\d+)-(\d+)", str(_refusal(engine, refused[0])).rsplit("fit: ", 1)[-1]):
            listed.update(range(int(lo), int(hi) + 1))
        assert listed == set(range(1, 49)) - set(refused)
        assert {_refusal(engine, n).param for n in refused} == {"max_tokens"}
    finally:
        engine.close()


def test_a_requests_block_length_against_a_default_steps_is_refused_naming_block_length(llada):
    engine = _backend(llada, block_length=8, steps=16)
    try:
        err = _refusal(engine, 16, block_length=3)  # 6 blocks; the server's block length (2 blocks) would do
        assert err is not None and err.param == "block_length", err and err.param
        assert "steps=16 is the server's default (dllm serve --steps 16)" in str(err)
        assert "send steps with the request, or change its block_length" in str(err)
    finally:
        engine.close()


def test_a_requests_steps_over_a_default_block_length_says_where_the_blocks_come_from(llada):
    engine = _backend(llada, block_length=8)
    try:
        err = _refusal(engine, 16, steps=3)
        assert err is not None and err.param == "steps"
        assert "block_length=8 is the server's default (dllm serve --block-length 8)" in str(err), str(err)
        assert _refusal(engine, 16, steps=3, block_length=16) is None  # send block_length too, as it says
    finally:
        engine.close()


@pytest.mark.parametrize("defaults,fields,param,said", [
    ({"cache": "window:buffer=8"}, {"block_length": 16}, "block_length", "(dllm serve --cache window:buffer=8)"),
    ({"cache": "window:buffer=8"}, {}, "max_tokens", "send cache with the request, or change its max_tokens"),
    ({"sampler": "fastdllm_v2", "options": {"small_block_size": 4}}, {"block_length": 6}, "block_length",
     "(dllm serve -o small_block_size=4), not this request's: send sampler_options.small_block_size"),
    ({"sampler": "fastdllm_v2:small_block_size=4"}, {"block_length": 6}, "block_length",
     "(dllm serve --sampler fastdllm_v2:small_block_size=4)"),
])
def test_other_defaults_that_meet_a_request_field_name_that_field(llada, defaults, fields, param, said):
    engine = _backend(llada, **defaults)
    try:
        err = _refusal(engine, 16, **fields)
        assert err is not None and err.param == param, err and err.param
        assert said in str(err), str(err)
    finally:
        engine.close()


def test_the_requests_own_settings_are_refused_as_before(llada):
    engine = _backend(llada, block_length=8, steps=16)
    try:
        err = _refusal(engine, 24, block_length=8, steps=16)  # all its own: generate's words alone
        assert err is not None and err.param == "steps" and "server" not in str(err)
        assert _refusal(engine, 16, seed=-1) is not None  # a bad seed is the request's own
        for n in (5, 8, 12, 16, 32):
            assert _refusal(engine, n, seed=3) is None
    finally:
        engine.close()


def test_the_http_error_names_max_tokens_and_the_server_option(llada):
    engine = _backend(llada, block_length=8, steps=16)
    with LiveServer(create_app(engine)) as server:
        r = post(server, "/v1/completions", {"model": "tiny-llada", "prompt": PROMPT, "max_tokens": 24})
        ok = post(server, "/v1/completions", {"model": "tiny-llada", "prompt": PROMPT, "max_tokens": 24, "steps": 12})
    assert r.status_code == 400, r.text
    error = r.json()["error"]
    assert error["param"] == "max_tokens" and "--steps 16" in error["message"], error
    assert ok.status_code == 200, ok.text
