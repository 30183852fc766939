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
up to ``(1 + branches) x L`` forwarded tokens per row and step (L = canvas length). The variant batch
has two shapes (the option ``compact``):

- ``compact=True`` (default): the step reads each row's candidate count on the host (the batch's
  shape depends on them): one sync per step, or with ``reuse`` under the engine's block loop about one
  per block, at its first step: a step that leaves the block a next step for sure (a row with two
  candidates or more) makes that step's anchor from the logits it hands on, and the engine reads its
  counts with its own test of the block's masks (``StepOutput.read_next``, one read for both); after
  a step that may have filled the block the next step reads its own. Rows without remaining masks are left out of the
  variant forward, the variant count is clamped to ``1 + the most candidates of any row`` (a row
  with fewer candidates forwards duplicate canvases that cannot win), and the variant forward is
  skipped when the anchor leaves no mask in any row's block (that step costs 1 NFE; it ends the block,
  which the counts tell the host, so the engine runs no test of the block's masks after it:
  ``StepOutput.fills_block``).
- ``compact=False``: static shapes, nothing read back to the host (a step can be captured in a
  CUDA graph): every row forwards ``min(branches, 1 + W)`` variants whatever its candidates -- a
  row whose block the anchor fills forwards ``B0'`` only, which wins and commits the anchor -- and
  the variant forward runs even when the anchor fills every row's block.
- ``compact="block"``: static shapes, and one host read at a block's first step (in a running
  decode of the serving loop, which has no step index, at every step): when the anchor leaves no
  mask in any row's block there, the variant forward is skipped and the step commits the anchor (the
  block ends, with no test of its masks after: ``StepOutput.fills_block``). Short answers' trailing
  blocks end so; the later steps read nothing.
- ``compact="auto"``: static shapes on CUDA (where a step is bound by launches and syncs), compacted
  elsewhere (where it is bound by the forwarded tokens).

