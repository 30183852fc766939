"""The servers of ``dllm bench serve`` (dllm/eval/bench/serving/servers.py): one process per mode, started
together; a server that exits at start is an error naming its command, and every other server is stopped."""

from __future__ import annotations

import argparse
import os
import sys
import time

import pytest

from dllm.eval.bench.serving import servers


def _wait_for(path, seconds: float = 20.0) -> str:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if path.exists() and path.read_text():
            return path.read_text()
        time.sleep(0.05)
    raise AssertionError(f"{path} was not written")


def _gone(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    with open(f"/proc/{pid}/stat") as f:  # a zombie has exited; its parent has not reaped it yet
        return f.read().split(") ")[1].startswith("Z")


def test_a_server_that_exits_at_start_names_its_command_and_the_others_stop(tmp_path, monkeypatch):
    pid_file = tmp_path / "pid"
    waiting = f"import os, time; open({str(pid_file)!r}, 'w').write(str(os.getpid())); time.sleep(120)"
    commands = {"continuous": [sys.executable, "-c", waiting], "static": [sys.executable, "-c", "raise SystemExit(3)"]}
    monkeypatch.setattr(servers, "serve_command", lambda args, mode, port, max_queue: commands[mode])
    args = argparse.Namespace(server="process", startup_timeout=30.0)
    with pytest.raises(RuntimeError, match=r"the static server exited with status 3: .*SystemExit\(3\)"):
        with servers.mode_servers(None, "m", ["continuous", "static"], max_queue=8, args=args):
            raise AssertionError("no server answered /health, so none is up")
    pid = int(_wait_for(pid_file))
    assert _gone(pid)  # stopped by the bench, not left running


def test_a_server_that_never_answers_is_a_timeout_naming_its_command(monkeypatch):
    monkeypatch.setattr(servers, "serve_command",
                        lambda args, mode, port, max_queue: [sys.executable, "-c", "import time; time.sleep(120)"])
    args = argparse.Namespace(server="process", startup_timeout=0.5)
    started = time.monotonic()
    with pytest.raises(RuntimeError, match=r"the serial server did not answer within 0 s: .*time.sleep\(120\)"):
        with servers.mode_servers(None, "m", ["serial"], max_queue=8, args=args):
            pass
    assert time.monotonic() - started < 30


def test_free_ports_are_distinct(monkeypatch):
    handed = iter([5001, 5001, 5002, 5001, 5003])
    monkeypatch.setattr(servers, "free_port", lambda: next(handed))
    assert servers._free_ports(3) == [5001, 5002, 5003]
