"""Stops of ``speculative_generate``: the rule that ends a row (EOS ids, ``max_new_tokens``, stop
strings on the generated text). Its prompts are ``dllm.inputs.Prompts``, encoded by
``dllm.inputs.prompt_rows`` (the one prompt encoder of ``generate`` too)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Optional


def stop_strings(stop, tokenizer) -> tuple[str, ...]:
    if stop is None:
        return ()
    strings = (stop,) if isinstance(stop, str) else tuple(stop)
    if not strings or not all(isinstance(s, str) and s for s in strings):
        raise ValueError(f"stop must be a non-empty string or a list of non-empty strings, got {stop!r}")
    if tokenizer is None:
        raise ValueError(f"stop strings {list(strings)} need a tokenizer: pass tokenizer=...")
    return strings


@dataclass(frozen=True)
class StopRule:
    """Where a row ends: after an EOS id, after ``max_new_tokens`` tokens, or after the token whose
    text completes a stop string (checked on the generated text only, never the prompt)."""

    eos_ids: frozenset[int]
    max_new_tokens: int
    strings: tuple[str, ...] = ()
    tokenizer: Any = None

    def extend(self, gen: list[int], new: list[int]) -> tuple[int, Optional[str]]:
        """Append ``new`` to ``gen`` up to and including the first stop. Returns (tokens appended,
        stop reason or None)."""
        start, reason = len(gen), None
        for t in new:
            gen.append(t)
            if t in self.eos_ids:
                reason = "eos"
                break
            if len(gen) >= self.max_new_tokens:
                reason = "length"
                break
        if self.strings:
            end = self._string_end(gen, start)
            if end is not None:
                del gen[end:]
                reason = "stop"
        return len(gen) - start, reason

    def _string_end(self, gen: list[int], start: int) -> Optional[int]:
        """The shortest prefix length > start whose text contains a stop string, or None."""
        hit = lambda ids: any(s in self.tokenizer.decode(ids) for s in self.strings)  # noqa: E731
        if not hit(gen):
            return None
        return next((end for end in range(start + 1, len(gen) + 1) if hit(gen[:end])), None)


__all__ = ["StopRule", "stop_strings"]