The tokens are the same either way; only NFE and forwarded tokens differ. With ``branches=1`` and
the bonus, every step is two threshold steps, so the output equals ``threshold`` at the same
``tau_conf`` (float32), and with ``compact=True`` so does its NFE.

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
reuse), ``verify_variants`` (True), ``reuse`` (False), ``compact`` (True), ``stats`` (``"torch"``:
the softmaxes above; ``"fused"`` / ``"auto"``: the arg-max, max-prob and entropy from one float32
pass of ``dllm.kernels.triton.stats``, ``dllm.samplers.stats``; with static shapes the steps around
the variant forward are then two Triton launches, ``dllm.kernels.triton.lopa``, and with ``reuse``
the next anchor reads the winner's statistics instead of a second pass; ``"auto"`` takes them on a
device once a probe has run them there, ``dllm.samplers.lopa_probe``). The paper's defaults for
D2F-Dream are 7-14 branches; its branch score variant
``alpha * creation conf + (1 - alpha) * mean of the lowest fraction`` is not implemented (the
scripts' plain mean over the remaining masks is).
"""

from __future__ import annotations

import weakref
from dataclasses import dataclass
from typing import TYPE_CHECKING, Optional, Union

import torch

from dllm.options import check_bool, check_choice, check_int, check_unit
from dllm.samplers._ops import gather_prob, threshold_commit, window_of, window_output
from dllm.samplers._verify import forward_window_variants
from dllm.samplers.base import Sampler, register_sampler
from dllm.samplers.chunked import column_ids
from dllm.samplers.lopa_probe import use_kernels
from dllm.samplers.lopa_proposals import Proposals, _NextAnchor, score_variants, variant_offsets
from dllm.samplers.stats import check_stats, use_fused
from dllm.state import DecodeState, StepInput, StepOutput

if TYPE_CHECKING:
    from dllm.samplers.lopa_buffers import StepBuffers

CONFIDENCE_KINDS = ("negative_entropy", "max_prob")


@dataclass(frozen=True)
class LoPAConfig:
    branches: int = 4  # k: the number of lookahead variants (LoPA's branches), B0' included, >= 1
    tau_conf: float = 0.9  # threshold of the anchor fill and of the bonus, in (0, 1]
    confidence: str = "negative_entropy"  # ranks the variant positions and scores the variants
    bonus: bool = True  # also commit the threshold fills of the winner's own logits
    verify_variants: bool = True  # a variant wins only if B0' still proposes its token (not in the paper)
    reuse: bool = False  # hand the winner's logits to the next step (the paper's loop: 1 forward per step)
    compact: Union[bool, str] = True  # read the candidate counts on the host (one sync per step) to
    #   forward only the rows and variants that can win, and no variant forward when the anchor fills
    #   every block; False: static shapes, no host read; "block": static shapes, no variant forward
    #   when the anchor fills every block at a block's first step (one read there); "auto": False on
    #   CUDA, True elsewhere
    stats: str = "torch"  # torch | fused | auto: where the anchor's and the variants' arg-max and
    #   confidences are computed (dllm.samplers.stats; fused: one pass over the logits, float32)

    def __post_init__(self) -> None:
        check_int("branches", self.branches, 1, hint=" (variant 0 is the anchor itself)")
        check_unit("tau_conf", self.tau_conf, low_open=True)
        check_choice("confidence", self.confidence, CONFIDENCE_KINDS)
        check_bool("bonus", self.bonus)
        check_bool("verify_variants", self.verify_variants)
        check_bool("reuse", self.reuse)
        if self.compact not in ("auto", "block") and not isinstance(self.compact, bool):
            raise ValueError(f'compact must be True, False, "block" (static shapes, one read at a block\'s first '
                             f'step) or "auto" (static shapes on CUDA only), got {self.compact!r}')
        check_stats(self.stats)


def fills_every_block(active: torch.Tensor, anchor: torch.Tensor) -> bool:
    """Whether the anchor [B, W] commits every active mask [B, W] of every row: one host read (an
    intentional sync, ``compact="block"`` only, at a block's first step)."""
    return not bool((active > anchor).any())  # bool: True > False only


@register_sampler("lopa")
class LoPA(Sampler):
    """LoPA: threshold anchor + one-token lookahead variants scored in one batched forward."""

    Config = LoPAConfig
    reads_block_only = True  # the engine computes the block's logits only
    fixed_steps = False
    needs_variants = True
    greedy_only = True

    def __init__(self, config: Optional[LoPAConfig] = None, **options) -> None:
        super().__init__(config, **options)
        # (weak reference to the logits a step handed on or None, their version, the step's StepBuffers):
        #   the fused static path (_fused_lookahead) takes it at every step, reads the last variant
        #   statistics for the anchor when it is given those very logits, not written in place since
        #   (tracked outside inference mode; inside it the engines hand the same object on unwritten, and
        #   a running decode hands a new view), and writes its outputs into the buffers. Held in a list of
        #   at most one: ``list.pop`` hands it to exactly one step, also when threads share this sampler
        self._carried: list[tuple[Optional[weakref.ref], Optional[int], "StepBuffers"]] = []
        # compacted with reuse: the next step's anchor, made by this step from the winner's logits it hands on
        # (``_NextAnchor``); taken by the next step when it is given those very logits
        self._next: list[_NextAnchor] = []

    @property
    def commits_every_step(self) -> bool:
        return True  # every winner holds the anchor, the threshold rule, which keeps each row's best mask

    @property
    def reads_block_masks(self) -> bool:
        return False

    def joins_mid_block(self, width: int, steps: Optional[int]) -> bool:
        return True  # no step index: each row's anchor, variants and winner come from its own logits

    def step(self, inp: StepInput, state: DecodeState) -> StepOutput:
        cfg = self.config
        active = window_of(inp.active, inp.window)  # [B, W] masks of the block
        cur = window_of(inp.tokens, inp.window)  # [B, W]

        # 1. anchor B0' from the step's logits
        logits = window_of(inp.logits, inp.window)  # [B, W, V]
        fused = use_fused(cfg.stats, logits)
        lookahead = cfg.branches > 1 or cfg.bonus or cfg.reuse  # steps 2-5
        compact = cfg.compact is True or (cfg.compact == "auto" and not logits.is_cuda)
        first_read = cfg.compact == "block" and inp.step == 0  # static shapes, one read at the block's first step
        filled = False  # the anchor fills every row's block, read on the host: the step ends the block
        if fused and lookahead and not compact and (cfg.stats == "fused" or use_kernels(logits.device, LoPA)):
            commit, out, nxt, filled = self._fused_lookahead(inp, logits, active, cur, first_read)  # two launches
            #   around the variants
        else:
            made = self._made_anchor(inp, logits, state) if compact else None
            if made is not None:  # the last step made this anchor from these logits
                props, anchor = made.props, made.anchor
            else:
                props, anchor = self._anchor(inp, logits, active, fused)
            x0 = props.tokens  # [B, W]
            base = torch.where(anchor, x0, cur)  # [B, W] the canvas B0'
            commit, out, nxt, goes_on = anchor, base, None, False
            if lookahead and compact:
                commit, out, nxt, goes_on, filled = self._compact_lookahead(inp, props, active, anchor, base, fused,
                                                                            made)
            elif lookahead and first_read and fills_every_block(active, anchor):
                filled = True  # B0' is the step
            elif lookahead:
                commit, out, nxt = self._lookahead(inp, props, active, anchor, base,
                                                   min(cfg.branches - 1, base.shape[1]), fused)
        decision = window_output(inp, commit, out, None)  # no score: the engine's progress rule is skipped
        decision.fills_block = filled
        decision.next_logits = nxt if cfg.reuse else None
        if compact and cfg.reuse and goes_on and inp.reads_next:  # the block has a next step: make its anchor
            decision.read_next = self._make_next_anchor(inp, nxt, active > commit, fused, state)
        decision.active_only = True  # the anchor, the variant positions and the bonus are active masks
        return decision

    def _fused_lookahead(self, inp: StepInput, logits: torch.Tensor, active: torch.Tensor, cur: torch.Tensor,
                         first_read: bool = False
                         ) -> tuple[torch.Tensor, torch.Tensor, Optional[torch.Tensor], bool]:
        """Steps 1-5 with static shapes on the fused statistics: ``vocab_stats`` of the block's logits
        (or, with ``reuse``, when these logits are the last step's winner's, that step's variant
        statistics at the winners' rows, read in place), ``lopa_propose`` (anchor and variants), the
        variant forward, ``vocab_stats`` of the variants, ``lopa_select`` (scores, guard, winner,
        fills, bonus): the same decisions as ``_lookahead`` on the same statistics
        (``dllm.kernels.triton.lopa``); with ``first_read`` (``compact="block"`` at a block's first
        step) no variant forward when the anchor fills every row's block. ``_lookahead``'s returns and
        whether the anchor filled every row's block (read at ``first_read`` only); every output
        but the winner's logits is written
        into the step's ``StepBuffers`` (no allocation), which the next step rewrites: the commit and
        tokens returned are read before it, as the engines do."""
        from dllm.kernels.packed import tensor_version
        from dllm.kernels.triton.lopa import lopa_propose, lopa_select
        from dllm.kernels.triton.stats import vocab_stats
        from dllm.samplers.lopa_buffers import StepBuffers

        cfg = self.config
        (b, w), k = cur.shape, 1 + min(cfg.branches - 1, cur.shape[1])
        key = (b, k, w, cur.device)
        try:  # this step owns the buffers until it hands them on
            carried: Optional[tuple[Optional[weakref.ref], Optional[int], StepBuffers]] = self._carried.pop()
        except IndexError:
            carried = None
        bufs = carried[2] if carried is not None and carried[2].key == key else StepBuffers.make(*key)
        last_idx, last_val, last_win = bufs.last()
        if (carried is not None and carried[0] is not None and carried[0]() is logits
                and carried[1] == tensor_version(logits)):  # those very logits, unwritten since: the winners'
            idx, val, rows = last_idx, last_val, last_win  # rows of the last variant statistics, in place
        else:  # the last statistics are not read: their first rows take the block's [B, W]
            stats = vocab_stats(logits, banned=inp.mask_id, out=bufs.last_heads())
            idx, val, rows = stats.idx, stats.val, None
        variants, at, anchor = lopa_propose(idx, val, active, cur, k - 1, cfg.tau_conf, cfg.confidence, rows,
                                            bufs.propose)  # [B, k, W], [B, k], [B, W]
        if first_read and fills_every_block(active, anchor):  # the block ends here: B0' is the step
            self._carried = [(None, None, bufs)]
            return anchor, variants[:, 0], None, True
        v_logits = forward_window_variants(inp, variants)  # [B * k, W, V]
        next_idx, next_val, next_win = bufs.next()
        v_stats = vocab_stats(v_logits, banned=inp.mask_id, out=(next_idx, next_val))  # [B * k, W]
        commit, out, win = lopa_select(v_stats.idx, v_stats.val, idx, active, variants, at, anchor,
                                       cfg.tau_conf, cfg.confidence, cfg.verify_variants,
                                       cfg.bonus and not cfg.reuse, rows, (*bufs.select, next_win))
        bufs.flip()  # [B, W], [B, W], [B] rows of v_logits
        w_logits = v_logits.index_select(0, win)  # [B, W, V] the winner's
        # with reuse the next step's anchor reads these logits: their statistics are rows win of v_stats
        self._carried = [(weakref.ref(w_logits), tensor_version(w_logits), bufs) if cfg.reuse else (None, None, bufs)]
        return commit, out, w_logits, False

    def _anchor(self, inp: StepInput, logits: torch.Tensor, active: torch.Tensor, fused: bool
                ) -> tuple[Proposals, torch.Tensor]:
        """Step 1: the proposals of ``logits`` [B, W, V] (float64 as Fast-dLLM) and the anchor ``B0'``,
        the threshold rule on the active masks ``active`` [B, W] -> (proposals, anchor [B, W] bool)."""
        props = Proposals(logits, inp.mask_id, fused, torch.float64)
        return props, threshold_commit(props.max_prob, active, self.config.tau_conf)

    def _make_next_anchor(self, inp: StepInput, nxt: torch.Tensor, active_next: torch.Tensor, fused: bool,
                          state: DecodeState) -> torch.Tensor:
        """The next step's anchor (``_anchor``), made now from the winner's logits ``nxt`` [B, W, V] this
        step hands on and the block's masks after its commit ``active_next`` [B, W], which is what the
        next step is given; kept for it. Returns its candidate counts [B], which the engine reads with its
        test of the block's masks (``StepOutput.read_next``): the next step's shape then costs no read of
        its own. Made only where the block surely has a next step, which takes it."""
        from dllm.kernels.packed import tensor_version

        props, anchor = self._anchor(inp, nxt, active_next, fused)
        cand = active_next > anchor  # [B, W]
        counts = cand.sum(dim=1)  # [B]
        self._next = [_NextAnchor(weakref.ref(nxt), tensor_version(nxt), props, anchor, cand, counts, state.released)]
        return counts

    def _made_anchor(self, inp: StepInput, logits: torch.Tensor, state: DecodeState) -> Optional[_NextAnchor]:
        """The anchor the last step made for these very logits (not written in place since, and no row
        released since: a release fills the row's masks), else None."""
        from dllm.kernels.packed import tensor_version

        try:
            made = self._next.pop()
        except IndexError:
            return None
        if (made.logits() is not inp.logits or made.version != tensor_version(logits)
                or made.anchor.shape != inp.active.shape or made.released is not state.released):
            return None
        return made

    def _compact_lookahead(self, inp: StepInput, props: Proposals, active, anchor, base, fused: bool,
                           made: Optional[_NextAnchor] = None
                           ) -> tuple[torch.Tensor, torch.Tensor, Optional[torch.Tensor], bool, bool]:
        """``compact=True``: the lookahead of the rows with masks left after the anchor only, with as
        many variants as the most candidates of a row, none when no row has one. One host read (the
        candidate counts): the variant batch's shape depends on them; none when the last step made this
        anchor and the engine read its counts (``made``). Returns ``_lookahead``'s, whether the block
        has a next step for sure (a row with two candidates or more: the winner fills one) and whether the
        anchor fills every row's block (no candidate in any row: the step ends the block, known on the host);
        the winner's logits are zeros for the rows left out (the next step reads none of them)."""
        if made is not None:
            cand, counts = made.cand, made.counts  # [B, W], [B]
        else:
            cand = active > anchor  # [B, W] masks the anchor leaves (bool: True > False only)
            counts = cand.sum(dim=1)  # [B]
        if made is not None and inp.host_read is not None and len(inp.host_read) == counts.shape[0]:
            host_counts = inp.host_read  # made.counts, read by the engine with its test of the block's masks
        else:
            host_counts = counts.tolist()  # intentional host sync (compact=True only): the batch shape
        n_live, most = sum(c > 0 for c in host_counts), max(host_counts, default=0)
        n_extra = min(self.config.branches - 1, most)
        if n_live == 0 or (n_extra == 0 and not (self.config.bonus or self.config.reuse)):
            return anchor, base, None, False, n_live == 0
        goes_on = most >= 2
        if n_live == base.shape[0]:  # every row, in order: no gather (its layers read the buffers in place)
            return (*self._lookahead(inp, props, active, anchor, base, n_extra, fused, cand=cand), goes_on, False)
        live = (counts == 0).to(torch.int8).argsort(stable=True)[:n_live]  # [N] rows with candidates
        live_host = [r for r, c in enumerate(host_counts) if c > 0]  # the same rows, ascending
        commit_l, out_l, next_l = self._lookahead(inp, props.rows(live), active[live], anchor[live], base[live],
                                                  n_extra, fused, rows=live, host_rows=live_host)
        commit = anchor.index_copy(0, live, commit_l)  # [B, W]
        out = base.index_copy(0, live, out_l)  # [B, W]
        nxt = next_l.new_zeros((base.shape[0], *next_l.shape[1:])).index_copy(0, live, next_l)  # [B, W, V]
        return commit, out, nxt, goes_on, False

    def _lookahead(self, inp: StepInput, props: Proposals, active, anchor, base, n_extra: int, fused: bool,
                   rows: Optional[torch.Tensor] = None, host_rows: Optional[list[int]] = None,
                   cand: Optional[torch.Tensor] = None) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Steps 2-5 for the batch rows ``rows`` [N] (default: every row, N = B), whose tensors are
        given in window coordinates [N, W]; ``n_extra`` (<= W) variant positions per row. Returns
        (commit [N, W] bool, tokens [N, W] long, the winner's logits [N, W, V]). A row with no mask
        left after the anchor has no valid variant but ``B0'``, which scores ``+inf`` and adds
        nothing: it commits the anchor. ``cand``: ``active > anchor`` where the caller has it."""
        cfg = self.config
        n_rows, w = base.shape
        k = 1 + n_extra  # variants per row, variant 0 = B0'
        dev = base.device
        x0 = props.tokens  # [N, W]

        # 2. variant positions: the best k - 1 remaining masks by the confidence kind
        if cand is None:
            cand = active > anchor  # [N, W] active masks the anchor leaves (bool: True > False only)
        rank = torch.where(cand, props.confidence(cfg.confidence), float("-inf"))  # [N, W]
        pos = rank.argsort(dim=1, descending=True, stable=True).narrow(1, 0, n_extra)  # [N, k-1]
        real = torch.gather(cand, 1, pos)  # [N, k-1]; fewer candidates: duplicates of B0', never valid
        # p_j of variant j as a one-hot row; variant 0 and the invalid ones at -1, which matches no column
        at = torch.constant_pad_nd(torch.where(real, pos, -1), (1, 0), -1)  # [N, k] (F.pad's op, no wrapper)
        # (views by method, not by indexing: a Python ``[:, None]`` costs about twice the call)
        extra = at.unsqueeze(2) == column_ids(w, dev)  # [N, k, W]
        variants = torch.where(extra, x0.unsqueeze(1), base.unsqueeze(1))  # [N, k, W] window tokens

        # 3. one batched forward of the N * k variants
        v_flat = forward_window_variants(inp, variants, rows, host_rows)  # [N * k, W, V]
        v_logits = v_flat.reshape(n_rows, k, w, -1)  # [N, k, W, V]

        # 4. score each variant on its own remaining masks (float32 is plenty for a ranking)
        v_props = Proposals(v_logits, inp.mask_id, fused, torch.float32)
        v_tok = v_props.tokens  # [N, k, W]
        score = score_variants(v_props.confidence(cfg.confidence), cand.unsqueeze(1) > extra)  # [N, k] on the
        #   masks left after B0' + p_j
        valid = real
        if cfg.verify_variants and k > 1:
            # variant j's token must still be B0's arg-max at p_j
            valid = real & torch.gather(v_tok.select(1, 0) == x0, 1, pos)  # [N, k-1]
        score = torch.where(torch.constant_pad_nd(valid, (1, 0), True), score, float("-inf"))  # [N, k]
        win = score.argmax(dim=1)  # [N] first maximum: ties go to the lower variant, B0' first

        # 5. commit the winner's fills (+ the threshold fills of its own logits)
        flat = win if n_rows == 1 else win + variant_offsets(n_rows, k, dev)  # [N] rows of the variant batch
        won = extra.view(n_rows * k, w).index_select(0, flat)  # [N, W] the winner's p_j
        commit, out = anchor | won, torch.where(won, x0, base)  # [N, W] its fills and canvas
        w_logits = v_flat.index_select(0, flat)  # [N, W, V] the winner's
        if cfg.bonus and not cfg.reuse:  # with reuse the next step's anchor makes these fills
            w_tok = v_tok.view(n_rows * k, w).index_select(0, flat)  # [N, W]
            if fused:  # the variants' pass has the winner's p(x0) already
                w_conf = v_props.max_prob.reshape(n_rows * k, w).index_select(0, flat)  # [N, W]
            else:
                w_conf = gather_prob(torch.softmax(w_logits, dim=-1, dtype=torch.float64), w_tok)  # float64 as step 1
            more = threshold_commit(w_conf, active & ~commit, cfg.tau_conf)  # [N, W]
            commit = commit | more
            out = torch.where(more, w_tok, out)
        return commit, out, w_logits
