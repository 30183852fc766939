"""An ASGI app served by uvicorn on 127.0.0.1 in a background thread, on a free port.

``dllm bench serve`` starts one server per serving mode this way, and the page and bench tests start
theirs the same way. The socket is bound before the thread starts (port 0: the system picks a free
port), so the URL is known and taken at once; ``stop()`` asks uvicorn to exit (it finishes the
requests in flight) and joins the thread.
"""

from __future__ import annotations

import socket
import threading
import time
from dataclasses import dataclass
from typing import Any, Optional

LOOPBACK = "127.0.0.1"


@dataclass
class LoopbackServer:
    """A running uvicorn server: ``url`` is ``http://127.0.0.1:PORT``."""

    url: str
    port: int
    _server: Any
    _thread: threading.Thread

    def stop(self, timeout: float = 30.0) -> None:
        self._server.should_exit = True
        self._thread.join(timeout)
        if self._thread.is_alive():  # a stuck request: give up on the graceful path
            self._server.force_exit = True
            self._thread.join(5.0)

    def __enter__(self) -> "LoopbackServer":
        return self

    def __exit__(self, *exc) -> None:
        self.stop()


def serve_in_thread(app: Any, *, port: int = 0, startup_timeout: float = 60.0,
                    log_level: str = "warning", ready_path: Optional[str] = None) -> LoopbackServer:
    """Serve ``app`` on 127.0.0.1 (``port`` 0: a free one) from a daemon thread; returns once uvicorn
    has started (and, with ``ready_path``, once that path answers). RuntimeError if it does not start
    within ``startup_timeout`` seconds."""
    import uvicorn

    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind((LOOPBACK, port))
    port = sock.getsockname()[1]
    config = uvicorn.Config(app, log_level=log_level, timeout_graceful_shutdown=10, lifespan="on")
    server = uvicorn.Server(config)
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, name=f"uvicorn:{port}", daemon=True)
    thread.start()
    deadline = time.monotonic() + startup_timeout
    while not server.started:
        if not thread.is_alive() or time.monotonic() > deadline:
            server.should_exit = True
            raise RuntimeError(f"the server on {LOOPBACK}:{port} did not start within {startup_timeout:.0f} s")
        time.sleep(0.02)
    url = f"http://{LOOPBACK}:{port}"
    if ready_path:
        wait_ready(url + ready_path, deadline)
    return LoopbackServer(url, port, server, thread)


def answers(url: str) -> bool:
    """Whether ``url`` answers 200 now (one request)."""
    import urllib.request

    try:
        with urllib.request.urlopen(url, timeout=5) as reply:
            return reply.status == 200
    except OSError:
        return False


def wait_ready(url: str, deadline: float) -> None:
    """Poll ``url`` until it answers 200; RuntimeError after ``deadline`` (time.monotonic)."""
    while not answers(url):
        if time.monotonic() > deadline:
            raise RuntimeError(f"{url} did not answer 200 in time")
        time.sleep(0.05)


__all__ = ["LOOPBACK", "LoopbackServer", "answers", "serve_in_thread", "wait_ready"]
