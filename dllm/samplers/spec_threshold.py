"""Speculative threshold (``spec_threshold``): Fast-dLLM's ``threshold`` rule, lossless, with fewer
forwards. Our design: SSD's draft-and-verify (``ssd``, arXiv 2510.04147) applied to ``threshold`` as
the reference.

The reference (``threshold``, tau = 0.9, greedy) commits at state S the set C(S) = every active mask
with float64 confidence >= tau, plus the most confident one, with arg-max tokens. One step here:

1. From the step's logits: C0 = C(S) exactly (the reference's first step) and S1 = S + C0.
2. Draft: the remaining masks ranked by the SAME logits' confidence, d_1 .. d_{N-1}, each guessed
   to be the reference's next single commit (with its current arg-max token).
3. Verify in ONE batched forward (``StepInput.forward_variants``): variant k = S1 + d_1 .. d_k,
   k = 0 .. N-1. Variant k's own rule C(variant k) is exact whenever variant k is a reference
   state; draft d_{k+1} is accepted iff C(variant k) = {d_{k+1}} with the same token.
4. Commit C0, the ``a`` accepted drafts and C(variant a) (the reference's next set after them).

Every accepted variant is the reference's state after that many steps, so the output equals
``threshold`` token for token (float32, temperature 0; ties in confidence go to the lowest
position, as in ``threshold``), also under the caches ``prefix``, ``dual`` and ``window`` against
``threshold`` with the same cache: a variant's forward is the block's cached query on a copy of the
buffers, which is exactly the later step it stands for (``CachePolicy.variant_refusal``; a
mid-block ``refresh`` is refused). Per step: 2 NFE (the verification is skipped when no row has
masks left after C0) for at least two reference steps, plus one per accepted draft. Options:
``threshold`` (0.9), ``draft`` (N, 4). Not a published method.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from dllm.options import check_int, check_unit
from dllm.samplers._ops import argmax_excluding, gather_prob, threshold_commit, window_output
from dllm.samplers._verify import forward_window_variants, prefix_fills
from dllm.samplers.base import Sampler, register_sampler
from dllm.state import DecodeState, StepInput, StepOutput


@dataclass(frozen=True)
class SpecThresholdConfig:
    threshold: float = 0.9  # the reference threshold rule's tau, in (0, 1]
    draft: int = 4  # verification variants per step (N >= 1): C0 plus up to N - 1 drafted commits

    def __post_init__(self) -> None:
        check_unit("threshold", self.threshold, low_open=True)
        check_int("draft", self.draft, 1)


def threshold_rule(logits: torch.Tensor, active: torch.Tensor, tau: float, mask_id: int):
    """The reference's decision at one state. logits [R, Q, V], active [R, Q] ->
    (tokens [R, Q], confidence [R, Q] float64 (-inf off active), commit [R, Q] bool)."""
    tokens = argmax_excluding(logits, mask_id)  # [R, Q]
    conf = gather_prob(torch.softmax(logits, dim=-1, dtype=torch.float64), tokens)  # [R, Q]
    conf = conf.masked_fill(~active, float("-inf"))
    return tokens, conf, threshold_commit(conf, active, tau)


@register_sampler("spec_threshold",
                  description="threshold (0.9), lossless, with drafts verified in one batched forward")
class SpecThreshold(Sampler):
    """Speculative threshold: identical tokens to ``threshold`` with fewer forwards per token."""

    Config = SpecThresholdConfig
    reads_block_only = True  # the engine computes the block's logits only
    fixed_steps = False
    needs_variants = True
    greedy_only = True

    def step(self, inp: StepInput, state: DecodeState) -> StepOutput:
        tau = self.config.threshold
        ws, we = inp.window
        active = inp.active[:, ws:we]  # [B, W] everything below is in block-window coordinates
        bsz, width = active.shape
        tokens0, conf0, c0 = threshold_rule(inp.logits[:, ws:we], active, tau, inp.mask_id)
        out_tokens = torch.where(c0, tokens0, inp.tokens[:, ws:we])  # S1 on the committed positions
        remaining = active & ~c0  # [B, W]
        n = min(self.config.draft, width)
        if not bool(remaining.any()):  # one host sync: nothing left to verify in any row
            return window_output(inp, c0, out_tokens, conf0)
        order = conf0.masked_fill(~remaining, float("-inf")).argsort(dim=1, descending=True, stable=True)
        d_pos = order[:, : max(n - 1, 0)]  # [B, N-1] drafted positions, in confidence order
        n_rem = remaining.sum(dim=1)  # [B]
        k_idx = torch.arange(n, device=active.device)  # [N]
        d_valid = k_idx[None, : n - 1] < n_rem[:, None]  # [B, N-1]
        none = torch.zeros(bsz, 1, width, dtype=torch.bool, device=active.device)
        fill = torch.cat([none, prefix_fills(d_pos, d_valid, width)], dim=1)  # [B, N, W] variant k: d_1..d_k
        variant_tokens = torch.where(fill, tokens0[:, None, :], out_tokens[:, None, :])  # [B, N, W]
        variant_logits = forward_window_variants(inp, variant_tokens)  # [B*N, W, V]
        variant_active = (remaining[:, None, :] & ~fill).reshape(bsz * n, width)  # [B*N, W]
        c_tok, _, c_set = threshold_rule(variant_logits, variant_active, tau, inp.mask_id)
        c_tok, c_set = c_tok.reshape(bsz, n, width), c_set.reshape(bsz, n, width)  # [B, N, W]
        if n > 1:  # draft k+1 accepted iff variant k's own set is exactly {d_{k+1}} with the same token
            single = c_set[:, :-1].sum(dim=2) == 1  # [B, N-1]
            at_d = torch.gather(c_set[:, :-1], 2, d_pos[:, :, None]).squeeze(2)
            tok_d = torch.gather(c_tok[:, :-1], 2, d_pos[:, :, None]).squeeze(2)
            same = tok_d == torch.gather(tokens0, 1, d_pos)
            match = single & at_d & same & d_valid  # [B, N-1]
            accepted = match.long().cumprod(dim=1).sum(dim=1)  # [B] a in 0..N-1
        else:
            accepted = torch.zeros(bsz, dtype=torch.long, device=active.device)
        drafts = torch.gather(fill, 1, accepted[:, None, None].expand(bsz, 1, width)).squeeze(1)  # [B, W]
        final = torch.gather(c_set, 1, accepted[:, None, None].expand(bsz, 1, width)).squeeze(1)
        final_tok = torch.gather(c_tok, 1, accepted[:, None, None].expand(bsz, 1, width)).squeeze(1)
        out_tokens = torch.where(drafts, tokens0, out_tokens)
        out_tokens = torch.where(final, final_tok, out_tokens)
        commit = (c0 | drafts | final) & active
        return window_output(inp, commit, out_tokens, conf0)
