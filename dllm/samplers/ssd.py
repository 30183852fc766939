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
from dllm.samplers._ops import argmax_excluding, gather_prob, window_output
from dllm.samplers._verify import forward_window_variants, prefix_fills
from dllm.samplers.base import Sampler, register_sampler
from dllm.state import DecodeState, StepInput, StepOutput


@dataclass(frozen=True)
class SSDConfig:
    draft: int = 4  # drafted positions verified per step (N >= 1)

    def __post_init__(self) -> None:
        check_int("draft", self.draft, 1)


def reference_choice(logits: torch.Tensor, active: torch.Tensor, mask_id: int):
    """The reference's ranking: ``low_confidence`` scores (softmax in the logits dtype at the
    arg-max token), masked to active positions. logits [R, Q, V], active [R, Q] ->
    (tokens [R, Q], order [R, Q] positions by descending score, stable)."""
    tokens = argmax_excluding(logits, mask_id)  # [R, Q]
    score = gather_prob(torch.softmax(logits, dim=-1), tokens).masked_fill(~active, float("-inf"))
    order = score.argsort(dim=-1, descending=True, stable=True)  # [R, Q]
    return tokens, order


@register_sampler("ssd")
class SelfSpeculative(Sampler):
    """Self-speculative: drafts verified in one batched forward; identical to low_confidence 1/step."""

    Config = SSDConfig
    reads_block_only = True  # the engine computes the block's logits only
    fixed_steps = False
    needs_variants = True
    greedy_only = True

    def step(self, inp: StepInput, state: DecodeState) -> StepOutput:
        ws, we = inp.window
        active = inp.active[:, ws:we]  # [B, W] everything below is in block-window coordinates
        cur = inp.tokens[:, ws:we]  # [B, W]
        bsz, width = active.shape
        n = min(self.config.draft, width)
        tokens, order = reference_choice(inp.logits[:, ws:we], active, inp.mask_id)
        d_pos = order[:, :n]  # [B, N] drafted positions, reference order
        d_tok = torch.gather(tokens, 1, d_pos)  # [B, N]
        n_active = active.sum(dim=1)  # [B]
        k_idx = torch.arange(n, device=active.device)  # [N]
        d_valid = k_idx[None, :] < n_active[:, None]  # [B, N] drafts that are real masks

        fill = prefix_fills(d_pos, d_valid, width)  # [B, N, W]: variant k = drafts 0..k filled
        draft_tokens = torch.zeros(bsz, width, dtype=torch.long, device=active.device)  # [B, W]
        draft_tokens.scatter_(1, d_pos, d_tok)
        variant_tokens = torch.where(fill, draft_tokens[:, None, :], cur[:, None, :])  # [B, N, W]
        variant_logits = forward_window_variants(inp, variant_tokens)  # [B*N, W, V]
        variant_active = (active[:, None, :] & ~fill).reshape(bsz * n, width)  # [B*N, W]
        c_tok_all, c_order = reference_choice(variant_logits, variant_active, inp.mask_id)
        c_pos = c_order[:, 0].reshape(bsz, n)  # [B, N] each variant's own next choice
        c_tok = torch.gather(c_tok_all, 1, c_order[:, :1]).reshape(bsz, n)  # [B, N]
        c_valid = variant_active.any(dim=1).reshape(bsz, n)  # [B, N] the variant still has masks

        # accept draft k+1 iff variant k chose exactly it
        match = (c_pos[:, :-1] == d_pos[:, 1:]) & (c_tok[:, :-1] == d_tok[:, 1:]) & d_valid[:, 1:]
        accepted = 1 + match.long().cumprod(dim=1).sum(dim=1)  # [B] a in 1..N
        accepted = torch.minimum(accepted, n_active.clamp_min(1))
        take = (k_idx[None, :] < accepted[:, None]) & d_valid  # [B, N]
        commit = torch.zeros_like(active)
        commit.scatter_(1, d_pos, take)
        # bonus: variant a's own choice (the reference's next commit after the a accepted drafts)
        last = (accepted - 1).clamp_min(0)[:, None]  # [B, 1]
        b_pos = torch.gather(c_pos, 1, last)  # [B, 1]
        b_tok = torch.gather(c_tok, 1, last)
        b_ok = torch.gather(c_valid, 1, last) & (n_active[:, None] > 0)
        out_tokens = torch.where(commit, draft_tokens, cur)
        bonus = torch.zeros_like(active)
        bonus.scatter_(1, b_pos, b_ok)
        out_tokens = torch.where(bonus, b_tok.expand_as(out_tokens), out_tokens)
        commit = (commit | bonus) & active
        # progress fallback never needed: a >= 1 whenever masks remain
        return window_output(inp, commit, out_tokens, commit.float())
