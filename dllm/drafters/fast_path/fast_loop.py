"""The batch-1 chain round of ``speculative_generate`` on a static KV buffer, one host sync per round.

``loop._Run`` is general: a batch with ragged acceptance (a slot-validity mask, per-row holes,
compaction), draft trees, per-row plans. One prompt with a chain plan needs none of it, and at
small shapes the generality is most of a round's cost. ``FastRun`` shares ``_Run``'s host state and
steps (``rounds.RoundState``) with this round instead:

    prefill: StaticTarget.forward(prompt, slot 0)         -> the first token (host sync), taps
    round:   draft = drafter.propose(ctx)                  (K = min(B - 1, tokens left) as _Run)
             logits, taps = StaticTarget.forward([anchor, d_1..d_K], slot = anchor position)
             accepted, next = verify(draft, logits)        (the same verify.py call, same RNG order)
             [accepted, next, d_1..d_K] -> host            (the round's one host sync)
             commit; the drafter's next features = taps[:accepted + 1] (a view, no mask)

No cache crop (``StaticTarget``: rejected slots are overwritten by the next forward), no mask over
cache slots, no per-round tensor built from host lists (the anchor is last round's ``next``, positions
are views of one arange). The target runs transformers' decoder math op for op
(``static_target.py``), so tokens are those of the general loop; ``tests/drafters/fast_path/test_fast_loop.py``
checks tokens and per-round acceptance against it (``speculative_generate(..., fast_path=False)``).

``fast_path_issue`` says when the general loop runs instead: more than one prompt, a draft tree or
a block head, a target ``StaticTarget`` cannot run (``static_target_issue``), or a drafter that
sees no target states yet needs them (none today).
"""

from __future__ import annotations

from typing import Optional

import torch

from dllm.drafters.base import Draft
from dllm.drafters.rounds import RoundState
from dllm.drafters.fast_path.static_target import StaticTarget, static_target_issue
from dllm.drafters.verify import next_tokens, verify


def fast_path_issue(target, rows: int, tree: object, head: object) -> Optional[str]:
    """None when a call can take the batch-1 fast path; else why not."""
    if rows != 1:
        return f"{rows} prompts (the fast path is batch 1)"
    if tree is not None or head is not None:
        return "a draft tree or a block head (the fast path runs a fixed chain)"
    return static_target_issue(target)


class FastRun(RoundState):
    """The round of one prompt with a chain plan on a ``StaticTarget`` (module docstring)."""

    def __init__(self, *args, length: int, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.static = StaticTarget(self.target.model, self.target.taps, length)
        self.steps = torch.arange(length, device=self.device)  # [L]: positions as views
        self.anchor: Optional[torch.Tensor] = None  # [1] the last committed token, on the device

    def prefill(self) -> None:
        prompt = self.tokens[0]
        ids = torch.tensor([prompt], dtype=torch.long, device=self.device)  # [1, Lp]
        logits, hidden = self.static.forward(ids, 0, last_only=True)
        self.target_forwards += 1
        first = next_tokens(logits[:, -1], self.params, self.generator)  # [1]
        self.anchor = first
        if hidden is not None:
            self.pending = (hidden, None, self.steps[None, :len(prompt)])  # type: ignore[assignment]
        self._commit(0, first.tolist())  # host sync: the first token
        self._drop_finished()

    def round(self) -> None:
        k, _ = self._widths()  # one row: no per-row cap
        pos = len(self.tokens[0]) - 1  # the anchor's position = its cache slot
        anchor = self.anchor  # [1]
        anchor_pos = self.steps[pos:pos + 1]  # [1]
        draft = self._draft(anchor, anchor_pos, k, None) if k > 0 else Draft(
            tokens=torch.empty((1, 0), dtype=torch.long, device=self.device), forwards=0)
        ids = torch.cat([anchor[:, None], draft.tokens], dim=1)  # [1, 1+K]
        logits, hidden = self.static.forward(ids, pos)  # [1, 1+K, V]
        self.target_forwards += 1
        self.rounds += 1
        accepted, nxt = verify(draft.tokens, logits, self.params, q=draft.probs, generator=self.generator,
                               lengths=draft.lengths)  # [1], [1]
        back = torch.cat([accepted, nxt, draft.tokens[0]]).tolist()  # the round's host sync
        acc = back[0]
        self.acceptance[0].append(self._commit(0, back[2:2 + acc] + [back[1]]))
        self.anchor = nxt
        if hidden is not None:  # the drafter's next features: the anchor and the accepted drafts
            self.pending = (hidden[:, :acc + 1], None, self.steps[None, pos:pos + acc + 1])  # type: ignore[assignment]
        self._drop_finished()

    def _select(self, keep: list[int]) -> None:
        raise RuntimeError(f"the fast path runs one row; asked to keep rows {keep}")  # never: 1 row stops or not


__all__ = ["FastRun", "fast_path_issue"]
