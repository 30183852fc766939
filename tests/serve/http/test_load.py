"""Under load: >= 64 concurrent requests (mixed tasks, lengths, samplers, caches, completions and chat,
streamed and not, some clients leaving mid-stream) against a live server; every greedy reply equals
the offline ``dllm.generate`` (tiny-llada, tiny-dream) / ``dllm.speculative_generate`` (tiny-ar +
DFlash) of its prompt alone, and the forwards really were batched. Slow: each test runs well under
a minute on a quiet 2-core machine."""

from __future__ import annotations

import asyncio
import threading
import time
from dataclasses import dataclass, field
from typing import Any, Optional

import openai
import pytest

from dllm.serve.http.app import create_app
from tests.serve.servers import CHAT_TEMPLATE, LiveServer, offline_diffusion, offline_speculative

pytestmark = pytest.mark.slow

DIFFUSION_SETTINGS = (
    {"sampler": "low_confidence", "cache": "none"},
    {"sampler": "threshold:threshold=0.7", "cache": "none"},
    {"sampler": "low_confidence", "cache": "dual", "block_length": 4},
    {"sampler": "threshold:threshold=0.7", "cache": "dual", "block_length": 4},
)
DFLASH = "dflash:model=tiny-ar-dflash"


def stress_prompts(n: int, suite: str = "pb-mini") -> list[tuple[str, int]]:
    """``n`` test-split prompts cycling through the suite's tasks, with each task's answer length."""
    from dllm.tasks import answer_length, prompt_words, suite_task_names, test_split

    names = suite_task_names(suite)
    out = []
    for i in range(n):
        name = names[i % len(names)]
        ex = test_split(name, n=i // len(names) + 1)[i // len(names)]
        out.append((" ".join(prompt_words(ex)), answer_length(name, ex.size)))
    return out


@dataclass
class Call:
    prompt: str
    max_tokens: int
    extra: dict[str, Any]
    stream: bool
    chat: bool = False
    leave: bool = False  # the client goes away after its first chunk
    stop: Optional[list[str]] = None
    text: Optional[str] = None
    finish: Optional[str] = None
    seconds: float = 0.0
    chunks: list[str] = field(default_factory=list)


async def run_call(c: openai.AsyncOpenAI, model: str, call: Call) -> None:
    t0 = time.perf_counter()
    kw: dict[str, Any] = dict(model=model, max_tokens=call.max_tokens, stream=call.stream, extra_body=call.extra,
                              stop=call.stop)
    if call.chat:
        content = call.prompt.removeprefix("[BOS] ").removesuffix(" [SEP]")
        out = await c.chat.completions.create(messages=[{"role": "user", "content": content}], **kw)
    else:
        out = await c.completions.create(prompt=call.prompt, **kw)
    if not call.stream:
        ch = out.choices[0]
        call.text, call.finish = (ch.message.content if call.chat else ch.text), ch.finish_reason
    else:
        async for chunk in out:
            if not chunk.choices:
                continue
            ch = chunk.choices[0]
            piece = (ch.delta.content if call.chat else ch.text) or ""
            call.chunks.append(piece)
            if ch.finish_reason:
                call.finish = ch.finish_reason
            if call.leave and piece:
                await out.close()  # the client disconnects mid-stream
                return
        call.text = "".join(call.chunks)
    call.seconds = time.perf_counter() - t0


async def run_all(url: str, model: str, calls: list[Call]) -> None:
    async with openai.AsyncOpenAI(base_url=f"{url}/v1", api_key="none", max_retries=0, timeout=300) as c:
        await asyncio.gather(*(run_call(c, model, call) for call in calls))


class Peak:
    """The most requests the backend had running at once (polled while the load runs)."""

    def __init__(self, engine) -> None:
        self.engine, self.value, self._stop = engine, 0, threading.Event()
        self.thread = threading.Thread(target=self._poll, daemon=True)

    def _poll(self) -> None:
        while not self._stop.is_set():
            self.value = max(self.value, self.engine.stats().running)
            time.sleep(0.005)

    def __enter__(self) -> "Peak":
        self.thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self.thread.join()


def settled(engine, timeout: float = 5.0):
    """The backend's stats once nothing runs or waits (a client that left has its row dropped at its
    next step, so this takes a step at most)."""
    deadline = time.monotonic() + timeout
    while (s := engine.stats()).running or s.queued:
        if time.monotonic() > deadline:
            break
        time.sleep(0.01)
    return s


@pytest.mark.parametrize("name", ["tiny-llada", "tiny-dream"])
def test_diffusion_under_load_equals_offline(name):
    import dllm
    from dllm.serve.backends.diffusion import DiffusionBackend

    model = dllm.load(name)
    engine = DiffusionBackend(model, name=name, max_running=32, max_tokens_limit=64, chat_template=CHAT_TEMPLATE)
    calls = []
    for i, (prompt, length) in enumerate(stress_prompts(18)):
        for j, setting in enumerate(DIFFUSION_SETTINGS):
            extra = dict(setting)
            if extra.get("block_length", 0) > length:
                extra["block_length"] = length
            k = 4 * i + j
            calls.append(Call(prompt, length + (k % 3) * 2, extra, stream=k % 2 == 0, chat=k % 5 == 0,
                              stop=["A B"] if k % 7 == 0 else None))
    calls += [Call(p, 48, {"sampler": "low_confidence"}, stream=True, leave=True) for p, _ in stress_prompts(4)]
    assert len(calls) >= 64 + 4
    with LiveServer(create_app(engine)) as server, Peak(engine) as peak:
        t0 = time.perf_counter()
        asyncio.run(run_all(server.url, name, calls))
        wall = time.perf_counter() - t0
        stats = settled(engine)
    assert stats.running == 0 and stats.queued == 0  # the clients that left took their rows with them
    mean_batch = stats.forwarded_rows / stats.forwards
    print(f"{len(calls)} requests in {wall:.1f} s; peak running {peak.value}; mean rows per forward {mean_batch:.2f}")
    assert peak.value >= 16 and mean_batch > 1.5, (peak.value, mean_batch)
    mismatched = []
    for call in calls:
        if call.leave:
            continue
        settings = {k: v for k, v in call.extra.items()}
        want, _ = offline_diffusion(model, call.prompt, call.max_tokens, stop=call.stop or (), **settings)
        if call.text != want:
            mismatched.append((call.prompt, call.extra, call.stream, call.chat, call.text, want))
    assert not mismatched, mismatched[:3]


def test_speculative_under_load_equals_offline():
    import dllm
    from dllm.serve.backends.speculative import SpeculativeBackend

    target, tok = dllm.load_target("tiny-ar")
    engine = SpeculativeBackend(target, tok, drafter=DFLASH, name="tiny-ar", max_running=8, max_tokens_limit=64,
                                chat_template=CHAT_TEMPLATE)
    prompts = stress_prompts(48) + stress_prompts(16, suite="long-answer")
    calls = [Call(p, min(n + 4 * (k % 3), 64), {}, stream=k % 2 == 0, chat=k % 5 == 0,
                  stop=["A B"] if k % 7 == 0 else None) for k, (p, n) in enumerate(prompts)]
    calls += [Call(p, 64, {}, stream=True, leave=True) for p, _ in stress_prompts(4, suite="long-answer")]
    with LiveServer(create_app(engine)) as server, Peak(engine) as peak:
        asyncio.run(run_all(server.url, "tiny-ar", calls))
        stats = settled(engine)
    assert stats.running == 0 and stats.queued == 0
    assert peak.value >= 4
    mismatched = [(c.prompt, c.text, want) for c in calls if not c.leave and c.text != (
        want := offline_speculative(target, tok, DFLASH, c.prompt, c.max_tokens, stop=c.stop or ()))]
    assert not mismatched, mismatched[:3]
