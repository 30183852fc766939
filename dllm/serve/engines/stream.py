"""Final text from a growing final token prefix: stop strings, EOS and the held-back tail.

A request's tokens become final left to right (a diffusion row's committed left prefix, a speculative
row's accepted tokens). ``TextStream.update(prefix)`` turns the final prefix into the text that may be
sent now: the decoded prefix, cut at the first EOS and before the first stop string, minus a tail that
could still grow into a stop string (or an incomplete character), so the deltas never have to be
taken back and their concatenation is exactly the final text.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable, Optional, Sequence


def stop_cut(text: str, stops: Sequence[str]) -> Optional[int]:
    """Index of the earliest stop string in ``text`` (None: none occurs)."""
    found = [i for i in (text.find(s) for s in stops if s) if i >= 0]
    return min(found) if found else None


def held_back(text: str, stops: Sequence[str]) -> int:
    """Characters at the end of ``text`` not to send yet: the longest tail that is a proper prefix of
    a stop string (it may complete into one), or a trailing replacement character (a multi-byte
    character split across tokens)."""
    hold = 0
    for s in stops:
        for k in range(min(len(s) - 1, len(text)), 0, -1):
            if text.endswith(s[:k]):
                hold = max(hold, k)
                break
    if text.endswith("\ufffd"):
        hold = max(hold, 1)
    return hold


@dataclass
class TextStream:
    """One request's text so far. ``decode(ids)`` is the tokenizer's text of answer ids."""

    decode: Callable[[list[int]], str]
    eos_ids: frozenset[int]
    stops: tuple[str, ...] = ()
    sent: str = ""  # the text sent in deltas so far
    sent_tokens: int = 0  # tokens those deltas came from
    ended: Optional[str] = None  # "eos" or "stop" once the answer's end is final
    text: str = ""  # the final text once ended
    answer_ids: list[int] = field(default_factory=list)  # the answer's final ids (before EOS)

    def update(self, prefix: Sequence[int], complete: bool = False) -> tuple[str, tuple[int, ...]]:
        """The final prefix (``complete``: the whole answer) -> (new text to send, its token ids).
        Sets ``ended`` when the prefix reaches an EOS or a stop string."""
        ids = list(prefix)
        eos_at = next((i for i, t in enumerate(ids) if t in self.eos_ids), None)
        if eos_at is not None:
            ids, complete, self.ended = ids[:eos_at], True, "eos"
        text = self.decode(ids)
        cut = stop_cut(text, self.stops)
        if cut is not None:
            text, complete, self.ended = text[:cut], True, "stop"
        self.answer_ids = ids
        if complete:
            self.text = text
        ready = text if complete else text[:len(text) - held_back(text, self.stops)]
        if not ready.startswith(self.sent) or len(ready) <= len(self.sent):
            return "", ()
        delta = ready[len(self.sent):]
        self.sent = ready
        new_ids = tuple(ids[self.sent_tokens:])
        self.sent_tokens = len(ids)
        return delta, new_ids


__all__ = ["TextStream", "held_back", "stop_cut"]
