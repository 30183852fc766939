"""Shutdown with a drain timeout: ``Scheduler.close`` ends every job still queued or running at the
deadline with a 503 (fast, a model-free engine on the real scheduler); the app turns that 503 into an
OpenAI error body with Retry-After, or a last error event then ``[DONE]`` when streamed, while its
listener answers new requests with 503 (fast, in-process uvicorn); and the real ``dllm serve`` process
under SIGTERM or Ctrl-C with ``--drain-timeout 1`` and 20 requests in flight (slow)."""

from __future__ import annotations

import json
import signal
import threading
import time
from typing import Any, Optional, Sequence, Union

import httpx2 as httpx
import pytest

from dllm.serve.backends.base import BadRequest
from dllm.serve.backends.jobs import Delta, Done, Failed, Job, JobRequest
from dllm.settings import DecodeSettings
from dllm.serve.backends.scheduling.policy import Continuous
from dllm.serve.backends.scheduling.scheduler import Scheduler, SchedulerConfig
from dllm.serve.http.app import begin_drain, create_app, end_drain
from tests.serve.servers import FakeBackend, LiveServer

ERROR_KEYS = {"message", "type", "param", "code"}


class SlowEngine(Scheduler):
    """The real scheduler (queue, loop, ``close``) over a model-free decode: ``FakeBackend.answer``'s
    words, one per ``delay_s`` and turn (running jobs alternate), a cancelled job leaving at its next
    word."""

    kind = "diffusion"
    model_name = "slow"
    max_positions = 4096
    max_tokens_limit = 4000

    def __init__(self, delay_s: float = 0.02, max_running: int = 4) -> None:
        super().__init__(SchedulerConfig(max_running=max_running, max_queue=64), Continuous(max_group=1))
        self.tokenizer, self.defaults, self.delay_s = None, DecodeSettings(), delay_s
        self.start()

    def resolve_settings(self, *, max_tokens: int, **given: Any) -> DecodeSettings:
        return DecodeSettings()

    def encode_prompt(self, prompt: Union[str, Sequence[int]]) -> tuple[int, ...]:
        try:
            return tuple(int(w) for w in prompt.split()) if isinstance(prompt, str) else tuple(prompt)
        except ValueError:
            raise BadRequest("prompt", "the slow engine takes ids as text") from None

    def encode_chat(self, messages: Sequence[dict]) -> tuple[int, ...]:
        return self.encode_prompt(" ".join(m["content"] for m in messages))

    def check(self, request: JobRequest) -> None:
        self.check_length(request, "model")

    def _run_jobs(self, jobs: list[Job]) -> None:
        (job,) = jobs
        words = FakeBackend.answer(job.request.prompt_ids, job.request.max_tokens).split()
        for i, word in enumerate(words):
            time.sleep(self.delay_s)
            self.yield_turn()
            if job.cancelled:
                job.emit(Failed("cancelled by the client", 499))
                return
            job.emit(Delta(word if i == 0 else " " + word, (i,)))
        job.emit(Done(text=" ".join(words), token_ids=tuple(range(len(words))), finish_reason="length",
                      prompt_tokens=len(job.request.prompt_ids), completion_tokens=len(words), nfe=len(words)))


def request(max_tokens: int) -> JobRequest:
    return JobRequest(prompt_ids=(1, 2), max_tokens=max_tokens, settings=DecodeSettings())


def final(job: Job, timeout: float = 10) -> Union[Done, Failed]:
    return job.result(timeout=timeout)


# ---- the backend ----

