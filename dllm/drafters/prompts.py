"""Prompts and stops of ``speculative_generate``: the accepted prompt forms -> token-id rows, and
the rule that ends a row (EOS ids, ``max_new_tokens``, stop strings on the generated text)."""

from __future__ import annotations

import operator
from dataclasses import dataclass
from typing import Any, Optional, Sequence, Union

import torch

Prompts = Union[str, Sequence[str], Sequence[Sequence[int]], torch.Tensor]


def encode_prompts(prompts: Prompts, tokenizer, vocab_size: int) -> list[list[int]]:
    """The accepted prompt forms -> one list of token ids per row, each id in [0, vocab_size)."""
    if isinstance(prompts, torch.Tensor):
        if prompts.dim() == 1:
            prompts = prompts[None]
        if prompts.dim() != 2 or prompts.dtype.is_floating_point or prompts.dtype == torch.bool:
            raise ValueError(f"a prompt tensor must be integer token ids [B, Lp] or [Lp], got {prompts.dtype} "
                             f"{list(prompts.shape)}")
        rows = prompts.tolist()
    elif isinstance(prompts, str) or (isinstance(prompts, Sequence) and prompts
                                      and all(isinstance(p, str) for p in prompts)):
        if tokenizer is None:
            raise ValueError("string prompts need a tokenizer: pass tokenizer=..., or token-id lists")
        rows = [list(tokenizer.encode(p)) for p in ([prompts] if isinstance(prompts, str) else prompts)]
    elif isinstance(prompts, Sequence) and prompts and all(isinstance(p, (list, tuple)) for p in prompts):
        rows = [_ids(j, p) for j, p in enumerate(prompts)]
    else:
        raise ValueError(f"prompts must be a non-empty string, list of strings, list of token-id lists or "
                         f"integer tensor, got {type(prompts).__name__} {prompts!r:.80}")
    for j, row in enumerate(rows):
        if not row:
            raise ValueError(f"prompt {j} is empty; every prompt needs at least one token")
        bad = [t for t in row if not 0 <= t < vocab_size]
        if bad:
            raise ValueError(f"prompt {j} has token ids outside the target's vocabulary [0, {vocab_size}): {bad[:5]}")
    return rows


def _ids(j: int, row: Sequence) -> list[int]:
    out = []
    for i, t in enumerate(row):
        try:
            if isinstance(t, bool):
                raise TypeError
            out.append(operator.index(t))
        except TypeError:
            raise ValueError(f"prompt {j}: token ids must be integers, got {t!r} at position {i}") from None
    return out


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


__all__ = ["Prompts", "StopRule", "encode_prompts", "stop_strings"]
