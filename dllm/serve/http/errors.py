"""HTTP errors in OpenAI's shape: ``{"error": {"message", "type", "param", "code"}}``.

Every refusal the server makes is an ``ApiError`` (status, message, the request field it is about);
``from_exception`` maps the engine's exceptions (``BadRequest`` -> 400, ``QueueFull`` -> 429 with
Retry-After, ``EngineClosed`` -> 503) so the app has one place that decides status codes. The body
follows the OpenAI API reference's error object (https://platform.openai.com/docs/guides/error-codes)
and vLLM's ``ErrorResponse`` (vllm/entrypoints/openai/protocol.py).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, Optional

from dllm.serve.engines.base import BadRequest
from dllm.serve.engines.jobs import EngineClosed, QueueFull

# status -> OpenAI's error ``type``
ERROR_TYPES = {400: "invalid_request_error", 401: "invalid_request_error", 404: "not_found_error",
               405: "invalid_request_error", 429: "rate_limit_error", 499: "invalid_request_error",
               500: "server_error", 503: "server_error"}


@dataclass
class ApiError(Exception):
    """A refused or failed request: its HTTP status and OpenAI-style body."""

    status: int
    message: str
    param: Optional[str] = None  # the request field at fault ("max_tokens", "messages[0].content")
    code: Optional[str] = None  # a short machine-readable reason ("invalid_value", "queue_full")
    headers: dict[str, str] = field(default_factory=dict)

    def __post_init__(self) -> None:
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
    """The engine's exceptions as HTTP errors; anything else is a 500 that names its type, no traceback."""
    if isinstance(err, ApiError):
        return err
    if isinstance(err, BadRequest):
        return bad_request(err.param, str(err))
    if isinstance(err, QueueFull):
        return ApiError(429, f"the server is busy: {err}; retry later", code="queue_full",
                        headers=retry_after_header(err.retry_after))
    if isinstance(err, EngineClosed):
        return ApiError(503, f"the server is shutting down and takes no new requests ({err})".replace(" ()", ""),
                        code="shutting_down", headers=retry_after_header(5))
    return ApiError(500, f"internal error: {type(err).__name__}: {err}", code="internal_error")


def from_failed(message: str, status: int) -> ApiError:
    """A job's ``Failed`` event (after it was accepted) as an HTTP error."""
    code = {499: "cancelled", 503: "shutting_down"}.get(status, "decode_failed")
    return ApiError(status, message, code=code)


__all__ = ["ApiError", "ERROR_TYPES", "bad_request", "from_exception", "from_failed", "retry_after_header"]
