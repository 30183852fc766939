"""The per-call host state both round bodies share: ``loop._Run`` (the general loop) and
``fast_loop.FastRun`` (one prompt, a chain): committed tokens, stops, statistics, the drafter call.

Python lists per call row (tokens, stops, statistics); the subclasses keep the tensors of the R rows
still running, in ``active`` order (``_select`` keeps rows ``idx`` of them when some stop).
"""

from __future__ import annotations

from typing import Optional

import torch

from dllm.drafters.base import Draft, DraftContext
from dllm.drafters.plan import RowPlans
from dllm.drafters.stops import StopRule
from dllm.drafters.target import Target
from dllm.drafters.verify import SamplingParams


class RoundState:
    """One call's host-side state and the steps every round body takes (module docstring)."""

    def __init__(self, target: Target, session, rows: list[list[int]], block: int, params: SamplingParams,
                 generator: Optional[torch.Generator], stops: StopRule) -> None:
        self.target, self.session, self.block, self.params = target, session, block, params
        self.generator, self.stops = generator, stops
        self.device = target.device
        self.tokens = [list(r) for r in rows]  # committed ids per call row
        self.generated: list[list[int]] = [[] for _ in rows]
        self.reasons = ["" for _ in rows]
        self.acceptance: list[list[int]] = [[] for _ in rows]
        self.active = list(range(len(rows)))  # call rows still running, in cache-row order
        self.pending: Optional[tuple[torch.Tensor, torch.Tensor, torch.Tensor]] = None  # features since the last draft
        self.target_forwards = self.drafter_forwards = self.rounds = 0
        self.plans = RowPlans(sizes=[block] * len(rows))  # what runs per row (replaced after a head's prefill)
        self.head = None  # a BlockHead: per-row plans (block size, tree or chain), chosen after the prefill
        self.head_trees: dict = {}  # the head's tree specs -> their builders
        self.trim = False  # draft no more than a row can still emit (Drafter.trims_last_block)

    def prefill(self) -> None:
        raise NotImplementedError

    def round(self) -> None:
        raise NotImplementedError

    def _widths(self) -> tuple[int, Optional[list[int]]]:
        """K, the drafts of this round, and per running row the drafts it may accept (None: all K).
        A row drafts its B - 1, or, for a drafter that ``trims_last_block``, min(B - 1, tokens it may
        still emit) (the ``dflash`` package's last-block rule); the round drafts the largest of these."""
        left = [self.stops.max_new_tokens - len(self.generated[j]) if self.trim else self.block
                for j in self.active]
        own = [min(self.plans.sizes[j] - 1, n) for j, n in zip(self.active, left)]
        k = max(own)
        return k, (None if min(own) == k else own)

    def _draft(self, anchor: torch.Tensor, anchor_pos: torch.Tensor, k: int, own: Optional[list[int]]) -> Draft:
        hidden = mask = pos = None
        if self.pending is not None:
            hidden, mask, pos = self.pending
        ctx = DraftContext(
            tokens=[self.tokens[j] for j in self.active],
            rows=torch.tensor(self.active, dtype=torch.long, device=self.device), anchor=anchor,
            anchor_position=anchor_pos, num_draft=k, round=self.rounds, params=self.params,
            generator=self.generator, hidden=hidden, hidden_mask=mask, hidden_positions=pos,
            lengths=None if own is None else torch.tensor(own, dtype=torch.long, device=self.device),
        )
        draft = self.session.propose(ctx)
        _check_draft(draft, len(self.active), k, self.target.info.vocab_size)
        draft.tokens = draft.tokens.to(self.device)  # a drafter on another device: no-op otherwise
        draft.probs = None if draft.probs is None else draft.probs.to(self.device)
        draft.lengths = None if draft.lengths is None else draft.lengths.to(self.device)
        self.drafter_forwards += int(draft.forwards)
        return draft

    def _commit(self, j: int, new: list[int]) -> int:
        emitted, reason = self.stops.extend(self.generated[j], new)
        self.tokens[j].extend(self.generated[j][len(self.generated[j]) - emitted:])
        if reason is not None:
            self.reasons[j] = reason
        return emitted

    def _drop_finished(self) -> None:
        keep = [r for r, j in enumerate(self.active) if not self.reasons[j]]
        if len(keep) == len(self.active):
            return
        self.active = [self.active[r] for r in keep]
        if not keep:
            return
        self._select(keep)

    def _select(self, keep: list[int]) -> None:
        """Keep running rows ``keep`` (indices into ``active`` before the drop) in every tensor."""
        raise NotImplementedError


def _check_draft(draft: Draft, rows: int, k: int, vocab: int) -> None:
    """A drafter's output has the promised shapes (a broken drafter fails here, not in the target)."""
    t = draft.tokens
    if (not isinstance(t, torch.Tensor) or t.dim() != 2 or t.shape[0] != rows or t.shape[1] > k
            or t.dtype != torch.long):
        got = f"{t.dtype} {list(t.shape)}" if isinstance(t, torch.Tensor) else type(t).__name__
        raise ValueError(f"the drafter returned tokens {got}; expected long [{rows}, {k}] (rows, block_size - 1; "
                         f"a draft of dynamic length may be narrower)")
    w = t.shape[1]
    if draft.probs is not None and draft.probs.shape != (rows, w, vocab):
        raise ValueError(f"the drafter returned probs {list(draft.probs.shape)}; expected [{rows}, {w}, {vocab}] "
                         f"(rows, drafted tokens, the target's vocabulary) or None")
    if draft.lengths is not None and draft.lengths.shape != (rows,):
        raise ValueError(f"the drafter returned lengths {list(draft.lengths.shape)}; expected [{rows}] or None")



__all__ = ["RoundState"]
