"""Several replicas of ``dllm serve`` behind one endpoint, through Ray Serve (the optional extra ``dllm[ray]``).

Each replica is a Ray actor that builds its own backend (a ``DiffusionBackend`` or ``SpeculativeBackend``: continuous
batching inside the replica) and serves the same app as ``dllm serve`` (``dllm.serve.http.app.create_app``:
the OpenAI endpoints, streaming, /metrics, the page). Ray Serve's HTTP proxy is the one endpoint; it
sends each request to a replica (its router prefers the less loaded of two random replicas) and streams
the reply back. Every reply carries the header ``x-dllm-replica: <host>:<pid>`` of the replica that
answered; /metrics and /health describe that replica only.

One machine::

    app = application(DiffusionReplica("tiny-llada"), replicas=2, num_cpus=1, threads=1)
    run(app, host="127.0.0.1", port=8000)        # blocks; Ctrl-C or SIGTERM shuts Serve down

Many GPUs, many machines: start a Ray cluster (``ray start --head`` on one machine, ``ray start
--address HEAD:6379`` on the others), then run the same code with ``run(app, address="auto",
host="0.0.0.0")`` and ``num_gpus=1`` per replica: Ray places one replica per GPU across the
cluster, and every node's proxy accepts requests (put a load balancer in front of the nodes).
The model is loaded by each replica from a name or a directory every node can read.

Ray Serve: https://docs.ray.io/en/latest/serve/ (``serve.ingress`` with ``__serve_build_asgi_app__``
builds the app inside the replica, so backends and models are never pickled).
"""

from __future__ import annotations

import os
import socket
from dataclasses import dataclass
from typing import Any, Callable, Optional

from dllm.settings import DecodeSettings

REPLICA_HEADER = "x-dllm-replica"
INSTALL = 'Ray Serve is not installed; pip install "dllm[ray]" (or pip install "ray[serve]")'


def _serve():
    try:
        from ray import serve
    except ImportError as err:
        raise ModuleNotFoundError(f"{INSTALL} ({err})") from None
    return serve


@dataclass(frozen=True)
class DiffusionReplica:
    """What each replica builds: a diffusion model (a name ``dllm.load`` knows, or a directory) served by
    a ``DiffusionBackend``. Picklable, so that Ray can send it to the replicas; called there."""

    model: str
    defaults: DecodeSettings = DecodeSettings()
    mode: str = "continuous"
    max_running: int = 32
    max_queue: int = 256
    max_tokens_limit: Optional[int] = None
    chat_template: Optional[str] = None
    name: Optional[str] = None  # the model id clients name (default: ``model``)
    device: Optional[str] = None
    dtype: Optional[str] = None
    tensor_parallel: Optional[int] = None  # each replica a group of N ranks (its own N - 1 child processes;
    #   mode "static" or "serial"; num_gpus=N per replica on GPUs)
    expert_parallel: bool = False

    def __call__(self):
        from dllm.models.loading import load
        from dllm.serve.backends.diffusion import DiffusionBackend
        from dllm.serve.backends.tensor_parallel import split_model

        mirror = None
        if self.tensor_parallel is not None:
            model, mirror = split_model(self.model, self.tensor_parallel, dtype=self.dtype, device=self.device,
                                        expert_parallel=self.expert_parallel)
        else:
            model = load(self.model, device=self.device, dtype=self.dtype)
        return DiffusionBackend(model, name=self.name or self.model, defaults=self.defaults, mode=self.mode,
                                max_running=self.max_running, max_queue=self.max_queue,
                                max_tokens_limit=self.max_tokens_limit, chat_template=self.chat_template,
                                mirror=mirror)


class ReplicaHeader:
    """ASGI middleware: ``x-dllm-replica: <host>:<pid>`` on every HTTP reply (streamed ones included)."""

    def __init__(self, app: Any, tag: str) -> None:
        self.app, self.tag = app, tag.encode()

    async def __call__(self, scope, receive, send) -> None:
        if scope["type"] != "http":
            return await self.app(scope, receive, send)

        async def tagged(message) -> None:
            if message["type"] == "http.response.start":
                message = {**message, "headers": [*message.get("headers", []), (REPLICA_HEADER.encode(), self.tag)]}
            await send(message)

        await self.app(scope, receive, tagged)


def replica_tag() -> str:
    return f"{socket.gethostname()}:{os.getpid()}"


