"""The servers of ``dllm bench serve``: one model, one serving mode, on 127.0.0.1, in a thread or a process.

``mode_server`` yields the URL of one: ``--server process`` (the default) runs ``dllm serve --model M
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
from contextlib import contextmanager
from typing import Iterator, Optional

from dllm.eval.bench.serving.loopback import LOOPBACK, serve_in_thread, wait_ready
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
def mode_server(model, name: str, mode: str, *, max_queue: int, args: argparse.Namespace) -> Iterator[str]:
    """The URL of a server in ``mode`` (see the module docstring); stopped on exit."""
    if args.server == "thread":
        from dllm.serve.http.app import create_app

        backend = build_backend(model, name, mode, args.max_running, max_queue,
                                getattr(args, "max_batch_tokens", None) if mode == "continuous" else None)
        try:
            with serve_in_thread(create_app(backend), ready_path="/health") as live:
                yield live.url
        finally:
            backend.close(drain=False)
        return
    port = free_port()
    cmd = serve_command(args, mode, port, max_queue)
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL)
    url = f"http://{LOOPBACK}:{port}"
    try:
        deadline = time.monotonic() + args.startup_timeout
        while True:
            if proc.poll() is not None:
                raise RuntimeError(f"the {mode} server exited with status {proc.returncode}: {' '.join(cmd)}")
            try:
                wait_ready(url + "/health", min(deadline, time.monotonic() + 1.0))
                break
            except RuntimeError:
                if time.monotonic() > deadline:
                    raise RuntimeError(f"the {mode} server did not answer within {args.startup_timeout:.0f} s: "
                                       f"{' '.join(cmd)}") from None
        yield url
    finally:
        proc.terminate()  # SIGTERM: dllm serve drains and exits
        try:
            proc.wait(60)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


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


__all__ = ["build_backend", "forward_counts", "free_port", "mode_server", "serve_command"]
