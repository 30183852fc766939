"""The OpenAI-compatible HTTP app over one backend (FastAPI; run by uvicorn, ``dllm serve``).

Endpoints: ``POST /v1/completions``, ``POST /v1/chat/completions`` (streamed over SSE with
``stream: true``, see ``dllm.serve.http.sse``), ``GET /v1/models``, ``GET /v1/dllm/options`` (the registered
samplers and caches with their option fields, and the server's defaults: the page's pickers),
``GET /health``, ``GET /metrics`` (Prometheus), ``GET /`` (the page, ``dllm/serve/http/static/index.html``)
and ``/static/...``.

A request is read (at most ``max_body_bytes``), validated (``dllm.serve.http.protocol``), turned into one
``JobRequest`` per choice and checked by the backend (``dllm.serve.http.translate``) before any job is
queued: every refusal is an OpenAI-style error body naming the field (400; 404 for a model this
server does not serve), 401 without the API key (``api_key``: ``Authorization: Bearer KEY`` on
``/v1/...``), 429 + Retry-After when the backend's queue is full, 503 + Retry-After once the server
drains or the backend is closed. A client that disconnects has its jobs cancelled at once
(``Job.cancel``: the row leaves the batch).

Shutdown (``begin_drain``: SIGTERM under ``dllm serve``, else the app's lifespan shutdown): new
requests get 503 while the backend closes, letting queued and running jobs finish for at most
``drain_timeout``; a job still unfinished then ends with a 503 too (``backend.close``), which its
client gets as an error body, or, streamed, as a last ``data: {"error": ...}`` event then ``[DONE]``.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import dataclasses
import math
import secrets
import threading
import time
from pathlib import Path
from typing import Any, Callable, Optional, Sequence

from fastapi import FastAPI, Request
from fastapi.responses import FileResponse, JSONResponse, Response, StreamingResponse
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.requests import ClientDisconnect
from starlette.staticfiles import StaticFiles
from starlette.types import ASGIApp, Receive, Scope, Send

from dllm.serve.backends.base import Backend, BadRequest
from dllm.serve.http.errors import ApiError, bad_request, from_exception, from_failed, quote, shutting_down
from dllm.serve.backends.jobs import Done, Failed, Job, JobRequest
from dllm.serve.http.metrics import CONTENT_TYPE, Metrics
from dllm.serve.http.protocol import ChatBody, CompletionBody, parse_body
from dllm.serve.http.replies import Reply
from dllm.serve.http.sse import cancel_unfinished, merged, stream
from dllm.serve.http.translate import job_requests

STATIC_DIR = Path(__file__).with_name("static")
MAX_BODY_BYTES = 1 << 20  # 1 MiB: far more than any prompt the models' positions allow
DISCONNECT_POLL_S = 0.25  # how often a waiting non-streamed request checks that its client is still there


def error_response(err: ApiError) -> JSONResponse:
    return JSONResponse(err.body(), status_code=err.status, headers=err.headers)


def bearer_token(header: bytes) -> Optional[bytes]:
    """The token of an ``Authorization: Bearer TOKEN`` header value; the scheme's case does not matter
    (RFC 9110 section 11.1: ``bearer``, ``BEARER``). None for another scheme."""
    scheme, _, token = header.strip().partition(b" ")
    return token.strip() if scheme.lower() == b"bearer" else None


class ApiKeyAuth:
    """``Authorization: Bearer KEY`` on every ``/v1/`` path (as vLLM's ``--api-key``; the scheme in any
    case); /health, /metrics and the page stay open. Compared in constant time."""

    def __init__(self, app: ASGIApp, api_key: str) -> None:
        self.app = app
        self.expected = api_key.encode()

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http" and scope["path"].startswith("/v1/") and scope["method"] != "OPTIONS":
            given = dict(scope["headers"]).get(b"authorization", b"")
            token = bearer_token(given)
            if token is None or not secrets.compare_digest(token, self.expected):
                what = ("no Authorization header" if not given else "an Authorization header without the Bearer "
                        "scheme" if token is None else "a wrong API key")
                err = ApiError(401, f"{what}; send 'Authorization: Bearer <the server's --api-key>'",
                               code="invalid_api_key", headers={"WWW-Authenticate": "Bearer"})
                await error_response(err)(scope, receive, send)
                return
        await self.app(scope, receive, send)


class JobStream(StreamingResponse):
    """A streamed reply that cancels its jobs however it ends, even when the client left before the
    first chunk (an async generator that never started runs no ``finally``)."""

    def __init__(self, content: Any, jobs: Sequence[Job], **kwargs: Any) -> None:
        super().__init__(content, **kwargs)
        self.jobs = jobs

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        try:
            await super().__call__(scope, receive, send)
        finally:
            cancel_unfinished(self.jobs)


async def read_body(request: Request, limit: int) -> bytes:
    """The body, refused (400, nothing more read) once it passes ``limit`` bytes."""
    def too_large(size: str) -> ApiError:
        return bad_request("body", f"the request body is {size} bytes; at most {limit} (--max-body-bytes)",
                           code="body_too_large")

    length = request.headers.get("content-length")
    if length is not None:
        if not length.isdigit():
            raise bad_request("body", f"Content-Length {quote(length)} is not a byte count", code="invalid_header")
        if int(length) > limit:
            raise too_large(length)
    chunks, size = [], 0
    async for chunk in request.stream():
        size += len(chunk)
        if size > limit:
            raise too_large(f"more than {limit}")
        chunks.append(chunk)
    return b"".join(chunks)


def refusal(err: Exception) -> ApiError:
    """An error raised while a request was read, checked or queued: ValueError / TypeError / KeyError
    from the backend's encode or check are bad input too (400), not server faults."""
    if isinstance(err, ClientDisconnect):  # gone while its body was read: nobody reads the reply
        return ApiError(499, "the client disconnected", code="cancelled")
    if isinstance(err, (ApiError, BadRequest)) or not isinstance(err, (ValueError, TypeError, KeyError)):
        return from_exception(err)
    return bad_request(None, str(err))