def test_the_drain_timeout_ends_queued_and_running_jobs_with_503():
    engine = SlowEngine(delay_s=0.02, max_running=3)
    short = engine.submit(request(3))  # finishes within the drain
    running = [engine.submit(request(2000)) for _ in range(3)]  # 40 s each; the third starts after the short one
    queued = engine.submit(request(2000))  # waits for a free row all along
    time.sleep(0.2)
    t0 = time.monotonic()
    engine.close(drain=True, timeout=0.5)
    took = time.monotonic() - t0
    assert 0.4 < took < 5, took  # the deadline, then one word for the cancelled rows to leave
    done = final(short)
    assert isinstance(done, Done) and done.text == "B C B"
    for job in running:
        events = list(job.events(timeout=1))
        assert isinstance(events[-1], Failed) and events[-1].status == 503
        assert "finished: the drain timeout of 0.5 s passed" in events[-1].message
        assert all(isinstance(e, Delta) for e in events[:-1])  # nothing after the final event
    end = final(queued)
    assert end.status == 503 and "before this request started" in end.message
    s = engine.stats()
    assert (s.running, s.queued, s.closed) == (0, 0, True)  # the cancelled rows left their decodes
    assert not engine._thread.is_alive()  # the loop stopped


def test_close_without_drain_ends_running_jobs_with_503_not_499():
    engine = SlowEngine()
    job = engine.submit(request(2000))
    next(job.events(timeout=5))  # it is decoding
    engine.close(drain=False)
    end = final(job)
    assert isinstance(end, Failed) and end.status == 503 and "without waiting" in end.message


def test_a_second_close_ends_a_drain_that_waits_without_a_timeout():
    engine = SlowEngine()
    jobs = [engine.submit(request(2000)) for _ in range(3)]
    next(jobs[0].events(timeout=5))
    draining = threading.Thread(target=engine.close, args=(True, None))
    draining.start()
    time.sleep(0.2)
    assert draining.is_alive()  # it waits as long as the jobs need
    engine.close(drain=False)  # a second SIGTERM
    draining.join(timeout=5)
    assert not draining.is_alive()
    assert [final(j).status for j in jobs] == [503, 503, 503]


def test_a_job_that_finishes_as_the_drain_ends_keeps_its_one_final_event():
    engine = SlowEngine(delay_s=0.0)
    jobs = [engine.submit(request(50)) for _ in range(20)]
    engine.close(drain=True, timeout=0.0)  # races the workers' Done
    for job in jobs:
        events = list(job.events(timeout=5))
        assert sum(isinstance(e, (Done, Failed)) for e in events) == 1 and isinstance(events[-1], (Done, Failed))
        assert job._queue.empty()  # nothing was queued after the final event


# ---- the app ----

def sse_data(lines: list[str]) -> list[str]:
    return [x[6:] for x in lines if x.startswith("data: ")]


def stream_lines(url: str, body: dict, out: dict) -> None:
    with httpx.stream("POST", url + "/v1/completions", json=body, timeout=30) as r:
        out["status"] = r.status_code
        out["lines"] = list(r.iter_lines())


def plain(url: str, body: dict, out: dict) -> None:
    r = httpx.post(url + "/v1/completions", json=body, timeout=30)
    out["status"], out["headers"], out["body"] = r.status_code, r.headers, r.json()


def check_error_event(lines: list[str]) -> dict:
    """A stream that ended with an OpenAI error event, then [DONE]: the error."""
    data = sse_data(lines)
    assert data[-1] == "[DONE]" and "error" in json.loads(data[-2]), data[-3:]
    err = json.loads(data[-2])["error"]
    assert set(err) == ERROR_KEYS and all("error" not in json.loads(d) for d in data[:-2])
    return err


def check_503(out: dict) -> dict:
    assert out["status"] == 503 and out["headers"]["retry-after"] == "5", out
    err = out["body"]["error"]
    assert set(err) == ERROR_KEYS and err["type"] == "server_error" and err["code"] == "shutting_down"
    return err


def start_two(url: str, max_tokens: int) -> tuple[dict, dict, list[threading.Thread]]:
    streamed, waited = {}, {}
    body = {"model": "slow", "prompt": "1 2", "max_tokens": max_tokens}
    threads = [threading.Thread(target=stream_lines, args=(url, {**body, "stream": True}, streamed)),
               threading.Thread(target=plain, args=(url, body, waited))]
    for t in threads:
        t.start()
    return streamed, waited, threads


def wait_running(engine: Scheduler, n: int) -> None:
    deadline = time.monotonic() + 10
    while engine.stats().running < n:
        assert time.monotonic() < deadline, engine.stats()
        time.sleep(0.01)


