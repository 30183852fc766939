"""The backend interface the HTTP layer talks to (``DiffusionBackend``, ``SpeculativeBackend``)."""

from __future__ import annotations

import abc
from dataclasses import dataclass
from typing import Any, Optional, Sequence, Union

from dllm.serve.backends.jobs import Job, JobRequest


class BadRequest(ValueError):
    """A request the backend refuses before anything reaches the decode loop (HTTP 400).

    ``param`` names the request field (OpenAI's error ``param``: "max_tokens", "sampler", "messages",
    "prompt", "model" ...); the message says what was given and what is valid."""

    def __init__(self, param: Optional[str], message: str) -> None:
        super().__init__(message)
        self.param = param


@dataclass(frozen=True)
class BackendStats:
    """A snapshot for /metrics and /health."""

    queued: int  # submitted, not started
    running: int  # rows decoding now
    max_running: int
    max_queue: int
    forwards: int  # model forwards run so far (batched forwards count once)
    forwarded_rows: int  # rows summed over those forwards (rows / forwards = the mean batch)
    closed: bool


class Backend(abc.ABC):
    """Runs ``JobRequest``s on background threads; thread-safe."""

    kind: str  # "diffusion" or "speculative"
    model_name: str  # the id /v1/models lists and requests must name
    tokenizer: Any
    max_positions: Optional[int]  # prompt + generated tokens must fit (None: no limit)
    max_tokens_limit: int  # the largest max_tokens a request may ask for

    @abc.abstractmethod
    def encode_prompt(self, prompt: Union[str, Sequence[int]]) -> tuple[int, ...]:
        """Token ids of a completion prompt (a string or token ids); BadRequest("prompt", ...) for
        words the tokenizer does not know or ids outside the vocabulary."""

    @abc.abstractmethod
    def encode_chat(self, messages: Sequence[dict]) -> tuple[int, ...]:
        """Token ids of chat messages through the chat template (the tokenizer's, or the one given
        to the backend); BadRequest("messages", ...) when there is none or a message is malformed."""

    @abc.abstractmethod
    def check(self, request: JobRequest) -> None:
        """Every check that can fail before decoding (BadRequest naming the field): the sampler,
        cache and options against the registries, max_tokens against the limit, prompt + max_tokens
        against the model's positions, the seed's range."""

    @abc.abstractmethod
    def submit(self, request: JobRequest) -> Job:
        """Check and queue a request; QueueFull when the queue is full, BackendClosed after close()."""

    @abc.abstractmethod
    def stats(self) -> BackendStats:
        ...

    @abc.abstractmethod
    def close(self, drain: bool = True, timeout: Optional[float] = None) -> None:
        """Refuse new requests; with ``drain`` let queued and running ones finish (else cancel them);
        then stop the threads."""


__all__ = ["BadRequest", "Backend", "BackendStats"]
