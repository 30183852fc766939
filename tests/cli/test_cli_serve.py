"""``dllm serve``: flags refused before a model loads (fast), and the real process (slow): serving on
a free port, SIGTERM drain (the request in flight finishes, new ones are refused, exit 0)."""

from __future__ import annotations

import json
import os
import re
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import httpx2 as httpx
import pytest

from dllm.cli.table import REGISTRY
from tests.serve.servers import CHAT_TEMPLATE

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize("argv,says", [
    (["--target", "tiny-ar"], "--target needs --drafter"),
    (["--model", "tiny-llada", "--drafter", "ngram"], "--drafter is for --target"),
    (["--target", "tiny-ar", "--drafter", "ngram", "--sampler", "threshold"], "--sampler is a diffusion setting"),
    (["--model", "tiny-llada", "--chat-template", "/no/such/file"], "no such file"),
    (["--model", "tiny-llada", "--port", "70000"], "--port must be in [0, 65535]"),
    (["--model", "tiny-llada", "--api-key", " "], "--api-key is empty"),
    (["--model", "tiny-llada", "--temperature", "-1"], "--temperature must be"),
    (["--model", "tiny-llada", "--sampler", "nope"], "--sampler: Unknown sampler 'nope'. Valid samplers:"),
    (["--model", "tiny-llada", "--sampler", "threshold", "-o", "treshold=0.5"], "--sampler: Unknown option(s)"),
    (["--model", "tiny-llada", "--cache", "dual:refresh=-1"], "--cache: "),
])
def test_bad_flags_are_refused_before_loading(argv, says, capsys):
    assert REGISTRY.main(["serve", *argv]) == 2
    assert says in capsys.readouterr().err


def test_a_taken_port_is_refused_before_loading(capsys):
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        t0 = time.monotonic()
        assert REGISTRY.main(["serve", "--model", "tiny-llada", "--port", str(port)]) == 2
        assert time.monotonic() - t0 < 5  # no model was loaded
    assert f"cannot listen on 127.0.0.1:{port}" in capsys.readouterr().err