class _Replica:
    """One replica: builds the backend and the app when Ray starts it; closes the backend when Ray stops it."""

    def __init__(self, make_backend: Callable[[], Any], api_key: Optional[str], options: dict,
                 threads: Optional[int]) -> None:
        if threads:
            import torch

            torch.set_num_threads(threads)
        self.backend = make_backend()
        self.api_key, self.options = api_key, options

    def __serve_build_asgi_app__(self):
        from dllm.serve.http.app import create_app

        app = create_app(self.backend, api_key=self.api_key, **self.options)
        app.add_middleware(ReplicaHeader, tag=replica_tag())
        return app

    def __del__(self) -> None:  # Ray Serve calls it when the replica shuts down
        backend = getattr(self, "backend", None)
        if backend is not None:
            backend.close(drain=True, timeout=30)


def application(make_backend: Callable[[], Any], *, replicas: int = 2, api_key: Optional[str] = None,
                num_cpus: float = 1.0, num_gpus: float = 0.0, threads: Optional[int] = None,
                max_ongoing_requests: Optional[int] = None, name: str = "dllm", app_options: Optional[dict] = None):
    """A Ray Serve application: ``replicas`` copies of the app, each on the backend ``make_backend()``
    builds (a picklable callable: ``DiffusionReplica``, or a ``functools.partial`` of a module-level
    function, e.g. ``partial(dllm.cli.serve.build_backend, args, chat_template)`` for exactly what
    ``dllm serve``'s flags build, speculative targets included). ``num_cpus`` / ``num_gpus`` are each
    replica's Ray resources, ``threads`` its torch CPU threads;
    ``max_ongoing_requests`` (default: the backend's running + queued bound when it is a
    ``DiffusionReplica``, else 256) is how many requests Ray lets a replica hold before it routes
    elsewhere or queues them in the proxy. ``app_options`` go to ``create_app`` (max_body_bytes ...)."""
    if not isinstance(replicas, int) or replicas < 1:
        raise ValueError(f"replicas must be a positive integer, got {replicas!r}")
    if num_cpus < 0 or num_gpus < 0:
        raise ValueError(f"num_cpus and num_gpus must be >= 0, got {num_cpus} and {num_gpus}")
    serve = _serve()
    if max_ongoing_requests is None:
        bound = getattr(make_backend, "max_running", 0) + getattr(make_backend, "max_queue", 0)
        max_ongoing_requests = bound or 256
    actor: dict[str, Any] = {"num_cpus": num_cpus, "num_gpus": num_gpus}
    if threads:
        actor["runtime_env"] = {"env_vars": {"OMP_NUM_THREADS": str(threads)}}
    try:
        ingress = serve.ingress()  # the app is built in the replica by __serve_build_asgi_app__
    except TypeError:
        import ray

        raise ModuleNotFoundError(f"dllm.serve.ray_app needs a Ray Serve whose serve.ingress() builds the app "
                                  f"inside the replica (tested with ray 2.60); ray {ray.__version__} is installed: "
                                  f'pip install -U "ray[serve]"') from None
    cls = ingress(type("DllmReplica", (_Replica,), {"__module__": __name__}))
    deployment = serve.deployment(cls, name=name, num_replicas=replicas, ray_actor_options=actor,
                                  max_ongoing_requests=max_ongoing_requests)
    return deployment.bind(make_backend, api_key, dict(app_options or {}), threads)


def run(app, *, host: str = "127.0.0.1", port: int = 8000, address: Optional[str] = None, name: str = "dllm",
        blocking: bool = True, ray_init: Optional[dict] = None) -> None:
    """Start Ray (a local one, or join the cluster at ``address``, e.g. "auto"), Serve's proxy on
    ``host:port`` and the application at ``/``; returns once every replica is up (``blocking``: then
    waits until Ctrl-C or SIGTERM and shuts Serve down). ``ray_init``: more keywords of ``ray.init``."""
    serve = _serve()
    import ray

    if not ray.is_initialized():
        ray.init(address=address, **(ray_init or {}))
    serve.start(http_options={"host": host, "port": port})
    serve.run(app, name=name, route_prefix="/", blocking=False)
    if not blocking:
        return
    import signal
    import threading

    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    try:
        while not stop.wait(0.5):
            pass
    except KeyboardInterrupt:
        pass
    finally:
        serve.shutdown()


__all__ = ["DiffusionReplica", "REPLICA_HEADER", "ReplicaHeader", "application", "run"]
