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
from dllm.samplers._ops import ranks_of, window_of, window_output
from dllm.samplers._verify import forward_window_variants
from dllm.samplers.base import Sampler, register_sampler
from dllm.samplers.chunked import column_ids, constant, greedy_with_prob, neg_inf
from dllm.state import DecodeState, StepInput, StepOutput


@dataclass(frozen=True)
class SpecThresholdConfig:
    threshold: float = 0.9  # the reference threshold rule's tau, in (0, 1]
    draft: int = 4  # verification variants per step (N >= 1): C0 plus up to N - 1 drafted commits

    def __post_init__(self) -> None:
        check_unit("threshold", self.threshold, low_open=True)
        check_int("draft", self.draft, 1)


def confidence(logits: torch.Tensor, active: torch.Tensor, mask_id: int):
    """The reference's proposals and scores. logits [R, Q, V], active [R, Q] ->
    (tokens [R, Q] arg-max, confidence [R, Q] float64 softmax at them, -inf off active): both from
    one float64 softmax (``chunked.greedy_with_prob``: the largest probability without the mask id
    and where it stands, three calls instead of five)."""
    tokens, conf = greedy_with_prob(logits, mask_id)  # [R, Q], [R, Q] float64
    return tokens, torch.where(active, conf, neg_inf(conf.device))


def threshold_keys(conf: torch.Tensor, tokens: torch.Tensor, tau: float) -> torch.Tensor:
    """The reference's decision C(S) at one state (``threshold``: every position with ``conf >= tau``
    and the most confident one, the lowest position among ties) with its tokens, as one map:
    conf [R, Q] float64 (-inf off active), tokens [R, Q] -> [R, Q] long, the token on C(S), -1 off
    it (a state without active masks gets position 0: the caller never takes it)."""
    best = conf.argmax(dim=-1, keepdim=True)  # [R, 1]
    return torch.where((conf >= tau).scatter(-1, best, True), tokens, -1)


def step_ids(n: int, width: int, device: torch.device) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Constants per (N, W) (``chunked.constant``): ``arange(N)`` [N] and as a column [N, 1], and
    the draft rank that variant k's decision must be, ``k`` [N, 1] (``W + 1``, no rank, for the
    last variant: its next draft is not drafted)."""
    def make() -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        k = torch.arange(n, device=device)
        return k, k[:, None], torch.where(k < n - 1, k, width + 1)[:, None]
    return constant(("spec_threshold steps", n, width, device), make)


@register_sampler("spec_threshold",
                  description="threshold (0.9), lossless, with drafts verified in one batched forward")
class SpecThreshold(Sampler):
    """Speculative threshold: identical tokens to ``threshold`` with fewer forwards per token."""

    Config = SpecThresholdConfig
    reads_block_only = True  # the engine computes the block's logits only
    fixed_steps = False
    needs_variants = True
    greedy_only = True

    @property
    def commits_every_step(self) -> bool:
        return True  # C0 holds the most confident active mask

    def step(self, inp: StepInput, state: DecodeState) -> StepOutput:
        tau = self.config.threshold
        active = window_of(inp.active, inp.window)  # [B, W] everything below is in block-window coordinates
        cur = window_of(inp.tokens, inp.window)  # [B, W]
        bsz, width = active.shape
        n = min(self.config.draft, width)
        k_ids, k_col, next_draft = step_ids(n, width, active.device)  # [N], [N, 1], [N, 1]
        tokens0, conf0 = confidence(window_of(inp.logits, inp.window), active, inp.mask_id)  # [B, W] each
        # C0 is the first max(#(conf >= tau), 1) positions of the stable confidence order; the drafts
        # d_1, d_2, ... follow in that order. rank: C0 in [-W, 0), draft d_{j+1} j, -W - 1 off active
        rank = ranks_of(conf0.argsort(dim=1, descending=True, stable=True))  # [B, W]
        c0_size = (conf0 >= tau).sum(dim=1, keepdim=True).clamp_min(1)  # [B, 1]
        rank = torch.where(active, rank - c0_size, -1 - width)  # [B, W]
        rank3 = rank[:, None, :]  # [B, 1, W]
        # variant k = S1 + d_1 .. d_k: its masks are the drafts after d_k
        variant_active = rank3 >= k_col  # [B, N, W]
        if not bool(variant_active.any()):  # one host sync: nothing left to verify in any row
            # C0 (and the positions not active, rank < -W: the engine keeps active only), which holds every
            # active mask: the block ends here, known on the host (the engine then runs no test of it)
            out = window_output(inp, rank < 0, tokens0, conf0)
            out.fills_block = True
            return out
        proposal = torch.where(active, tokens0, cur)[:, None, :]  # [B, 1, W] the arg-max tokens on the masks
        variant_tokens = torch.where(variant_active, inp.mask_id, proposal)  # [B, N, W]
        variant_logits = forward_window_variants(inp, variant_tokens)  # [B*N, W, V]
        v_tokens, v_conf = confidence(variant_logits, variant_active.reshape(bsz * n, width), inp.mask_id)  # [B*N, W]
        keys = threshold_keys(v_conf, v_tokens, tau).reshape(bsz, n, width)  # [B, N, W]: C(variant k), its tokens
        # draft d_{k+1} accepted iff C(variant k) is exactly {d_{k+1}} with its token
        match = (keys == torch.where(rank3 == next_draft, proposal, -1)).all(dim=2)  # [B, N]
        accepted = torch.where(match, n, k_ids).amin(dim=1)  # [B] a in 0..N-1: the first mismatch
        final = keys[column_ids(bsz, active.device), accepted]  # [B, W] C(variant a): the next set
        drafts = rank < accepted[:, None]  # [B, W] C0 and d_1 .. d_a (and positions not active)
        # a variant without masks gives position 0, then a draft or not active (the engine keeps active only)
        out_tokens = torch.where(drafts, tokens0, final)  # [B, W] read on commits only
        return window_output(inp, drafts | (final >= 0), out_tokens, conf0)