def test_requests_running_at_the_drain_timeout_get_503_and_new_ones_503_meanwhile():
    engine = SlowEngine(delay_s=0.02)
    app = create_app(engine, drain_timeout=0.6)
    with LiveServer(app) as server:
        streamed, waited, threads = start_two(server.url, 2000)
        wait_running(engine, 2)
        drain = begin_drain(app)  # what SIGTERM does under `dllm serve`
        assert begin_drain(app) is drain  # once
        refused = {}
        plain(server.url, {"model": "slow", "prompt": "1", "max_tokens": 1}, refused)  # the listener still answers
        assert "shutting down and takes no new requests" in check_503(refused)["message"]
        assert httpx.get(server.url + "/health").status_code == 503
        drain.result(timeout=10)
        for t in threads:
            t.join(timeout=10)
        err = check_503(waited)
        assert "drain timeout of 0.6 s" in err["message"]
        assert streamed["status"] == 200
        err = check_error_event(streamed["lines"])
        assert err["code"] == "shutting_down" and "drain timeout" in err["message"]
        assert "".join(json.loads(d)["choices"][0]["text"] for d in sse_data(streamed["lines"])[:-2]).startswith("B C")


def test_end_drain_ends_the_requests_in_flight_at_once():
    engine = SlowEngine(delay_s=0.02)
    app = create_app(engine)  # no drain timeout: the drain would wait 40 s
    with LiveServer(app) as server:
        streamed, waited, threads = start_two(server.url, 2000)
        wait_running(engine, 2)
        drain = begin_drain(app)
        time.sleep(0.1)
        assert not drain.done()
        t0 = time.monotonic()
        end_drain(app)  # a second SIGTERM
        drain.result(timeout=10)
        for t in threads:
            t.join(timeout=10)
        assert time.monotonic() - t0 < 5
        assert "without waiting" in check_503(waited)["message"]
        assert check_error_event(streamed["lines"])["code"] == "shutting_down"


def test_requests_that_finish_within_the_drain_get_their_whole_reply():
    engine = SlowEngine(delay_s=0.01)
    app = create_app(engine, drain_timeout=10)
    with LiveServer(app) as server:
        streamed, waited, threads = start_two(server.url, 30)
        wait_running(engine, 2)
        begin_drain(app).result(timeout=10)
        for t in threads:
            t.join(timeout=10)
    answer = FakeBackend.answer((1, 2), 30)
    assert waited["status"] == 200 and waited["body"]["choices"][0]["text"] == answer
    data = sse_data(streamed["lines"])
    assert data[-1] == "[DONE]" and "".join(json.loads(d)["choices"][0]["text"] for d in data[:-1]) == answer


# ---- the real process (slow) ----

PROMPT = "[BOS] copy A B C D E F G H I J K L M N O P [SEP]"
LONG, SHORT = 400, 3  # LONG: many seconds of decoding for 20 rows on a CPU; SHORT: a few steps (some finish)


def serve_one(url: str, i: int, results: list, streaming: threading.Semaphore) -> None:
    """Request i: streamed when i is even (``streaming`` released once its reply began, or it failed), LONG
    max_tokens when i % 4 < 2; its outcome in results[i]."""
    body = {"model": "tiny-llada", "prompt": PROMPT, "max_tokens": LONG if i % 4 < 2 else SHORT,
            "stream": i % 2 == 0}
    began = False
    try:
        if body["stream"]:
            with httpx.stream("POST", url + "/v1/completions", json=body, timeout=120) as r:
                began = True
                streaming.release()
                results[i] = (body, r.status_code, dict(r.headers), list(r.iter_lines()))
        else:
            r = httpx.post(url + "/v1/completions", json=body, timeout=120)
            results[i] = (body, r.status_code, dict(r.headers), r.text)
    except Exception as err:  # noqa: BLE001 - reported by the test
        results[i] = (body, None, {}, f"{type(err).__name__}: {err}")
        if body["stream"] and not began:
            streaming.release()  # the test reports this error at once instead of waiting for the stream


