"""Prophet, early-commit "all-in" decoding (``prophet``; pixeli99/Prophet ``generate_earlyexit.py``,
arXiv 2508.19982).

Rule, at every step of a row:

1. Gap: ``g = mean over the monitored positions of l(1) - l(2)``, the gap between the two largest
   RAW logits (float32).
2. Progress ``p`` and threshold ``tau(p)``: 7.5 if p < 0.33, 5.0 if p < 0.67, else 2.5.
3. If ``g >= tau(p)`` the row goes all in: every remaining mask of the whole canvas (all blocks)
   is filled with its current proposal, and the row takes no further decisions.
   Otherwise it takes a normal step of the base sampler.

Defaults: early_threshold 7.5, mid_threshold 5.0, late_threshold 2.5 (``eval_llada.py``); span
None (monitor every remaining mask).

Decisions:
- Base sampler: LLaDA low-confidence, ONE token per step, run as an adaptive sampler that commits
  its top-1 (``low_confidence`` with ``steps = gen_length``, the released setting: gen 256, steps
  256, block 32). Adaptive rather than fixed-step because after the all-in commit a fixed-step
  block would keep running its budgeted, now empty, steps. With thresholds that never fire
  (``inf``) the output equals ``low_confidence`` with ``steps = gen_length``, at T = 0 and, under
  the same seed, at T > 0 (the same float64 uniforms over the whole query are drawn).
- Confidence of the base step: ``softmax(l)[x0]`` in the logits dtype, as LLaDA's reference.
  Proposals (base and fill): arg-max at T = 0, LLaDA's float64 Gumbel-max at T > 0, never the mask id.
- Monitored positions: the released eval forces "The answer is" at generated offsets 200-202 and
  monitors the 5 positions from 204, committed or not. A generic decoder has no known answer span,
  so by default we monitor ALL remaining masked positions of the whole canvas (our
  generalisation). ``span=(start, end)`` (generated coordinates, end exclusive) monitors exactly
  those positions, committed or not, as the released eval. Without a span the all-in commit can
  cut a reasoning chain short: confident positions (such as the EOS padding after an answer) can
  carry the mean gap while the reasoning before them is unfinished. A row with no monitored
  position never fires.
- Progress: ``p = (committed + 1) / gen_length`` with ``committed`` the row's decided generated
  positions before this step. For one token per step this is exactly Prophet's
  ``global_step / steps`` (its step counter is 1-based), and it needs no step budget.
- All-in across blocks: when a row fires, its proposals for every remaining mask of the query are
  committed at once: the current block through ``commit`` and every later block through
  ``StepOutput.beyond``, so later blocks need no forward (one NFE for the whole rest). The
  proposals are also stored (``state.extras["prophet_fill"]``, canvas coordinates) for masks
  outside the query.
- KV caches: a cached step queries only part of the canvas (e.g. the block), so only the queried
  masks are monitored and stored; a block-start step is a full forward and covers everything; a
  mask with no stored token is committed, when its block comes, with the proposal of that step.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

import torch

from dllm.options import check_number
from dllm.samplers._ops import expand_window, gather_prob, propose, top1
from dllm.samplers.base import Sampler, register_sampler
from dllm.state import DecodeState, StepInput, StepOutput

EARLY_PHASE, MID_PHASE = 0.33, 0.67  # progress boundaries of the three thresholds (Prophet)


@dataclass(frozen=True)
class ProphetConfig:
    early_threshold: float = 7.5  # mean logit gap that fires while progress < 0.33, >= 0 (inf: never)
    mid_threshold: float = 5.0  # ... while progress < 0.67
    late_threshold: float = 2.5  # ... afterwards
    span: Optional[tuple[int, int]] = None  # monitored (start, end) in generated coordinates;
    #   None: every remaining masked position of the canvas

    def __post_init__(self) -> None:
        for name in ("early_threshold", "mid_threshold", "late_threshold"):
            check_number(name, getattr(self, name), low=0.0, hint=" (inf disables it)")
        if self.span is not None:
            span = self.span
            ok = (isinstance(span, (tuple, list)) and len(span) == 2
                  and all(isinstance(v, int) and not isinstance(v, bool) for v in span)
                  and 0 <= span[0] < span[1])
            if not ok:
                raise ValueError(f"span must be None or (start, end) with integers 0 <= start < end "
                                 f"(generated coordinates), got {span!r}")
            object.__setattr__(self, "span", (int(span[0]), int(span[1])))


@register_sampler("prophet")
class Prophet(Sampler):
    """Prophet: one token per step until the mean top-2 logit gap fires, then commit everything."""

    Config = ProphetConfig
    fixed_steps = False

    def step(self, inp: StepInput, state: DecodeState) -> StepOutput:
        cfg = self.config
        logits = inp.logits  # [B, Q, V]
        bsz, q, _ = logits.shape
        q0, (ws, we) = inp.query_start, inp.window
        lp, g = state.prompt_length, state.gen_length
        fill = state.extras.get("prophet_fill")
        if fill is None:
            fill = torch.full_like(state.x, inp.mask_id)  # [B, L] stored all-in tokens (canvas)
            state.extras["prophet_fill"] = fill
            state.extras["prophet_fired"] = torch.zeros(bsz, dtype=torch.bool, device=logits.device)
        fired = state.extras["prophet_fired"]  # [B]

        # proposals over the whole query (the all-in fill needs every position), as LLaDA draws them
        x0 = propose(logits, inp.temperature, inp.generator, inp.mask_id, query_start=inp.query_start)  # [B, Q]
        conf_w = gather_prob(torch.softmax(logits[:, ws:we], dim=-1), x0[:, ws:we])  # [B, W]
        score = expand_window(conf_w, inp.window, q, float("-inf"))  # [B, Q]

        # 1. mean raw top-2 logit gap over the monitored positions
        masked = inp.tokens == inp.mask_id  # [B, Q]
        if cfg.span is None:
            monitored = masked
        else:
            cols = torch.arange(q0, q0 + q, device=logits.device)  # canvas columns of the query
            start, end = lp + cfg.span[0], lp + min(cfg.span[1], g)
            monitored = ((cols >= start) & (cols < end)).expand(bsz, q)
        top2 = logits.float().topk(2, dim=-1).values  # [B, Q, 2]
        gap = (top2[..., 0] - top2[..., 1]).masked_fill(~monitored, 0.0)  # [B, Q]
        count = monitored.sum(dim=1)  # [B]
        mean_gap = gap.sum(dim=1) / count.clamp_min(1)  # [B]

        # 2. threshold by progress (committed generated positions, counting this step)
        committed = (state.x[:, lp:] != inp.mask_id).sum(dim=1)  # [B]
        progress = (committed + 1).to(torch.float64) / g  # [B]
        phase = (progress >= EARLY_PHASE).long() + (progress >= MID_PHASE).long()  # [B] 0, 1, 2
        tau = torch.full_like(progress, cfg.late_threshold)  # [B] float64, by phase
        tau = torch.where(phase == 1, cfg.mid_threshold, tau)
        tau = torch.where(phase == 0, cfg.early_threshold, tau)
        fire = ~fired & (count > 0) & (mean_gap.to(torch.float64) >= tau)  # [B]

        # 3. all in: store the proposals of every remaining mask of the query, commit the block now
        fill_q = fill[:, q0:q0 + q]  # [B, Q] view into the stored fill
        fill_q.copy_(torch.where(fire[:, None] & masked, x0, fill_q))
        fired |= fire
        use_fill = fired[:, None] & (fill_q != inp.mask_id)
        tokens = torch.where(use_fill, fill_q, x0)
        commit = torch.where(fired[:, None], inp.active, top1(score, inp.active))  # [B, Q]
        # every mask of the query right of the block is committed now too (engine: ``beyond``);
        # masks outside the query (a KV cache's short query) come from the stored fill later
        return StepOutput(commit=commit, tokens=tokens, score=score, beyond=fired[:, None] & masked)
