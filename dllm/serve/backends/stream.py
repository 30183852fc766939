"""Final text from a growing final token prefix: stop strings, EOS and the held-back tail.

A request's tokens become final left to right (a diffusion row's committed left prefix, a speculative
row's accepted tokens). ``TextStream.update(prefix)`` turns the final prefix into the text that may be
sent now: the decoded prefix, cut at the first EOS and before the first stop string, minus a tail that
could still grow into a stop string (or an incomplete character), so the deltas never have to be
taken back and their concatenation is exactly the final text.

The answer's tokens (``answer_ids``: a reply's ``usage.completion_tokens``) end before the first EOS
and, when a stop string ends the text, with the token that completes that stop string: the tokens an
autoregressive decoder would have generated before it stopped (as vLLM counts them), not the ones a
diffusion block committed after it. The text is that of those tokens, cut before the earliest stop
string in it (as ``dllm.speculative_generate`` ends a row), so it does not depend on how many tokens
became final at once.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable, Optional, Sequence


def stop_cut(text: str, stops: Sequence[str]) -> Optional[int]:
    """Index of the earliest stop string in ``text`` (None: none occurs)."""
    found = [i for i in (text.find(s) for s in stops if s) if i >= 0]
    return min(found) if found else None


def stop_end(ids: Sequence[int], decode: Callable[[list[int]], str], stops: Sequence[str]) -> int:
    """The fewest leading tokens of ``ids`` whose text holds a stop string (``len(ids)`` when even all
    of them hold none): a binary search, a stop string found in a prefix's text staying in every
    longer prefix's."""
    lo, hi = 0, len(ids)  # the text of ids[:lo] holds no stop string; that of ids[:hi] holds one (or hi = all)
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if stop_cut(decode(list(ids[:mid])), stops) is None:
            lo = mid
        else:
            hi = mid
    return hi


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
    answer_ids: list[int] = field(default_factory=list)  # the answer's final ids (module docstring)

    def update(self, prefix: Sequence[int], complete: bool = False) -> tuple[str, tuple[int, ...]]:
        """The final prefix (``complete``: the whole answer) -> (new text to send, its token ids).
        Sets ``ended`` when the prefix reaches an EOS or a stop string; ``answer_ids`` then ends there
        (at the token that completes the stop string)."""
        ids = list(prefix)
        eos_at = next((i for i, t in enumerate(ids) if t in self.eos_ids), None)
        if eos_at is not None:
            ids, complete, self.ended = ids[:eos_at], True, "eos"
        text = self.decode(ids)
        if stop_cut(text, self.stops) is not None:
            # the text of the tokens up to the one that completes a stop string, cut before the earliest
            # stop string in it: the same answer however many tokens became final at once (one step may
            # commit a stop string that starts early and one that ends earlier: "A B C" and "B" in "A B C")
            ids = ids[:stop_end(ids, self.decode, self.stops)]
            text = self.decode(ids)
            cut = stop_cut(text, self.stops)
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


__all__ = ["TextStream", "held_back", "stop_cut", "stop_end"]