def submit_all(backend: Backend, requests: Sequence[JobRequest]) -> list[Job]:
    """Queue every choice, or none: a QueueFull midway cancels those already queued."""
    jobs: list[Job] = []
    try:
        for req in requests:
            jobs.append(backend.submit(req))
    except BaseException:
        cancel_unfinished(jobs)
        raise
    return jobs


async def wait_all(jobs: Sequence[Job], request: Request) -> list[Done]:
    """Every job's ``Done`` in order; a ``Failed`` is raised as its HTTP error. A client that goes
    away meanwhile has its jobs cancelled."""
    async def watch() -> None:
        while not await request.is_disconnected():
            await asyncio.sleep(DISCONNECT_POLL_S)
        cancel_unfinished(jobs)

    watcher = asyncio.create_task(watch())
    dones: list[Optional[Done]] = [None] * len(jobs)
    try:
        async for i, ev in merged(jobs):
            if isinstance(ev, Done):
                dones[i] = ev
            elif isinstance(ev, Failed):
                raise from_failed(ev.message, ev.status)
    finally:
        watcher.cancel()
        cancel_unfinished(jobs)
    return [d for d in dones if d is not None]


def _jsonable(value: Any) -> Any:
    if isinstance(value, float) and not math.isfinite(value):
        return str(value)
    if isinstance(value, (tuple, list)):
        return [_jsonable(v) for v in value]
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    return repr(value)


def registry_rows(registry: Any) -> list[dict[str, Any]]:
    """Each registered class: name, aliases, description, option fields (name, type, default)."""
    rows = []
    for entry in registry:
        fields = []
        config = getattr(entry.obj, "Config", None)
        if config is not None and dataclasses.is_dataclass(config):
            for f in dataclasses.fields(config):
                default = f.default if f.default is not dataclasses.MISSING else None
                fields.append({"name": f.name, "type": str(f.type), "default": _jsonable(default)})
        rows.append({"name": entry.name, "aliases": list(entry.aliases), "description": entry.description,
                     "options": fields})
    return rows