def outcome(body: dict, status: Optional[int], headers: dict, got: Any) -> tuple[str, str]:
    """("text", the full text), ("error", its message) or ("refused", its message: a 503 body, the
    request came after the signal); fails on anything else: a 500, a cut body, a stream without [DONE]."""
    assert status in (200, 503), (body, status, got)
    if status == 503 and body["stream"]:
        got = "".join(got)
    if status == 503:
        reply = json.loads(got)
        assert headers["retry-after"] == "5" and set(reply["error"]) == ERROR_KEYS, reply
        assert reply["error"]["code"] == "shutting_down"
        return "error" if "drain timeout" in reply["error"]["message"] else "refused", reply["error"]["message"]
    if not body["stream"]:
        return "text", json.loads(got)["choices"][0]["text"]
    data = sse_data(got)
    assert data[-1] == "[DONE]", data[-3:]
    if "error" in json.loads(data[-2]):
        err = check_error_event(got)
        assert err["code"] == "shutting_down", err
        return "error", err["message"]
    return "text", "".join(json.loads(d)["choices"][0]["text"] for d in data[:-1] if json.loads(d)["choices"])


@pytest.mark.slow
@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT], ids=["SIGTERM", "Ctrl-C"])
def test_a_signal_with_a_drain_timeout_ends_every_request_cleanly(tmp_path, sig):
    """10 streamed and 10 plain requests in flight, SIGTERM (or Ctrl-C) with --drain-timeout 1: each
    client gets its whole offline text or an OpenAI-shaped 503 (an error body, or an error event then
    [DONE]); a new request during the drain gets 503; the process exits 0 with no traceback."""
    import dllm
    from tests.serve.servers import offline_diffusion
    from tests.cli.test_cli_serve import start_server

    proc, url, log = start_server(tmp_path, "--model", "tiny-llada", "--drain-timeout", "1")
    try:
        results: list = [None] * 20
        streaming = threading.Semaphore(0)
        threads = [threading.Thread(target=serve_one, args=(url, i, results, streaming), daemon=True)
                   for i in range(20)]
        for t in threads:
            t.start()
        for _ in range(10):  # every streamed reply began (or failed: reported here)
            assert streaming.acquire(timeout=60), (results, log.read_text()[-3000:])
        failed = [r for r in results if r is not None and r[1] is None]  # a request that raised
        assert not failed, (failed, log.read_text()[-3000:])
        deadline = time.monotonic() + 60
        while True:  # the LONG ones are decoding
            health = httpx.get(url + "/health", timeout=10).json()
            if health["running"] + health["queued"] >= 10:
                break
            assert time.monotonic() < deadline, health
            time.sleep(0.05)
        time.sleep(0.3)  # the plain ones, sent with the streamed ones, are queued too
        proc.send_signal(sig)
        time.sleep(0.3)
        refused = httpx.post(url + "/v1/completions", json={"model": "tiny-llada", "prompt": PROMPT}, timeout=10)
        assert refused.status_code == 503 and refused.headers["retry-after"] == "5", refused.text
        assert refused.json()["error"]["code"] == "shutting_down"
        for t in threads:
            t.join(timeout=60)
        assert proc.wait(timeout=60) == 0, log.read_text()
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    stderr = log.read_text()
    assert "Traceback" not in stderr and "Cancel" not in stderr and "dllm serve: stopped" in stderr, stderr
    outcomes = [outcome(*r) for r in results]
    model = dllm.load("tiny-llada")
    offline = {n: offline_diffusion(model, PROMPT, n)[0] for n in {r[0]["max_tokens"] for r, (kind, _) in
                                                                 zip(results, outcomes) if kind == "text"}}
    for r, (kind, got) in zip(results, outcomes):
        if kind == "text":
            assert got == offline[r[0]["max_tokens"]], (r[0], got)
        elif kind == "error":
            assert "the server shut down before this request" in got and "drain timeout of 1 s" in got, got
    # the LONG ones were still decoding at the deadline: streamed and plain ones ended with the 503
    assert {kind for r, (kind, _) in zip(results, outcomes) if r[0]["stream"]} >= {"error"}, outcomes
    assert {kind for r, (kind, _) in zip(results, outcomes) if not r[0]["stream"]} >= {"error"}, outcomes
