"""HTTP errors in OpenAI's shape: ``{"error": {"message", "type", "param", "code"}}``.

Every refusal the server makes is an ``ApiError`` (status, message, the request field it is about);
``from_exception`` maps the backend's exceptions (``BadRequest`` -> 400, ``QueueFull`` -> 429 with
Retry-After, ``BackendClosed`` -> 503 with Retry-After) so the app has one place that decides status
codes. A message quotes at most ``QUOTE_LIMIT`` characters of any one piece of the client's input
(``quote``; ``clip_message`` bounds the backend's and the tokenizer's messages the same way), so a 1 MB
field never comes back in an error body. The body
follows the OpenAI API reference's error object (https://platform.openai.com/docs/guides/error-codes)
and vLLM's ``ErrorResponse`` (vllm/entrypoints/openai/protocol.py).
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, field
from typing import Any, Optional

from dllm.serve.backends.base import BadRequest
from dllm.serve.backends.jobs import BackendClosed, QueueFull

# status -> OpenAI's error ``type``
ERROR_TYPES = {400: "invalid_request_error", 401: "invalid_request_error", 404: "not_found_error",
               405: "invalid_request_error", 429: "rate_limit_error", 499: "invalid_request_error",
               500: "server_error", 503: "server_error"}
QUOTE_LIMIT = 200  # characters of one piece of the client's input an error message may quote
MESSAGE_LIMIT = 1000  # characters of an error message
DRAIN_RETRY_AFTER_S = 5  # Retry-After of a 503 while the server shuts down


def clip(text: str, limit: int = QUOTE_LIMIT) -> str:
    """``text`` if it has at most ``limit`` characters, else its first ``limit - 1`` and an ellipsis."""
    return text if len(text) <= limit else text[:limit - 1] + "\u2026"


def quote(value: Any, limit: int = QUOTE_LIMIT) -> str:
    """How an error message quotes the client's input: ``repr(value)``, clipped to ``limit`` characters."""
    return clip(repr(value), limit)


# a quoted span longer than QUOTE_LIMIT, or a run without whitespace longer than that and its punctuation
_LONG_INPUT = re.compile(r"'[^'\n]{%d,}'|\"[^\"\n]{%d,}\"|\S{%d,}"
                         % (QUOTE_LIMIT - 1, QUOTE_LIMIT - 1, QUOTE_LIMIT + 10))


def _clip_span(span: str) -> str:
    """A long span of ``clip_message``: a quoted one keeps its quotes."""
    if span[0] in "'\"" and span[-1] == span[0] and len(span) > 1:
        return span[0] + clip(span[1:-1], QUOTE_LIMIT - 2) + span[0]
    return clip(span)


def utf8(text: str) -> str:
    """``text`` with each lone surrogate (from a client's ``"\\ud800"`` JSON escape) written as its
    escape, so the error body encodes as UTF-8."""
    return text.encode("utf-8", "backslashreplace").decode("utf-8")


def clip_message(message: str) -> str:
    """``message`` with every quoted span and every run without whitespace longer than ``QUOTE_LIMIT``
    clipped (how the backend's and the tokenizer's messages quote a client's input), and at most
    ``MESSAGE_LIMIT`` characters in all."""
    return clip(_LONG_INPUT.sub(lambda m: _clip_span(m.group()), message), MESSAGE_LIMIT)


@dataclass
class ApiError(Exception):
    """A refused or failed request: its HTTP status and OpenAI-style body."""

    status: int
    message: str
    param: Optional[str] = None  # the request field at fault ("max_tokens", "messages[0].content")
    code: Optional[str] = None  # a short machine-readable reason ("invalid_value", "queue_full")
    headers: dict[str, str] = field(default_factory=dict)

    def __post_init__(self) -> None:
        self.message = clip_message(utf8(self.message))
        if self.param is not None:
            self.param = clip(utf8(self.param))
        super().__init__(self.message)

    def body(self) -> dict[str, Any]:
        return {"error": {"message": self.message, "type": ERROR_TYPES.get(self.status, "server_error"),
                          "param": self.param, "code": self.code}}


def bad_request(param: Optional[str], message: str, code: str = "invalid_value") -> ApiError:
    return ApiError(400, message, param=param, code=code)


def retry_after_header(seconds: float) -> dict[str, str]:
    """Retry-After takes whole seconds (RFC 9110 section 10.2.3); at least 1."""
    return {"Retry-After": str(max(1, math.ceil(seconds)))}


def from_exception(err: Exception) -> ApiError:
    """The backend's exceptions as HTTP errors; anything else is a 500 that names its type, no traceback."""
    if isinstance(err, ApiError):
        return err
    if isinstance(err, BadRequest):
        return bad_request(err.param, str(err))
    if isinstance(err, QueueFull):
        return ApiError(429, f"the server is busy: {err}; retry later", code="queue_full",
                        headers=retry_after_header(err.retry_after))
    if isinstance(err, BackendClosed):
        return shutting_down(f"the server is shutting down and takes no new requests ({err})".replace(" ()", ""))
    return ApiError(500, f"internal error: {type(err).__name__}: {err}", code="internal_error")


def shutting_down(message: str) -> ApiError:
    """503 + Retry-After: the server drains (SIGTERM) or its backend is closed."""
    return ApiError(503, message, code="shutting_down", headers=retry_after_header(DRAIN_RETRY_AFTER_S))


def from_failed(message: str, status: int) -> ApiError:
    """A job's ``Failed`` event (after it was accepted) as an HTTP error: 499 cancelled, 503 (the
    server shut down before it finished: with Retry-After), else 500."""
    if status == 503:
        return shutting_down(message)
    code = {499: "cancelled"}.get(status, "decode_failed")
    return ApiError(status, message, code=code)


__all__ = ["ApiError", "DRAIN_RETRY_AFTER_S", "ERROR_TYPES", "MESSAGE_LIMIT", "QUOTE_LIMIT", "bad_request", "clip",
           "clip_message", "from_exception", "from_failed", "quote", "retry_after_header", "shutting_down", "utf8"]
