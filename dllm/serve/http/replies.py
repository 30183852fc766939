"""The reply objects, shaped as OpenAI's: completions (``text_completion``), chat (``chat.completion``),
their streamed chunks, ``usage``; plus dllm's own numbers per choice under the key ``dllm``
(NFE, forwarded tokens, tokens per forward, tokens/s, TTFT, acceptance for drafters), which the
``openai`` client keeps as an extra field (``choice.model_extra["dllm"]``).
"""

from __future__ import annotations

import time
import uuid
from dataclasses import dataclass, field
from typing import Any, Optional, Sequence

from dllm.serve.backends.jobs import Done, Step


def choice_stats(done: Done) -> dict[str, Any]:
    """dllm's numbers of one finished choice (also the ``dllm.done`` event's data)."""
    out: dict[str, Any] = {
        "nfe": done.nfe, "forwarded_tokens": done.forwarded_tokens, "completion_tokens": done.completion_tokens,
        "tokens_per_forward": round(done.tokens_per_forward, 4),
        "tokens_per_s": round(done.completion_tokens / done.wall_s, 3) if done.wall_s > 0 else 0.0,
        "wall_s": round(done.wall_s, 6), "ttft_s": None if done.ttft_s is None else round(done.ttft_s, 6),
        "queue_s": round(done.queue_s, 6)}
    if done.acceptance is not None:
        out["acceptance"] = round(done.acceptance, 4)
    return out


def step_data(index: int, step: Step) -> dict[str, Any]:
    """The ``dllm.step`` event's data: the generated region after one denoising step."""
    return {"index": index, "step": step.step, "block": step.block, "nfe": step.nfe, "tokens": list(step.tokens),
            "trace": list(step.trace), "committed": list(step.committed)}


def usage(prompt_tokens: int, completion_tokens: int) -> dict[str, int]:
    return {"prompt_tokens": prompt_tokens, "completion_tokens": completion_tokens,
            "total_tokens": prompt_tokens + completion_tokens}


def usage_of(dones: Sequence[Done], n: int) -> dict[str, int]:
    """Usage of a request's choices (prompt-major, ``n`` per prompt): each prompt counted once."""
    return usage(sum(d.prompt_tokens for d in dones[::n]), sum(d.completion_tokens for d in dones))


@dataclass
class Reply:
    """The ids and shapes of one request's reply (``chat``: chat completion, else completion)."""

    model: str
    chat: bool
    id: str = ""
    created: int = field(default_factory=lambda: int(time.time()))

    def __post_init__(self) -> None:
        if not self.id:
            self.id = ("chatcmpl-" if self.chat else "cmpl-") + uuid.uuid4().hex

    def _head(self, obj: str) -> dict[str, Any]:
        return {"id": self.id, "object": obj, "created": self.created, "model": self.model}

    def final(self, dones: Sequence[Done], n: int) -> dict[str, Any]:
        """The non-streamed reply: one choice per ``Done``, in choice order."""
        choices = []
        for i, d in enumerate(dones):
            c: dict[str, Any] = {"index": i, "finish_reason": d.finish_reason, "logprobs": None}
            if self.chat:
                c["message"] = {"role": "assistant", "content": d.text}
            else:
                c["text"] = d.text
            c["dllm"] = choice_stats(d)
            choices.append(c)
        return {**self._head("chat.completion" if self.chat else "text_completion"), "choices": choices,
                "usage": usage_of(dones, n)}

    def chunk(self, index: int, text: Optional[str] = None, finish_reason: Optional[str] = None,
              role: bool = False) -> dict[str, Any]:
        """One streamed chunk for choice ``index``: new text, or the end (``finish_reason``), or (chat)
        the opening one that carries the role."""
        if self.chat:
            delta: dict[str, Any] = {"role": "assistant", "content": ""} if role else {}
            if text is not None:
                delta["content"] = text
            choice = {"index": index, "delta": delta, "logprobs": None, "finish_reason": finish_reason}
            return {**self._head("chat.completion.chunk"), "choices": [choice]}
        choice = {"index": index, "text": text or "", "logprobs": None, "finish_reason": finish_reason}
        return {**self._head("text_completion"), "choices": [choice]}

    def usage_chunk(self, dones: Sequence[Done], n: int) -> dict[str, Any]:
        """``stream_options.include_usage``: the last chunk, no choices, the usage."""
        obj = "chat.completion.chunk" if self.chat else "text_completion"
        return {**self._head(obj), "choices": [], "usage": usage_of(dones, n)}


__all__ = ["Reply", "choice_stats", "step_data", "usage", "usage_of"]
