"""The servers of ``dllm bench serve``: one model, one serving mode, on 127.0.0.1, in a thread or a process.

``mode_servers`` yields the URL of one per mode: ``--server process`` (the default) runs ``dllm serve --model M
--mode MODE --port P`` (the real command line, in its own process, so that the load generator does
not share an interpreter lock with the server, as in vLLM's serving benchmark) and stops it with
SIGTERM; ``--server thread`` serves the app (``dllm.serve.http.app.create_app`` on a ``DiffusionBackend``)
from a thread of the bench's process, on the model the bench loaded. ``forward_counts`` reads the
model forwards and the rows over them from the server's /metrics (their ratio is the mean batch).
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import time
from contextlib import ExitStack, contextmanager
from typing import Iterator, Optional, Sequence

from dllm.eval.bench.serving.loopback import LOOPBACK, answers, serve_in_thread
from dllm.models.parallel.group import free_port


def build_backend(model, name: str, mode: str, max_running: int, max_queue: int,
                  max_batch_tokens: Optional[int] = None):
    """A ``DiffusionBackend`` in ``mode`` with the server's default settings."""
    from dllm.serve.backends.scheduling.batcher import BatcherConfig
    from dllm.serve.backends.diffusion import DiffusionBackend
    from dllm.settings import DecodeSettings

    batcher = BatcherConfig() if max_batch_tokens is None else BatcherConfig(max_tokens=max_batch_tokens)
    return DiffusionBackend(model, name=name, defaults=DecodeSettings(), mode=mode, max_running=max_running,
                            max_queue=max_queue, batcher=batcher)


def serve_command(args: argparse.Namespace, mode: str, port: int, max_queue: int) -> list[str]:
    """``dllm serve`` for one mode of the bench (``python -m dllm.cli serve ...``)."""
    cmd = [sys.executable, "-m", "dllm.cli", "serve", "--model", args.model, "--mode", mode, "--host", LOOPBACK,
           "--port", str(port), "--max-running", str(args.max_running), "--max-queue", str(max_queue),
           "--log-level", "warning"]
    cmd += ["--threads", str(args.threads)] if args.threads else []
    if mode == "continuous" and getattr(args, "max_batch_tokens", None):
        cmd += ["--max-batch-tokens", str(args.max_batch_tokens)]
    cmd += ["--device", args.device] if args.device else []
    return cmd


@contextmanager
def mode_servers(model, name: str, modes: Sequence[str], *, max_queue: int, args: argparse.Namespace
                 ) -> Iterator[dict[str, str]]:
    """{mode: URL} of a server per mode (see the module docstring); all stopped on exit. Processes are
    started together and then waited for, so their imports and model loads overlap."""
    with ExitStack() as stack:
        if args.server == "thread":
            yield {mode: stack.enter_context(_thread_server(model, name, mode, max_queue, args)) for mode in modes}
            return
        procs = {}
        stack.callback(_stop, procs)  # every process started below, also when a later start fails
        for mode, port in zip(modes, _free_ports(len(modes))):
            cmd = serve_command(args, mode, port, max_queue)
            procs[mode] = (subprocess.Popen(cmd, stdout=subprocess.DEVNULL), f"http://{LOOPBACK}:{port}", cmd)
        _wait_up(procs, time.monotonic() + args.startup_timeout, args.startup_timeout)
        yield {mode: url for mode, (_, url, _) in procs.items()}


@contextmanager
def _thread_server(model, name: str, mode: str, max_queue: int, args: argparse.Namespace) -> Iterator[str]:
    """``--server thread``: the app on the bench's model, served from a thread of this process."""
    from dllm.serve.http.app import create_app

    backend = build_backend(model, name, mode, args.max_running, max_queue,
                            getattr(args, "max_batch_tokens", None) if mode == "continuous" else None)
    try:
        with serve_in_thread(create_app(backend), ready_path="/health") as live:
            yield live.url
    finally:
        backend.close(drain=False)


def _stop(procs: dict) -> None:
    """SIGTERM to every process of ``procs`` ({mode: (Popen, ...)}) at once (``dllm serve`` drains and
    exits), then each waited for; SIGKILL after 60 s."""
    for proc, *_ in procs.values():
        proc.terminate()
    for proc, *_ in procs.values():
        try:
            proc.wait(60)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def _wait_up(procs: dict, deadline: float, timeout: float) -> None:
    """Until every server of ``procs`` ({mode: (Popen, url, cmd)}) answers /health, polling each in turn;
    an error naming the command of one that exits, or of one still silent at ``deadline`` (monotonic)."""
    pending = dict(procs)
    while pending:
        for mode, (proc, url, cmd) in list(pending.items()):
            if proc.poll() is not None:
                raise RuntimeError(f"the {mode} server exited with status {proc.returncode}: {' '.join(cmd)}")
            if answers(url + "/health"):
                del pending[mode]
            elif time.monotonic() > deadline:
                raise RuntimeError(f"the {mode} server did not answer within {timeout:.0f} s: {' '.join(cmd)}")
        if pending:
            time.sleep(0.05)


def _free_ports(n: int) -> list[int]:
    """``n`` distinct free ports of 127.0.0.1 (the OS may hand a port out twice once it is closed)."""
    ports: list[int] = []
    while len(ports) < n:
        port = free_port()
        if port not in ports:
            ports.append(port)
    return ports


def forward_counts(url: str) -> Optional[tuple[float, float]]:
    """(model forwards, rows over them) from the server's /metrics; None when it has none."""
    import urllib.request

    from prometheus_client.parser import text_string_to_metric_families

    try:
        with urllib.request.urlopen(url + "/metrics", timeout=10) as reply:
            text = reply.read().decode()
    except OSError:
        return None
    values = {s.name: s.value for fam in text_string_to_metric_families(text) for s in fam.samples}
    forwards, rows = values.get("dllm_model_forwards_total"), values.get("dllm_forwarded_rows_total")
    return None if forwards is None or rows is None else (forwards, rows)


__all__ = ["build_backend", "forward_counts", "free_port", "mode_servers", "serve_command"]
