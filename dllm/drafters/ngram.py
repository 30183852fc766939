"""``ngram``: prompt-lookup drafting (model-free; a real baseline and the loop's test drafter).

Rule (Saxena's prompt lookup decoding, transformers' ``PromptLookupCandidateGenerator``, vLLM's
``ngram_proposer``): for n = ``max_ngram`` down to ``min_ngram``, find the LATEST earlier occurrence
of the row's last n tokens in its committed sequence (prompt + generated) and propose the K tokens
that followed it. The copy reads its own output when it runs past the end of the sequence, so a
periodic tail (a loop in the output) is continued for all K tokens. No match: nothing is drafted
(``Draft.lengths`` = 0; the round then commits the target's own next token).

Cost: a Python scan of each row's sequence per round (O(length * n)), no forward.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional, Sequence

import torch

from dllm.drafters.base import Draft, DraftContext, Drafter, register_drafter
from dllm.options import check_int


@dataclass(frozen=True)
class NgramConfig:
    max_ngram: int = 3  # longest suffix n-gram looked up first
    min_ngram: int = 1  # shortest n-gram tried before giving up

    def __post_init__(self) -> None:
        check_int("max_ngram", self.max_ngram, 1)
        check_int("min_ngram", self.min_ngram, 1, high=self.max_ngram, hint=" (at most max_ngram)")


def lookup(seq: Sequence[int], k: int, max_ngram: int, min_ngram: int) -> Optional[list[int]]:
    """The K tokens that followed the latest earlier occurrence of ``seq``'s longest matching
    suffix n-gram (n from ``max_ngram`` down to ``min_ngram``), self-extending; None without a match."""
    length = len(seq)
    for n in range(min(max_ngram, length - 1), min_ngram - 1, -1):
        suffix = list(seq[length - n:])
        for i in range(length - n - 1, -1, -1):  # occurrence seq[i:i+n], ending before the suffix ends
            if seq[i] == suffix[0] and list(seq[i:i + n]) == suffix:
                full = list(seq)
                for t in range(k):
                    full.append(full[i + n + t])  # i + n + t < len(full): the copy may read its own output
                return full[length:]
    return None


@register_drafter("ngram", aliases=("prompt_lookup",))
class NgramDrafter(Drafter):
    """Prompt lookup: copy what followed the latest earlier match of the last n-gram (model-free)."""

    Config = NgramConfig
    gives_distributions = False  # copied tokens, no distribution

    def propose(self, ctx: DraftContext) -> Draft:
        k, cfg = ctx.num_draft, self.config
        tokens, lengths = [], []
        for seq in ctx.tokens:
            found = lookup(seq, k, cfg.max_ngram, cfg.min_ngram)
            tokens.append(found if found is not None else [seq[-1]] * k)  # filler, never accepted
            lengths.append(k if found is not None else 0)
        device = ctx.anchor.device
        return Draft(tokens=torch.tensor(tokens, dtype=torch.long, device=device).view(len(tokens), k),
                     lengths=torch.tensor(lengths, dtype=torch.long, device=device), forwards=0)


__all__ = ["NgramConfig", "NgramDrafter", "lookup"]
