"""Self-speculative decoding (``ssd``; arXiv 2510.04147): lossless against one-token-per-step
``low_confidence`` with the same blocks.

The reference commits, at every step, the most confident masked position of the block with its
arg-max token. SSD drafts the reference's next ``N`` choices from one forward and checks them in
one batched forward:

1. Draft: from the step's logits, the active masks ranked by the reference's confidence give
   ``(p_1, t_1), ..., (p_N, t_N)``; ``(p_1, t_1)`` IS the reference's choice.
2. Verify: variant k (k = 1..N) is the canvas with drafts 1..k filled. The N variants of every
   row go through ONE forward (``StepInput.forward_variants``: a batch of B*N canvases).
3. Accept: draft k+1 is accepted iff variant k's own reference choice (position AND token) equals
   it; stop at the first mismatch. With ``a`` drafts accepted, variant ``a``'s own choice is the
   reference's next commit as well, and is committed as a bonus.

Each accepted variant reproduces the reference's state after that many steps, so the output equals
``low_confidence`` at one token per step token for token (float32; a tie in confidence is broken
by the same stable rank as the reference). Cost per step: the step's forward plus one batched
verification of B*N canvases (2 NFE, B*(N+1) canvases) for ``a + 1`` tokens, ``1 <= a <= N``.
Greedy only (temperature 0). Under ``prefix``, ``dual`` and ``window`` it stays lossless against
``low_confidence`` with the same cache (variants run the block's cached query on a copy of the
buffers; a mid-block ``refresh`` is refused by the engine). Options: ``draft`` (N, default 4).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from dllm.options import check_int
from dllm.samplers._ops import argmax_excluding, ranks_of, window_of, window_output
from dllm.samplers._verify import forward_window_variants
from dllm.samplers.base import Sampler, register_sampler
from dllm.samplers.chunked import column_ids, constant, max_prob_excluding
from dllm.state import DecodeState, StepInput, StepOutput


@dataclass(frozen=True)
class SSDConfig:
    draft: int = 4  # drafted positions verified per step (N >= 1)

    def __post_init__(self) -> None:
        check_int("draft", self.draft, 1)


def reference_scores(logits: torch.Tensor, active: torch.Tensor, mask_id: int):
    """The reference's choice rule: ``low_confidence`` scores (softmax in the logits dtype at the
    arg-max token), -inf off active positions. logits [R, Q, V], active [R, Q] ->
    (tokens [R, Q], score [R, Q]); its choice is the first position of the largest score. The score at
    the arg-max is the largest probability without the mask id (the rounded softmax is monotone in
    the logits): ``chunked.max_prob_excluding``, one call fewer than a gather."""
    tokens = argmax_excluding(logits, mask_id)  # [R, Q]
    return tokens, torch.where(active, max_prob_excluding(logits, mask_id), float("-inf"))


def reference_ranks(logits: torch.Tensor, active: torch.Tensor, current: torch.Tensor, mask_id: int):
    """The reference's ranking: its choices one per step from these logits. logits [R, Q, V], active,
    current [R, Q] -> (proposal [R, Q]: the arg-max tokens on active positions, ``current``
    elsewhere; rank [R, Q] long: place of each active position in the stable descending score order
    (draft k is the position of rank k), -1 at the positions that are not active)."""
    tokens, score = reference_scores(logits, active, mask_id)
    rank = ranks_of(score.argsort(dim=-1, descending=True, stable=True))  # [R, Q]
    return torch.where(active, tokens, current), torch.where(active, rank, -1)


def draft_ids(n: int, device: torch.device) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Constants per draft count ``n`` (``chunked.constant``): ``arange(n)`` [N] and as a column
    [N, 1], and the rank that variant k's choice must have to accept draft k + 1 [N]: ``k + 1``, -2
    (no rank) for the last variant (its next draft is not drafted)."""
    def make() -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        k = torch.arange(n, device=device)
        return k, k[:, None], torch.where(k < n - 1, k + 1, -2)
    return constant(("ssd drafts", n, device), make)


@register_sampler("ssd")
class SelfSpeculative(Sampler):
    """Self-speculative: drafts verified in one batched forward; identical to low_confidence 1/step."""

    Config = SSDConfig
    reads_block_only = True  # the engine computes the block's logits only
    fixed_steps = False
    needs_variants = True
    greedy_only = True

    @property
    def commits_every_step(self) -> bool:
        return True  # draft 1 (the most confident active mask) is always committed

    def step(self, inp: StepInput, state: DecodeState) -> StepOutput:
        active = window_of(inp.active, inp.window)  # [B, W] everything below is in block-window coordinates
        cur = window_of(inp.tokens, inp.window)  # [B, W]
        bsz, width = active.shape
        n = min(self.config.draft, width)
        k_ids, k_col, next_rank = draft_ids(n, active.device)  # [N], [N, 1], [N]
        proposal, rank = reference_ranks(window_of(inp.logits, inp.window), active, cur, inp.mask_id)  # [B, W] each

        # variant k (k = 0..N-1): drafts 0..k filled (the drafts of rank <= k); its masks are the rest
        variant_active = rank[:, None, :] > k_col  # [B, N, W] (False off active: rank -1)
        variant_tokens = torch.where(variant_active, inp.mask_id, proposal[:, None, :])  # [B, N, W]
        variant_logits = forward_window_variants(inp, variant_tokens)  # [B*N, W, V]
        variant_active = variant_active.reshape(bsz * n, width)  # [B*N, W]
        v_tok, v_score = reference_scores(variant_logits, variant_active, inp.mask_id)  # [B*N, W]
        v_pos = v_score.argmax(dim=1, keepdim=True)  # [B*N, 1] the first best = the reference's choice
        c_tok = v_tok.gather(1, v_pos).reshape(bsz, n)  # [B, N] each variant's own next choice
        c_pos = v_pos.reshape(bsz, n)  # [B, N] (0 in a variant without masks: never rank k + 1)

        # accept draft k+1 iff variant k chose exactly it: its position has rank k + 1, its token is the draft's
        match = (rank.gather(1, c_pos) == next_rank) & (proposal.gather(1, c_pos) == c_tok)  # [B, N]
        last = torch.where(match, n, k_ids).amin(dim=1, keepdim=True)  # [B, 1] a - 1: drafts 0..last accepted
        drafts = rank <= last  # [B, W] (and the positions not active, rank -1: the engine keeps active only)
        # bonus: variant a's own choice (the reference's next commit after the a accepted drafts); in
        # a variant without masks it is position 0, a draft or not active
        bonus = column_ids(width, active.device) == c_pos.gather(1, last)  # [B, W]
        out_tokens = torch.where(drafts, proposal, c_tok.gather(1, last))  # [B, W] read on commits only
        return window_output(inp, drafts | bonus, out_tokens, None)
