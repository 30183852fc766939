"""What ``speculative_generate`` returns: the tokens, the texts and the acceptance statistics."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

import torch


@dataclass
class SpeculativeOutput:
    """Result of ``speculative_generate``.

    Counting conventions (as DFlash reports them): a *round* is one verification forward of the
    target; per row it commits ``accepted + 1`` tokens (the bonus / recovered token included), cut
    at the row's stop. ``tau`` is the mean of those per-round commits over every (row, round), so
    the prefill forward, which commits the first token, is not a round.
    """

    sequences: torch.Tensor  # [B, Lp + G] long: left-padded prompts, generated tokens, pad after a stop
    prompt_length: int  # Lp, the padded prompt width
    generated: list[list[int]]  # per row, the generated ids (a stop token included, nothing after it)
    texts: Optional[list[str]]  # per row, the generated text (special tokens skipped), with a tokenizer
    stop_reasons: list[str]  # per row: "eos" | "stop" (a stop string) | "length" (max_new_tokens)
    acceptance: list[list[int]]  # per row, per round: tokens committed (1 .. block_size)
    block_size: int  # B (K = B - 1 drafts per round); with plan="auto" the largest of the head's sizes;
    #   a row's last rounds draft fewer when fewer tokens are left (the dflash package's rule)
    target_forwards: int  # batched target forwards, the prefill included
    drafter_forwards: int  # drafter forwards (as the drafter counts them; 0 for model-free drafters)
    rounds: int  # verification rounds (= target_forwards - 1)
    wall_time: float  # seconds, prompt encoding to the last token
    row_block_sizes: Optional[list[int]] = None  # with a block head (plan="auto"): per row, the block size
    #   that ran (its pick in chain rounds; the largest picked in tree rounds); None without a head
    row_trees: Optional[list[Optional[str]]] = None  # with a block head: per row, the tree that ran (None: the
    #   chain); the rows of one call share one, the one most rows picked, so a row's own pick may differ

    @property
    def generated_tokens(self) -> int:
        return sum(len(g) for g in self.generated)

    @property
    def tau(self) -> float:
        """Mean tokens committed per row per verification forward, the bonus included (in [1, B])."""
        lengths = [n for row in self.acceptance for n in row]
        return sum(lengths) / len(lengths) if lengths else 0.0

    @property
    def tokens_per_second(self) -> float:
        return self.generated_tokens / self.wall_time if self.wall_time > 0 else float("inf")

    def acceptance_by_position(self) -> list[float]:
        """Entry k - 1 (k = 1..K): the fraction of rounds whose k-th draft was accepted, i.e. that
        committed more than k tokens. A round cut by a stop counts what it committed."""
        lengths = [n for row in self.acceptance for n in row]
        if not lengths:
            return [0.0] * (self.block_size - 1)
        return [sum(n > k for n in lengths) / len(lengths) for k in range(1, self.block_size)]

    def summary(self) -> dict[str, float]:
        return {
            "block_size": self.block_size,
            "tau": round(self.tau, 4),
            "rounds": self.rounds,
            "target_forwards": self.target_forwards,
            "drafter_forwards": self.drafter_forwards,
            "generated_tokens": self.generated_tokens,
            "tokens_per_second": round(self.tokens_per_second, 2),
            "wall_time_s": round(self.wall_time, 4),
        }


def pack_sequences(prompts: list[list[int]], generated: list[list[int]], pad_id: int) -> tuple[torch.Tensor, int]:
    """[B, Lp + G] long as ``transformers``' ``generate`` lays a batch out: prompts left-padded to
    the longest, generated ids after them, ``pad_id`` after each row's end. Returns (ids, Lp)."""
    lp = max(len(p) for p in prompts)
    g = max((len(x) for x in generated), default=0)
    rows = [[pad_id] * (lp - len(p)) + list(p) + list(x) + [pad_id] * (g - len(x))
            for p, x in zip(prompts, generated)]  # one tensor from lists: no per-row tensor calls
    return torch.tensor(rows, dtype=torch.long).view(len(rows), lp + g), lp


__all__ = ["SpeculativeOutput", "pack_sequences"]
