"""Helpers of the serving tests: a live uvicorn server on 127.0.0.1 in a thread, and a small fake engine
(for the HTTP layer's error mapping and streaming shapes without a model)."""

from __future__ import annotations

import socket
import threading
import time
from dataclasses import dataclass
from typing import Optional, Sequence, Union

import uvicorn

from dllm.serve.backends.base import Backend, BackendStats, BadRequest
from dllm.serve.backends.jobs import (BackendClosed, Delta, Done, Failed, Job, JobRequest, QueueFull,
                                      SpeculativeSettings, Step)
from dllm.settings import DecodeSettings


class LiveServer:
    """``app`` served by uvicorn on 127.0.0.1 (a free port) in a daemon thread; a context manager."""

    def __init__(self, app, timeout_graceful_shutdown: Optional[int] = None) -> None:
        self.sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self.sock.bind(("127.0.0.1", 0))
        self.port = self.sock.getsockname()[1]
        self.url = f"http://127.0.0.1:{self.port}"
        config = uvicorn.Config(app, log_level="warning", lifespan="on", access_log=False,
                                timeout_graceful_shutdown=timeout_graceful_shutdown)
        self.server = uvicorn.Server(config)
        self.thread = threading.Thread(target=self.server.run, kwargs={"sockets": [self.sock]}, daemon=True)

    def __enter__(self) -> "LiveServer":
        self.thread.start()
        deadline = time.monotonic() + 30
        while not self.server.started:
            if not self.thread.is_alive() or time.monotonic() > deadline:
                raise RuntimeError("uvicorn did not start")
            time.sleep(0.01)
        return self

    def stop(self, timeout: float = 60) -> None:
        self.server.should_exit = True
        self.thread.join(timeout)

    def __exit__(self, *exc) -> None:
        self.stop()


WORDS = ("A", "B", "C", "D", "E", "F", "G", "H")


