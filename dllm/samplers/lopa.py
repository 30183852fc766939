"""LoPA, lookahead parallel decoding (``lopa``; zhijie-group/LoPA, arXiv 2512.16229).

The paper runs on D2F models (block-causal attention between blocks, several semi-active blocks
with their own thresholds). Our adaptation is for plain full-attention masked diffusion LMs and
the engine's one-block-at-a-time loop: the active window is the current block, every forward sees
the whole canvas (or, under a cache, the block's cached query), and the D2F fill rule becomes the
Fast-dLLM threshold rule of a fully active block. The paper calls its lookahead canvases
*branches*; here they are *variants* (``dllm.samplers._verify``), and the option ``branches`` keeps
the paper's name. Per engine step, from the step's logits:

1. Anchor ``B0'``: the threshold rule on the block's active masks: every mask whose max-prob
   confidence (float64 softmax, as Fast-dLLM) is ``>= tau_conf``, and always the most confident
   one. Proposals are arg-max tokens (the mask id excluded).
2. Variants: among the active masks NOT in ``B0'``, the top ``branches - 1`` by the ``confidence``
   kind (as the released scripts rank their branch positions); variant ``j`` = ``B0'`` plus
   position ``p_j`` filled with its arg-max. ``B0'`` itself is variant 0 and competes too.
3. ONE batched forward of every variant (``StepInput.forward_variants``).
4. Score: each variant's mean ``confidence`` over ITS remaining active masks, read from its own
   logits (float32); a variant with no remaining mask finished the block and scores ``+inf``.
   Winner = arg-max score per row; ties go to the lower variant index, so to ``B0'`` first.
5. Commit the winner's fills. Bonus (``bonus=True``): also the threshold rule of step 1 applied to
   the winner's own logits on its remaining masks (``>= tau_conf`` and its top-1). These are
   exactly the fills the next step would make if it forwarded the winner's canvas (the paper
   reuses the winner's logits as the next iteration's logits), so they cost no forward.

Guard (``verify_variants=True``, our addition, not in the paper): a variant ``j >= 1`` may win
only if its token at ``p_j`` is also the arg-max at ``p_j`` in variant 0's logits (``B0'``
forwarded), i.e. what a decoder that had committed ``B0'`` would propose there. Without it, a
variant that fills the block's last mask scores ``+inf`` with no evidence at all, so two tied
positions (Shuffle's last pair) are committed with the same item; ``verify_variants=False`` is the
paper's selection. The guard reads logits the step already has: it costs nothing.

Cost, stated honestly: 2 NFE per step (the step's forward plus one batched variant forward), and
up to ``(1 + branches) x L`` forwarded tokens per row and step (L = canvas length). The variant
forward is skipped when the anchor leaves no mask in any row's block (that step costs 1 NFE), rows
without remaining masks are left out of it, and the variant count is clamped to ``1 + the most
candidates of any row`` (a row with fewer candidates forwards duplicate canvases that cannot win).
Reading those counts is one intentional host sync per step (the variant batch size depends on
them). With ``branches=1`` and the bonus, every step is two threshold steps, so the output equals
``threshold`` at the same ``tau_conf`` (float32).

Reuse (``reuse=True``, the paper's own loop): the winner's logits ARE the forward of the canvas
the step commits (a variant's forward reproduces the later step it stands for, under a cache too:
``CachePolicy.variant_refusal``), so the step commits the winner's fills only and hands its logits
to the next step (``StepOutput.next_logits``), which then runs no forward of its own; its anchor
is the bonus above, made from the same logits. Every step after the first of a block then costs
one NFE (the variant batch) instead of two. Not token for token equal to ``reuse=False``: the next
variants are ranked on the winner's logits, not on a fresh forward of winner + bonus.

Greedy only (temperature 0), enforced by the engine; under a cache each variant runs the block's
cached query on its own copy of the buffers (a mid-block ``refresh`` is refused). Options:
``branches`` (k, default 4), ``tau_conf`` (0.9), ``confidence`` (``"negative_entropy"``, Dream's
``sum p log p``, as the released scripts; or ``"max_prob"``), ``bonus`` (True; no effect with
reuse), ``verify_variants`` (True), ``reuse`` (False). The paper's defaults for D2F-Dream are 7-14 branches; its branch score variant
``alpha * creation conf + (1 - alpha) * mean of the lowest fraction`` is not implemented (the
scripts' plain mean over the remaining masks is).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from dllm.options import check_bool, check_choice, check_int, check_unit
from dllm.samplers._ops import (argmax_excluding, gather_prob, negative_entropy, threshold_commit,
                                window_output)
from dllm.samplers._verify import forward_window_variants
from dllm.samplers.base import Sampler, register_sampler
from dllm.state import DecodeState, StepInput, StepOutput

CONFIDENCE_KINDS = ("negative_entropy", "max_prob")


@dataclass(frozen=True)
class LoPAConfig:
    branches: int = 4  # k: the number of lookahead variants (LoPA's branches), B0' included, >= 1
    tau_conf: float = 0.9  # threshold of the anchor fill and of the bonus, in (0, 1]
    confidence: str = "negative_entropy"  # ranks the variant positions and scores the variants
    bonus: bool = True  # also commit the threshold fills of the winner's own logits
    verify_variants: bool = True  # a variant wins only if B0' still proposes its token (not in the paper)
    reuse: bool = False  # hand the winner's logits to the next step (the paper's loop: 1 forward per step)

    def __post_init__(self) -> None:
        check_int("branches", self.branches, 1, hint=" (variant 0 is the anchor itself)")
        check_unit("tau_conf", self.tau_conf, low_open=True)
        check_choice("confidence", self.confidence, CONFIDENCE_KINDS)
        check_bool("bonus", self.bonus)
        check_bool("verify_variants", self.verify_variants)
        check_bool("reuse", self.reuse)


def confidence_of(probs: torch.Tensor, tokens: torch.Tensor, kind: str) -> torch.Tensor:
    """Per-position confidence (larger = more certain). probs [..., V], tokens [...] -> [...]."""
    if kind == "max_prob":
        return gather_prob(probs, tokens)
    return negative_entropy(probs)


def score_variants(conf: torch.Tensor, remaining: torch.Tensor) -> torch.Tensor:
    """Mean confidence over each variant's remaining masks; ``+inf`` where none remain.
    conf [..., W] float, remaining [..., W] bool -> [...] float."""
    count = remaining.sum(dim=-1)
    total = torch.where(remaining, conf, torch.zeros_like(conf)).sum(dim=-1)
    return torch.where(count > 0, total / count.clamp_min(1), torch.full_like(total, float("inf")))


@register_sampler("lopa")
class LoPA(Sampler):
    """LoPA: threshold anchor + one-token lookahead variants scored in one batched forward."""

    Config = LoPAConfig
    reads_block_only = True  # the engine computes the block's logits only
    fixed_steps = False
    needs_variants = True
    greedy_only = True

    def step(self, inp: StepInput, state: DecodeState) -> StepOutput:
        cfg = self.config
        ws, we = inp.window
        active = inp.active[:, ws:we]  # [B, W] masks of the block
        cur = inp.tokens[:, ws:we]  # [B, W]

        # 1. anchor B0' from the step's logits
        logits = inp.logits[:, ws:we]  # [B, W, V]
        probs = torch.softmax(logits.to(torch.float64), dim=-1)  # float64 as Fast-dLLM
        x0 = argmax_excluding(logits, inp.mask_id)  # [B, W]
        conf = gather_prob(probs, x0)  # [B, W] max-prob confidence
        anchor = threshold_commit(conf, active, cfg.tau_conf)  # [B, W]
        base = torch.where(anchor, x0, cur)  # [B, W] the canvas B0'
        commit, out, nxt = anchor, base, None

        # 2. variant positions: the best k - 1 remaining masks by the confidence kind
        cand = active & ~anchor  # [B, W]
        # intentional host sync: the variant batch (rows, variant count) depends on these counts
        counts = cand.sum(dim=1).tolist()
        n_extra = min(cfg.branches - 1, max(counts, default=0))
        if max(counts, default=0) > 0 and (n_extra > 0 or cfg.bonus or cfg.reuse):
            live = torch.tensor([i for i, c in enumerate(counts) if c > 0], device=cur.device)  # [N]
            commit_l, out_l, next_l = self._lookahead(inp, live, x0, probs, active, cand, anchor, base, n_extra)
            commit = commit.index_copy(0, live, commit_l)
            out = out.index_copy(0, live, out_l)
            if cfg.reuse:  # rows without masks left keep zeros: the next step reads none of them
                nxt = logits.new_zeros(logits.shape).index_copy(0, live, next_l)  # [B, W, V]
        decision = window_output(inp, commit, out, conf.masked_fill(~active, float("-inf")))
        decision.next_logits = nxt
        return decision

    def _lookahead(self, inp: StepInput, live: torch.Tensor, x0, probs, active, cand, anchor, base,
                   n_extra: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Steps 2-5 for the rows ``live`` [N] that still have masks after the anchor. Returns
        (commit [N, W] bool, tokens [N, W] long, the winner's logits [N, W, V]) in window coordinates."""
        cfg = self.config
        x0, probs, active, cand, anchor, base = (t[live] for t in (x0, probs, active, cand, anchor, base))
        n_rows, w = base.shape
        k = 1 + n_extra  # variants per row, variant 0 = B0'
        dev = base.device

        rank = confidence_of(probs, x0, cfg.confidence).masked_fill(~cand, float("-inf"))  # [N, W]
        pos = rank.argsort(dim=1, descending=True, stable=True)[:, :n_extra]  # [N, k-1]
        valid = torch.ones(n_rows, k, dtype=torch.bool, device=dev)  # [N, k]
        valid[:, 1:] = torch.gather(cand, 1, pos)  # fewer candidates: duplicate variants, masked out
        extra = torch.zeros(n_rows, k, w, dtype=torch.bool, device=dev)  # [N, k, W] p_j of variant j
        extra[:, 1:].scatter_(2, pos[:, :, None], valid[:, 1:, None])
        fill = anchor[:, None, :] | extra  # [N, k, W]
        variants = torch.where(extra, x0[:, None, :], base[:, None, :])  # [N, k, W] window tokens

        # 3. one batched forward of the N * k variants
        v_logits = forward_window_variants(inp, variants, live).reshape(n_rows, k, w, -1)  # [N, k, W, V]

        # 4. score each variant on its own remaining masks (float32 is plenty for a ranking)
        v_tok = argmax_excluding(v_logits, inp.mask_id)  # [N, k, W]
        v_conf = confidence_of(torch.softmax(v_logits.float(), dim=-1), v_tok, cfg.confidence)  # [N, k, W]
        remaining = active[:, None, :] & ~fill  # [N, k, W]
        score = score_variants(v_conf, remaining)  # [N, k]
        if cfg.verify_variants and k > 1:
            # variant j's token must still be B0's arg-max at p_j
            b0_tok = torch.gather(v_tok[:, 0], 1, pos)  # [N, k-1]
            valid[:, 1:] &= b0_tok == torch.gather(x0, 1, pos)
        score = score.masked_fill(~valid, float("-inf"))
        win = score.argmax(dim=1)  # [N] first maximum: ties go to the lower variant, B0' first

        # 5. commit the winner's fills (+ the threshold fills of its own logits)
        sel = torch.arange(n_rows, device=dev)
        commit, out = fill[sel, win], variants[sel, win]  # [N, W]
        w_logits = v_logits[sel, win]  # [N, W, V] the winner's
        if cfg.bonus and not cfg.reuse:  # with reuse the next step's anchor makes these fills
            w_tok = v_tok[sel, win]  # [N, W]
            w_probs = torch.softmax(w_logits.to(torch.float64), dim=-1)  # float64 as step 1
            w_conf = gather_prob(w_probs, w_tok)  # [N, W]
            more = threshold_commit(w_conf, active & ~commit, cfg.tau_conf)  # [N, W]
            commit = commit | more
            out = torch.where(more, w_tok, out)
        return commit, out, w_logits