def start_server(tmp_path: Path, *flags: str) -> tuple[subprocess.Popen, str, Path]:
    """``python -m dllm.cli serve ... --port 0``; waits for its "on http://..." line."""
    template = tmp_path / "chat.jinja"
    template.write_text(CHAT_TEMPLATE)
    log = tmp_path / "serve.log"
    env = {**os.environ, "PYTHONPATH": str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", "")}
    proc = subprocess.Popen([sys.executable, "-m", "dllm.cli", "serve", *flags, "--port", "0", "--threads", "1",
                             "--chat-template", str(template), "--log-level", "warning"],
                            stdout=subprocess.DEVNULL, stderr=log.open("w"), env=env, cwd=tmp_path)
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        found = re.search(r"on (http://127\.0\.0\.1:\d+)", log.read_text())
        if found:
            return proc, found.group(1), log
        if proc.poll() is not None:
            raise AssertionError(f"dllm serve exited {proc.returncode}: {log.read_text()}")
        time.sleep(0.2)
    proc.kill()
    raise AssertionError(f"dllm serve did not start: {log.read_text()}")


@pytest.mark.slow
def test_sigterm_lets_the_request_in_flight_finish_then_exits(tmp_path):
    import dllm
    from tests.serve.servers import offline_diffusion

    proc, url, log = start_server(tmp_path, "--model", "tiny-llada", "--sampler", "low_confidence")
    try:
        prompt = "[BOS] copy A B C D E F G H I J K L M N O P [SEP]"
        body = {"model": "tiny-llada", "prompt": prompt, "max_tokens": 48, "stream": True, "dllm_events": True}
        with httpx.stream("POST", url + "/v1/completions", json=body, timeout=120) as r:
            assert r.status_code == 200, r.read()
            lines = r.iter_lines()
            assert next(x for x in lines if x.startswith("event: dllm.step"))
            proc.send_signal(signal.SIGTERM)
            rest = [x for x in lines if x]
        text = "".join(json.loads(x[6:])["choices"][0]["text"] for x in rest
                       if x.startswith("data: {") and '"choices"' in x)
        assert rest[-1] == "data: [DONE]"
        assert any(x.startswith("event: dllm.step") for x in rest)  # it kept decoding after the signal
        assert text == offline_diffusion(dllm.load("tiny-llada"), prompt, 48)[0]
        # new requests are refused (503 while draining, or no listener at all)
        try:
            refused = httpx.post(url + "/v1/completions", json={"model": "tiny-llada", "prompt": prompt}, timeout=10)
            assert refused.status_code == 503
        except httpx.TransportError:
            pass
        assert proc.wait(timeout=60) == 0, log.read_text()
        assert "stopped" in log.read_text()
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def test_the_flags_build_the_engine(tmp_path):
    import argparse

    from dllm.cli.serve import build_backend, serve_args

    p = argparse.ArgumentParser()
    serve_args(p)
    args = p.parse_args(["--model", "tiny-llada", "--sampler", "threshold", "-o", "threshold=0.7", "--cache", "dual",
                         "--block-length", "4", "--max-running", "3", "--max-queue", "5", "--max-batch-rows", "6",
                         "--max-tokens-limit", "32", "--served-model-name", "tl"])
    engine = build_backend(args, chat_template=None)
    try:
        assert (engine.model_name, engine.mode, engine.max_tokens_limit) == ("tl", "continuous", 32)
        assert engine.defaults.sampler == "threshold" and engine.defaults.options == (("threshold", 0.7),)
        assert (engine.defaults.cache, engine.defaults.block_length) == ("dual", 4)
        s = engine.stats()
        assert (s.max_running, s.max_queue) == (3, 5) and engine.batcher.max_rows == 6
        cost = engine.batcher.call_cost_tokens  # the default: measured for the model when the loop started
        assert engine.join and isinstance(cost, int) and not isinstance(cost, bool) and cost >= 0
    finally:
        engine.close()
    args = p.parse_args(["--model", "tiny-llada", "--no-join", "--call-cost-tokens", "4096"])
    engine = build_backend(args, chat_template=None)
    try:
        assert not engine.join and engine.batcher.call_cost_tokens == 4096
    finally:
        engine.close()


def test_replicas_flag_hands_the_flags_engine_to_ray_serve(monkeypatch):
    """--replicas N: Ray Serve gets N copies of exactly the backend the flags build (a picklable
    partial of build_backend), the server options, and Serve's proxy on --host:--port."""
    import argparse
    import functools
    import pickle

    from dllm.cli import serve as cli
    from dllm.serve import ray_app

    calls = {}
    monkeypatch.setattr(ray_app, "application", lambda make, **kw: calls.setdefault("app", (make, kw)) and "APP")
    monkeypatch.setattr(ray_app, "run", lambda app, **kw: calls.setdefault("run", (app, kw)))
    p = argparse.ArgumentParser()
    cli.serve_args(p)
    args = p.parse_args(["--model", "tiny-llada", "--sampler", "fast", "--replicas", "3", "--port", "8199",
                         "--api-key", "k", "--threads", "1", "--ray-address", "auto"])
    assert cli.run_serve(args) == 0
    make, kw = calls["app"]
    assert isinstance(make, functools.partial) and make.func is cli.build_backend and make.args == (args, None)
    pickle.dumps(make)  # Ray ships it to the replicas
    assert kw["replicas"] == 3 and kw["api_key"] == "k" and kw["threads"] == 1
    assert calls["run"] == ("APP", {"host": "127.0.0.1", "port": 8199, "address": "auto"})
    for bad in (["--replicas", "2", "--port", "0"], ["--ray-address", "auto"]):
        with pytest.raises(ValueError):
            cli.check_args(p.parse_args(["--model", "tiny-llada", *bad]))