@dataclass
class FakeBackend(Backend):
    """Answers a prompt of ids with ``max_tokens`` words, one Delta (and Step) per token, ``delay_s``
    apart; words are WORDS[id % 8] of the prompt's ids in turn, so a test knows the answer. Jobs run in
    threads. ``hold``: jobs wait for it before they start (a full queue, a drain)."""

    kind: str = "diffusion"
    model_name: str = "fake"
    max_positions: Optional[int] = 64
    max_tokens_limit: int = 32
    max_queue: int = 4
    delay_s: float = 0.0
    fail_with: Optional[str] = None  # every job ends with Failed(fail_with, 500)

    def __post_init__(self) -> None:
        self.tokenizer = None
        self.defaults = DecodeSettings() if self.kind == "diffusion" else SpeculativeSettings()
        self.hold = threading.Event()
        self.hold.set()
        self.jobs: list[Job] = []
        self.closed = False
        self.checked: list[JobRequest] = []
        self._lock = threading.Lock()

    def resolve_settings(self, *, max_tokens: int, **given):
        fields = {k: v for k, v in given.items() if v is not None}
        if self.kind == "diffusion":
            fields["options"] = tuple(sorted((fields.pop("options", None) or {}).items()))
            return DecodeSettings(**fields)
        return SpeculativeSettings(**fields)

    def encode_prompt(self, prompt: Union[str, Sequence[int]]) -> tuple[int, ...]:
        if isinstance(prompt, str):
            try:
                return tuple(int(w) for w in prompt.split())
            except ValueError:
                raise BadRequest("prompt", f"the fake engine takes ids as text, got {prompt!r}") from None
        return tuple(prompt)

    def encode_chat(self, messages) -> tuple[int, ...]:
        return tuple(i for m in messages for i in self.encode_prompt(m["content"]))

    @staticmethod
    def answer(prompt_ids: Sequence[int], n: int) -> str:
        return " ".join(WORDS[prompt_ids[i % len(prompt_ids)] % len(WORDS)] for i in range(n))

    def check(self, request: JobRequest) -> None:
        self.checked.append(request)
        if not 1 <= request.max_tokens <= self.max_tokens_limit:
            raise BadRequest("max_tokens", f"max_tokens must be in [1, {self.max_tokens_limit}], "
                                           f"got {request.max_tokens}")
        s = request.settings
        if isinstance(s, DecodeSettings) and s.sampler not in ("low_confidence", "threshold"):
            raise BadRequest("sampler", f"Unknown sampler {s.sampler!r}")
        if len(request.prompt_ids) + request.max_tokens > self.max_positions:
            raise BadRequest("prompt", "too long")

    def submit(self, request: JobRequest) -> Job:
        self.check(request)
        with self._lock:
            if self.closed:
                raise BackendClosed("closed")
            waiting = sum(1 for j in self.jobs if not j.finished)
            if waiting >= self.max_queue:
                raise QueueFull(f"{waiting} waiting", retry_after=2.5)
            job = Job(request)
            self.jobs.append(job)
        threading.Thread(target=self._run, args=(job,), daemon=True).start()
        return job

    def _run(self, job: Job) -> None:
        self.hold.wait()
        req = job.request
        if self.fail_with:
            job.emit(Failed(self.fail_with, 500))
            return
        words = self.answer(req.prompt_ids, req.max_tokens).split()
        text, trace = "", [-1] * len(words)
        for i, w in enumerate(words):
            time.sleep(self.delay_s)
            if job.cancelled:
                job.emit(Failed("cancelled by the client", 499))
                return
            piece = w if i == 0 else " " + w
            stop_at = next((text.find(s) for s in req.stop if s in text + piece), None)
            if stop_at is not None:
                break
            trace[i] = i
            if req.step_events:
                job.emit(Step(step=i, block=0, nfe=i + 1, tokens=tuple(words[:i + 1]) + (None,) * (len(words) - i - 1),
                              trace=tuple(trace), committed=(i,)))
            text += piece
            job.emit(Delta(piece, (req.prompt_ids[i % len(req.prompt_ids)],)))
        done_reason = "length" if len(text.split()) == len(words) else "stop"
        job.emit(Done(text=text, token_ids=(), finish_reason=done_reason, prompt_tokens=len(req.prompt_ids),
                      completion_tokens=len(text.split()), nfe=len(text.split()), forwarded_tokens=3,
                      ttft_s=0.01, wall_s=0.02, acceptance=2.0 if self.kind == "speculative" else None))

    def stats(self) -> BackendStats:
        running = sum(1 for j in self.jobs if not j.finished)
        return BackendStats(queued=0, running=running, max_running=8, max_queue=self.max_queue, forwards=len(self.jobs),
                            forwarded_rows=len(self.jobs), closed=self.closed)

    def close(self, drain: bool = True, timeout: Optional[float] = None) -> None:
        with self._lock:
            self.closed = True
        if not drain:
            for j in self.jobs:
                j.cancel()
        for j in list(self.jobs):
            while not j.finished:
                time.sleep(0.01)


# ---- offline references: what a greedy served request must equal ----

CHAT_TEMPLATE = "[BOS] {% for m in messages %}{{ m['content'] }}{% endfor %} [SEP]"  # the tiny models' prompt shape


def cut_at_stops(text: str, stops: Sequence[str]) -> str:
    found = [i for i in (text.find(s) for s in stops) if i >= 0]
    return text[:min(found)] if found else text


def offline_diffusion(model, prompt, max_tokens: int, stop: Sequence[str] = (), **settings) -> tuple[str, int]:
    """``dllm.generate`` on ``prompt`` alone: (text cut at EOS and the first stop, tokens before EOS)."""
    import dllm

    out = dllm.generate(model, prompt, gen_length=max_tokens, stop_at_eos=True, **settings)
    ids = out.sequences[0, out.prompt_length:].tolist()
    eos = set(model.eos_ids)
    n = next((i for i, t in enumerate(ids) if t in eos), len(ids))
    return cut_at_stops(out.texts[0], stop), n


def offline_speculative(target, tokenizer, drafter: str, prompt, max_tokens: int, stop: Sequence[str] = (),
                        **settings) -> str:
    """``dllm.speculative_generate`` on ``prompt`` alone: its text cut at the first stop string."""
    import dllm

    out = dllm.speculative_generate(target, dllm.make_drafter(drafter), [prompt], max_new_tokens=max_tokens,
                                    tokenizer=tokenizer, stop=list(stop) or None, **settings)
    return cut_at_stops(out.texts[0], stop)
