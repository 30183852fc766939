"""The servers of ``dllm bench serve``: one model, one serving mode, 127.0.0.1, in a thread or a process.

``mode_server`` yields the URL of one (``--server thread``: the app in a thread of the bench's
process; ``--server process``: this module run as a process); ``forward_counts`` reads the model
forwards and rows from its /metrics (their ratio is the mean batch). As a process:

    python -m dllm.eval.bench.serve_worker --model tiny-llada --mode continuous --threads 1

It builds the real app (``dllm.serve.app.create_app``) on a ``DiffusionEngine`` in that mode, binds
127.0.0.1 on a free port, prints ``listening on http://127.0.0.1:PORT`` as its first stdout line and
serves until SIGTERM or SIGINT (uvicorn's graceful shutdown), then closes the engine. The load
generator runs in another process, as in vLLM's serving benchmark, so that the client's parsing
does not compete with the server for one interpreter lock.
"""

from __future__ import annotations

import argparse
import select
import socket
import subprocess
import sys
import time
from contextlib import contextmanager
from typing import Iterator, Optional, Sequence

from dllm.eval.bench.loopback import LOOPBACK

READY = "listening on "


def build_engine(model, name: str, mode: str, max_running: int, max_queue: int):
    """A ``DiffusionEngine`` in ``mode`` with the server's default settings."""
    from dllm.serve.diffusion import DiffusionEngine
    from dllm.serve.jobs import DiffusionSettings

    return DiffusionEngine(model, name=name, defaults=DiffusionSettings(), mode=mode, max_running=max_running,
                           max_queue=max_queue)


@contextmanager
def mode_server(model, name: str, mode: str, *, max_queue: int, args: argparse.Namespace) -> Iterator[str]:
    """The URL of a server in ``mode``: the app in a thread of this process (``--server thread``, on
    ``model``) or a ``serve_worker`` process (``--server process``, loads the model itself)."""
    from dllm.eval.bench.loopback import serve_in_thread, wait_ready

    if args.server == "thread":
        from dllm.serve.app import create_app

        engine = build_engine(model, name, mode, args.max_running, max_queue)
        try:
            with serve_in_thread(create_app(engine), ready_path="/health") as live:
                yield live.url
        finally:
            engine.close(drain=False)
        return
    cmd = [sys.executable, "-m", "dllm.eval.bench.serve_worker", "--model", args.model, "--mode", mode,
           "--max-running", str(args.max_running), "--max-queue", str(max_queue)]
    cmd += ["--threads", str(args.threads)] if args.threads else []
    cmd += ["--device", args.device] if args.device else []
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + args.startup_timeout
        ready, _, _ = select.select([proc.stdout], [], [], args.startup_timeout)
        line = proc.stdout.readline() if ready else ""
        if not line.startswith(READY):
            raise RuntimeError(f"the {mode} server process did not start within {args.startup_timeout:.0f} s "
                               f"(exit status {proc.poll()}): {' '.join(cmd)}")
        url = line[len(READY):].strip()
        wait_ready(url + "/health", deadline)
        yield url
    finally:
        proc.terminate()
        try:
            proc.wait(30)
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


def main(argv: Optional[Sequence[str]] = None) -> int:
    from dllm.serve.diffusion import MODES

    ap = argparse.ArgumentParser(prog="python -m dllm.eval.bench.serve_worker", description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", required=True)
    ap.add_argument("--mode", required=True, choices=MODES)
    ap.add_argument("--max-running", type=int, default=32)
    ap.add_argument("--max-queue", type=int, default=256)
    ap.add_argument("--threads", type=int, default=None)
    ap.add_argument("--device", default=None)
    args = ap.parse_args(argv)
    if args.threads:
        import torch

        torch.set_num_threads(args.threads)
    import uvicorn

    import dllm
    from dllm.serve.app import create_app

    engine = build_engine(dllm.load(args.model, device=args.device), args.model, args.mode, args.max_running,
                          args.max_queue)
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.bind((LOOPBACK, 0))
    config = uvicorn.Config(create_app(engine), log_level="warning", timeout_graceful_shutdown=10)
    server = uvicorn.Server(config)
    print(f"{READY}http://{LOOPBACK}:{sock.getsockname()[1]}", flush=True)
    try:
        server.run(sockets=[sock])
    finally:
        engine.close(drain=False)
    return 0


if __name__ == "__main__":
    sys.exit(main())