def options_body(backend: Backend, default_max_tokens: int) -> dict[str, Any]:
    """``GET /v1/dllm/options``."""
    from dllm.cache import caches
    from dllm.samplers import samplers

    defaults = getattr(backend, "defaults", None)
    body: dict[str, Any] = {
        "model": backend.model_name, "kind": backend.kind, "max_tokens_limit": backend.max_tokens_limit,
        "max_positions": backend.max_positions, "default_max_tokens": default_max_tokens,
        "defaults": _jsonable_dict(dataclasses.asdict(defaults)) if dataclasses.is_dataclass(defaults) else {},
        "samplers": registry_rows(samplers) if backend.kind == "diffusion" else [],
        "caches": registry_rows(caches) if backend.kind == "diffusion" else []}
    return body


def _jsonable_dict(d: dict[str, Any]) -> dict[str, Any]:
    out = {k: _jsonable(v) for k, v in d.items()}
    if "options" in d:
        out["options"] = {k: _jsonable(v) for k, v in d["options"]}
    return out


def _in_thread(call: Callable[[], None], name: str) -> "concurrent.futures.Future[None]":
    """Run ``call`` on a daemon thread; the future holds its end (its exception, if it raised)."""
    future: concurrent.futures.Future[None] = concurrent.futures.Future()

    def run() -> None:
        try:
            call()
        except BaseException as err:  # noqa: BLE001 - handed to whoever waits on the future
            future.set_exception(err)
        else:
            future.set_result(None)

    threading.Thread(target=run, name=name, daemon=True).start()
    return future


def begin_drain(app: FastAPI) -> "concurrent.futures.Future[None]":
    """Start the app's shutdown (idempotent; ``dllm serve`` calls it on SIGTERM / Ctrl-C, the lifespan
    at the latest): from now on new requests get 503 + Retry-After (and /health 503), while a thread
    closes the backend, letting queued and running requests finish for at most the app's
    ``drain_timeout`` (then each unfinished one ends with a 503: ``backend.close``). The future is done
    once the backend is closed, at once when the app does not own it (``close_backend=False``)."""
    state = app.state
    with state.drain_lock:
        state.draining = True
        if state.drain is None:
            if state.close_backend:
                state.drain = _in_thread(lambda: state.backend.close(True, state.drain_timeout), "dllm-serve-drain")
            else:
                state.drain = concurrent.futures.Future()
                state.drain.set_result(None)
        return state.drain


def end_drain(app: FastAPI) -> "concurrent.futures.Future[None]":
    """Stop waiting for the requests in flight (``dllm serve``: a second SIGTERM / Ctrl-C): each one
    still queued or running ends now with a 503 (``backend.close(drain=False)``). Starts the drain
    first when it has not begun; returns its future (``begin_drain``)."""
    drain = begin_drain(app)
    if app.state.close_backend and not drain.done():
        _in_thread(lambda: app.state.backend.close(False), "dllm-serve-stop")
    return drain


