"""A fuzz of a few hundred malformed requests against a live tiny-llada server: each gets a 400 (a 404
for a mutated model name; when the mutation happens to be valid, a 200), never a 5xx, a hang or a raw traceback; the server
stays up and a correct request afterwards still equals the offline output. Seeded: the same
requests every run (slow)."""

from __future__ import annotations

import asyncio
import json
import random
from typing import Any

import httpx2 as httpx
import pytest

from dllm.serve.http.app import create_app
from tests.serve.servers import CHAT_TEMPLATE, LiveServer, offline_diffusion

pytestmark = pytest.mark.slow

PROMPT = "[BOS] sort D A C B [SEP]"
VALID = {"model": "tiny-llada", "prompt": PROMPT, "max_tokens": 5}
VALID_CHAT = {"model": "tiny-llada", "messages": [{"role": "user", "content": "sort D A C B"}], "max_tokens": 5}
NUMBERS = ("max_tokens", "block_length", "steps", "seed", "n", "temperature", "top_p", "top_k")
FIELDS = ("model", "prompt", "max_tokens", "temperature", "top_p", "top_k", "seed", "stop", "n", "stream",
          "stream_options", "sampler", "cache", "block_length", "steps", "sampler_options", "dllm_events",
          "logprobs", "echo", "user", "messages", "best_of", "suffix")
SPECS = ("threshold:threshold=abc", "threshold:threshold=-1", "dual:refresh=0", "dual:refresh=", "nope:x=1",
         "threshold:(", "low_confidence:k=2", ":", "", "a" * 5000, "threshold:threshold=0.5,threshold=0.6",
         "dual:look_back=-3", "window:size=1e400", "fast:cache=(dual:refresh=-1)", "threshold\x00", "🙂")


def odd_value(rng: random.Random) -> Any:
    pool = [None, True, False, 0, -1, 1, 2 ** 31, 2 ** 64, -(2 ** 70), 1e308, -1e-308, 0.5, 3.7, "", " ", "5",
            "abc", "\ud800", "\u0000", "💥" * 50, [], [1], [[]], [None], ["x"] * 40, {}, {"a": 1}, {"threshold": "x"},
            [[1, 2], "3"], rng.choice(SPECS), rng.randint(-10 ** 6, 10 ** 6), rng.random() * 100]
    return rng.choice(pool)


def mutated_body(rng: random.Random, chat: bool) -> bytes:
    """One malformed body: raw bytes, broken JSON, missing fields, odd values in known or unknown
    fields, odd numbers or sampler / cache specs in an otherwise valid body (the backend's checks),
    odd chat messages."""
    kind = rng.randrange(13)
    base: dict[str, Any] = json.loads(json.dumps(VALID_CHAT if chat else VALID))
    if kind == 0:  # raw bytes
        return bytes(rng.randrange(256) for _ in range(rng.randrange(1, 200)))
    if kind == 1:  # truncated JSON
        text = json.dumps({**base, "stop": ["x"]})
        return text[:rng.randrange(1, len(text) - 1)].encode()
    if kind == 2:  # not an object / bad literals / deep nesting
        return rng.choice([b"[]", b"null", b"1", b'"s"', b'{"model": NaN}', b'{"max_tokens": Infinity}',
                           b"{" * 50000, b"[" * 200000 + b"]" * 200000, b'{"a":1,}', b"\xef\xbb\xbf{}"])
    if kind == 3:  # drop required fields
        for key in rng.sample(sorted(base), rng.randrange(1, 3)):
            base.pop(key)
    if kind == 10:  # a valid body but for one spec or sampler option: the backend's registry checks
        name = rng.choice(("sampler", "cache", "sampler_options"))
        base[name] = {rng.choice(("threshold", "k", "tau", "x")): odd_value(rng)} if name == "sampler_options" \
            else rng.choice(SPECS)
        return json.dumps(base).encode()
    if kind == 11:  # a valid body but for one number: ranges, the positions, the plan of blocks
        base[rng.choice(NUMBERS)] = rng.choice((0, -1, 65, 3, 7, 2 ** 63, 10 ** 30, 1.5, 2.5, True))
        return json.dumps(base).encode()
    if kind == 12 and chat:  # odd messages
        base["messages"] = rng.choice(([{"role": "user"}], [{"content": "x"}], [{"role": "user", "content": "zebra"}],
                                       [{"role": "user", "content": [{"type": "text"}]}], [[]], [{"role": 1, "content": ""}],
                                       [{"role": "user", "content": "sort A", "name": 3}], "sort A"))
        return json.dumps(base).encode()
    for _ in range(rng.randrange(1, 4)):  # kinds 3-9: odd values in known and unknown fields
        name = rng.choice(FIELDS) if rng.random() < 0.85 else "".join(rng.choice("abcxyz_") for _ in range(6))
        base[name] = odd_value(rng) if kind != 9 else rng.choice(SPECS)
    try:
        return json.dumps(base).encode()
    except (ValueError, TypeError):
        return json.dumps(VALID).encode()[:-1]


async def fire(url: str, bodies: list[tuple[str, bytes]]) -> list[httpx.Response]:
    limits = httpx.Limits(max_connections=16)
    async with httpx.AsyncClient(timeout=60, limits=limits) as c:
        sem = asyncio.Semaphore(16)

        async def one(path: str, body: bytes) -> httpx.Response:
            async with sem:
                return await c.post(url + path, content=body, headers={"Content-Type": "application/json"})

        return await asyncio.gather(*(one(p, b) for p, b in bodies))


def test_a_fuzz_leaves_the_server_up_and_correct():
    import dllm
    from dllm.serve.backends.diffusion import DiffusionBackend

    model = dllm.load("tiny-llada")
    engine = DiffusionBackend(model, name="tiny-llada", max_tokens_limit=64, chat_template=CHAT_TEMPLATE)
    rng = random.Random(35)
    chats = [rng.random() < 0.3 for _ in range(300)]
    bodies = [("/v1/chat/completions" if chat else "/v1/completions", mutated_body(rng, chat)) for chat in chats]
    with LiveServer(create_app(engine, max_body_bytes=1 << 20)) as server:
        responses = asyncio.run(fire(server.url, bodies))
        statuses = [r.status_code for r in responses]
        assert set(statuses) <= {200, 400, 404}, [(b[:200], r.text[:300]) for (_, b), r in zip(bodies, responses)
                                                  if r.status_code not in (200, 400, 404)][:5]
        assert statuses.count(400) + statuses.count(404) >= 240
        for r in responses:
            if r.status_code == 404:  # a mutated model name
                assert r.json()["error"]["code"] == "model_not_found"
            if r.status_code == 400:
                err = r.json()["error"]
                assert err["type"] == "invalid_request_error" and err["message"]
                assert "Traceback" not in err["message"] and len(err["message"]) <= 1000
                assert err["param"] is None or isinstance(err["param"], str)
        assert httpx.get(server.url + "/health").json()["status"] == "ok"
        out = httpx.post(server.url + "/v1/completions", json=VALID, timeout=60).json()
        assert out["choices"][0]["text"] == offline_diffusion(model, PROMPT, 5)[0] == "A B C D"
        stats = engine.stats()
    assert stats.running == 0 and stats.queued == 0
