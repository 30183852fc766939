"""``dllm ... --help`` into a closed pipe: exit status 141 and nothing on stderr, like every other command's
output (``dllm/cli/registry.py``: ``flushed``), with stdout buffered (a plain ``python``) and unbuffered
(``python -u``, where argparse ignores the failed write and would exit 0)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

import dllm
from dllm.cli.registry import BROKEN_PIPE, asks_help

REPO = Path(dllm.__file__).parent.parent


def _env(unbuffered: bool) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k != "PYTHONUNBUFFERED"}
    env["PYTHONPATH"] = str(REPO)
    return {**env, "PYTHONUNBUFFERED": "1"} if unbuffered else env


def _into_closed_pipe(args: list[str], unbuffered: bool) -> subprocess.CompletedProcess:
    """``dllm <args>`` with stdout a pipe whose read end is closed before the child starts (deterministic:
    the first write fails, whatever the output's size)."""
    read, write = os.pipe()
    os.close(read)
    try:
        return subprocess.run([sys.executable, "-m", "dllm.cli", *args], stdout=write, stderr=subprocess.PIPE,
                              text=True, env=_env(unbuffered), timeout=120)
    finally:
        os.close(write)


@pytest.mark.parametrize("unbuffered", [False, True], ids=["buffered", "unbuffered"])
@pytest.mark.parametrize("args", [["generate", "--help"], ["--help"], ["bench", "--help"]],
                         ids=["command", "dllm", "group"])
def test_help_into_a_closed_pipe_exits_141_silently(args, unbuffered):
    proc = _into_closed_pipe(args, unbuffered)
    assert (proc.returncode, proc.stderr) == (BROKEN_PIPE, "")


def test_help_of_a_command_with_its_own_parser_into_a_closed_pipe_exits_141():
    """``dllm bench spec`` owns its argparse (a target without ``build``): its --help is held the same way."""
    proc = _into_closed_pipe(["bench", "spec", "--help"], unbuffered=True)
    assert (proc.returncode, proc.stderr) == (BROKEN_PIPE, "")


def test_a_short_output_into_a_closed_pipe_exits_141_with_stdout_buffered():
    """``dllm tasks`` fits in stdout's buffer: the flush at the end fails, inside the guard (not 120 and
    'Exception ignored ... BrokenPipeError' from the interpreter's last flush)."""
    proc = _into_closed_pipe(["tasks"], unbuffered=False)
    assert (proc.returncode, proc.stderr) == (BROKEN_PIPE, "")


@pytest.mark.parametrize("unbuffered", [False, True], ids=["buffered", "unbuffered"])
def test_help_into_an_open_pipe_is_whole_and_exits_0(unbuffered):
    proc = subprocess.run([sys.executable, "-m", "dllm.cli", "generate", "--help"], capture_output=True, text=True,
                          env=_env(unbuffered), timeout=120)
    assert (proc.returncode, proc.stderr) == (0, "")
    assert proc.stdout.startswith("usage: dllm generate") and "--threads" in proc.stdout


def test_asks_help_stops_at_double_dash():
    assert asks_help(["generate", "--model", "m", "-h"]) and asks_help(["--help"])
    assert not asks_help(["generate", "--", "--help"]) and not asks_help(["tasks"])


@pytest.mark.parametrize("args", [["tasks"], ["tasks", "--help"], ["--help"]], ids=["output", "help", "dllm-help"])
def test_no_stdout_at_all_runs_as_before(args):
    """Started with descriptor 1 closed (``dllm tasks >&-``): ``sys.stdout`` is None, print() writes nothing, and
    the command exits 0 as it did before stdout was flushed inside the guard (no AttributeError on None)."""
    proc = subprocess.run(["sh", "-c", 'exec "$@" >&-', "sh", sys.executable, "-m", "dllm.cli", *args],
                          stderr=subprocess.PIPE, text=True, env=_env(False), timeout=120)
    assert proc.returncode == 0 and "Traceback" not in proc.stderr, proc.stderr