def create_app(backend: Backend, *, api_key: Optional[str] = None, max_body_bytes: int = MAX_BODY_BYTES,
               default_max_tokens: int = 16, close_backend: bool = True, drain_timeout: Optional[float] = None,
               static_dir: Path = STATIC_DIR) -> FastAPI:
    """The app serving ``backend``. ``close_backend``: close it when the app shuts down (``begin_drain``),
    giving the requests in flight at most ``drain_timeout`` seconds (None: as long as they need).
    ``default_max_tokens`` (a request's max_tokens when it gives none) is at most the backend's
    ``max_tokens_limit``, so a request that leaves max_tokens out is never refused for it."""
    if max_body_bytes < 1:
        raise ValueError(f"max_body_bytes must be >= 1, got {max_body_bytes}")
    if default_max_tokens < 1:
        raise ValueError(f"default_max_tokens must be >= 1, got {default_max_tokens}")
    default_max_tokens = min(default_max_tokens, backend.max_tokens_limit)
    if api_key is not None and not api_key:
        raise ValueError("api_key must not be empty (leave it out to serve without one)")

    @contextlib.asynccontextmanager
    async def lifespan(app: FastAPI):
        yield
        await asyncio.wrap_future(begin_drain(app))

    app = FastAPI(title="dllm serve", lifespan=lifespan, docs_url=None, redoc_url=None, openapi_url=None)
    app.state.backend = backend
    app.state.close_backend, app.state.drain_timeout = close_backend, drain_timeout
    app.state.draining, app.state.drain, app.state.drain_lock = False, None, threading.Lock()
    metrics = Metrics(backend)
    app.state.metrics = metrics
    if api_key is not None:
        app.add_middleware(ApiKeyAuth, api_key=api_key)

    @app.exception_handler(StarletteHTTPException)
    async def http_error(request: Request, exc: StarletteHTTPException) -> JSONResponse:
        what = {404: f"no route {request.method} {request.url.path}", 405: f"{request.method} is not allowed on "
                f"{request.url.path}"}.get(exc.status_code, str(exc.detail))
        return error_response(ApiError(exc.status_code, what, code="not_found" if exc.status_code == 404 else None))

    @app.exception_handler(Exception)
    async def any_error(request: Request, exc: Exception) -> JSONResponse:
        return error_response(from_exception(exc))

    async def complete(request: Request, body_model: type, endpoint: str) -> Response:
        chat = body_model is ChatBody
        try:
            if app.state.draining:
                raise shutting_down("the server is shutting down and takes no new requests")
            body = parse_body(await read_body(request, max_body_bytes), body_model)
            requests = job_requests(body, backend, default_max_tokens=default_max_tokens)
            jobs = submit_all(backend, requests)
        except Exception as err:  # noqa: BLE001  (every refusal becomes an error body)
            e = refusal(err)
            metrics.count(endpoint, e.status)
            return error_response(e)
        reply = Reply(model=backend.model_name, chat=chat)
        if body.stream:
            metrics.count(endpoint, 200)
            include_usage = bool(body.stream_options and body.stream_options.include_usage)
            events = stream(jobs, reply, n=body.n, include_usage=include_usage, on_done=metrics.observe,
                            step_events=any(r.step_events for r in requests))
            return JobStream(events, jobs, media_type="text/event-stream",
                             headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"})
        try:
            dones = await wait_all(jobs, request)
        except ApiError as e:
            metrics.count(endpoint, e.status)
            return error_response(e)
        for i, d in enumerate(dones):  # one per choice, n a prompt
            metrics.observe(d, i % body.n == 0)
        metrics.count(endpoint, 200)
        return JSONResponse(reply.final(dones, body.n))

    @app.post("/v1/completions")
    async def completions(request: Request) -> Response:
        return await complete(request, CompletionBody, "completions")

    @app.post("/v1/chat/completions")
    async def chat_completions(request: Request) -> Response:
        return await complete(request, ChatBody, "chat")

    created = int(time.time())

    def model_card() -> dict[str, Any]:
        return {"id": backend.model_name, "object": "model", "created": created, "owned_by": "dllm",
                "kind": backend.kind, "max_model_len": backend.max_positions}

    @app.get("/v1/models")
    async def models() -> dict[str, Any]:
        return {"object": "list", "data": [model_card()]}

    @app.get("/v1/models/{name:path}")
    async def model(name: str) -> Response:
        if name != backend.model_name:
            return error_response(ApiError(404, f"unknown model {quote(name)}; this server serves "
                                                f"{backend.model_name!r}", param="model", code="model_not_found"))
        return JSONResponse(model_card())

    @app.get("/v1/dllm/options")
    async def options() -> dict[str, Any]:
        return options_body(backend, default_max_tokens)

    @app.get("/health")
    async def health() -> Response:
        s = backend.stats()
        ok = not (app.state.draining or s.closed)
        body = {"status": "ok" if ok else "draining", "model": backend.model_name, "kind": backend.kind,
                "queued": s.queued, "running": s.running, "max_running": s.max_running, "max_queue": s.max_queue}
        return JSONResponse(body, status_code=200 if ok else 503)

    @app.get("/metrics")
    async def prometheus() -> Response:
        return Response(metrics.render(), media_type=CONTENT_TYPE)

    @app.get("/")
    async def page() -> Response:
        index = static_dir / "index.html"
        if not index.is_file():
            return error_response(ApiError(404, f"the page is not installed ({index} is missing)", code="not_found"))
        return FileResponse(index)

    if static_dir.is_dir():
        app.mount("/static", StaticFiles(directory=static_dir), name="static")
    return app


__all__ = ["ApiKeyAuth", "JobStream", "MAX_BODY_BYTES", "bearer_token", "begin_drain", "create_app", "end_drain",
           "error_response", "options_body", "read_body", "refusal", "submit_all", "wait_all"]
