"""Prophet, early-commit "all-in" decoding (``prophet``; pixeli99/Prophet ``generate_earlyexit.py``,
arXiv 2508.19982).

Rule, at every step of a row:

1. Gap: ``g = mean over the monitored positions of l(1) - l(2)``, the gap between the two largest
   RAW logits, each gap rounded to the logits dtype (Prophet subtracts its top 2 in that dtype and reads
   ``.item()``; bfloat16 logits thus give a bfloat16 gap), their mean in float64 (Prophet's Python mean).
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
  Proposals (base and all-in): arg-max at T = 0, LLaDA's float64 Gumbel-max at T > 0, never the mask id.
- Monitored positions: the released eval forces "The answer is" at generated offsets 200-202 and
  monitors the 5 positions from 204, committed or not. A generic decoder has no known answer span,
  so by default we monitor ALL remaining masked positions of the whole canvas (our
  generalisation). ``span=(start, end)`` (generated coordinates, end exclusive) monitors exactly
  those positions, committed or not, as the released eval (clipped at ``gen_length``; a span that
  starts at or past it is refused: it would monitor nothing). Without a span the all-in commit can
  cut a reasoning chain short: confident positions (such as the EOS padding after an answer) can
  carry the mean gap while the reasoning before them is unfinished. A row with no monitored
  position never fires.
- Progress: ``p = (committed + 1) / gen_length`` with ``committed`` the row's decided generated
  positions before this step. For one token per step this is exactly Prophet's
  ``global_step / steps`` (its step counter is 1-based), and it needs no step budget.
- All-in across blocks: when a row fires, its proposals for every remaining mask of the query are
  committed at once: the current block through ``commit`` and every later block through
  ``StepOutput.beyond``, so later blocks need no forward (one NFE for the whole rest). Nothing is
  stored: every mask the query holds is committed in the step that fires, so the step's tokens are
  its proposals.
- Compared with the authors' code: ``tests/samplers/test_prophet_upstream.py`` runs the transcription of
  ``generate_earlyexit.py`` ``generate`` (``tests/reference/decoders/prophet_generate.py``) with
  ``steps = gen_length``, its thresholds and ``answer_start_pos = prompt + span[0]``, ``answer_length =
  span[1] - span[0]`` (5): the same tokens and forwards (its exit step is its last forward, ours the
  firing step's) on tiny-llada, greedy and sampled (the same float64 uniforms), at cache ``none``. The
  authors' loop is LLaDA-only (no Dream code). Residual differences, outside that comparison: without a
  span we monitor every remaining mask (theirs never exits without ``answer_start_pos``); their
  ``steps < gen_length`` (several tokens per step) and answer ``constraints`` have no counterpart here;
  their proposals may be the mask id (ours never are); ties of the one-token step go to the lowest
  index where theirs go to ``torch.topk``'s order.
- KV caches: a cached step queries only part of the canvas (e.g. the block), so only the queried
  masks are monitored and committed; a block-start step is a full forward and covers everything; a
  mask outside a firing step's query is committed when its block comes, at that block's first step,
  with the proposal of that step.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Optional

import torch

from dllm.options import check_number
from dllm.samplers._ops import expand_window, gather_prob, propose, window_of
from dllm.samplers.base import Sampler, register_sampler
from dllm.samplers.chunked import column_ids, constant, max_prob_excluding, neg_inf
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


@dataclass
class _Run:
    """One ``generate`` call's all-in state (``state.extras["prophet"]``) and its current block's
    tensors, made at the block's first step (outside the block a row that has not fired keeps its
    canvas until the block ends)."""

    fired: torch.Tensor  # [B, 1] bool: rows that went all in
    taus: torch.Tensor  # [L - lp + 1] float64: the threshold by the row's committed generated positions
    block: tuple[int, int] = (-1, -1)  # the current block's canvas columns
    tau_rows: Optional[torch.Tensor] = None  # [B, W + 1] float64: the threshold by the block's masks left
    #   (NaN in a row that fired before the block: it never fires again)
    views: dict = field(default_factory=dict)  # (q0, Q, "span") -> the block's monitored span per query


def _plus_minus(dtype: torch.dtype, device: torch.device) -> torch.Tensor:
    """``[1, -1]`` in ``dtype`` [2]: ``(top2 * it).sum(-1)`` is ``l(1) - l(2)`` rounded once to the logits
    dtype (the reduction accumulates in float32 or wider), as Prophet's subtraction of its top 2."""
    return constant(("prophet +1 -1", dtype, device),  # arange: no upload of Python data
                    lambda: torch.arange(1.0, -2.0, -2.0, dtype=dtype, device=device))


def thresholds(cfg: ProphetConfig, most: int, gen_length: int, device: torch.device) -> torch.Tensor:
    """``tau(p)`` for every committed count k in [0, most]: ``p = (k + 1) / G`` in float64 (Prophet's
    1-based step over its steps); early / mid / late by phase -> [most + 1] float64."""
    progress = (torch.arange(most + 1, dtype=torch.float64, device=device) + 1) / gen_length
    return torch.where(progress >= MID_PHASE, cfg.late_threshold,
                       torch.where(progress >= EARLY_PHASE, cfg.mid_threshold, cfg.early_threshold))


@register_sampler("prophet")
class Prophet(Sampler):
    """Prophet: one token per step until the mean top-2 logit gap fires, then commit everything."""

    Config = ProphetConfig
    fixed_steps = False

    @property
    def commits_every_step(self) -> bool:
        return True  # a row goes all in or commits its most confident active mask

    @property
    def reads_right_of_block(self) -> bool:
        return True  # the gap is averaged over every monitored mask of the canvas

    def begin_block(self, state: DecodeState) -> None:
        span = self.config.span
        if span is not None and span[0] >= state.gen_length:  # monitors nothing: would never fire
            raise ValueError(f"sampler 'prophet': span={span} starts at generated offset {span[0]}, past the "
                             f"gen_length={state.gen_length} positions, so it monitors nothing and prophet never "
                             f"fires; give 0 <= start < {state.gen_length} (or span=None: every remaining mask)")

    def step(self, inp: StepInput, state: DecodeState) -> StepOutput:
        cfg = self.config
        logits, dev = inp.logits, inp.logits.device  # [B, Q, V]
        q0, (ws, we), q = inp.query_start, inp.window, logits.shape[1]
        run = self._run(inp, state)
        only_block = ws == 0 and we == q  # the query is the block (a cached step): its masks are active
        masked = inp.active if only_block else inp.tokens == inp.mask_id  # [B, Q]
        left = inp.active.sum(dim=1, keepdim=True)  # [B, 1] the block's masks

        # proposals over the whole query (the all-in commit needs every position), as LLaDA draws them
        x0 = propose(logits, inp.temperature, inp.generator, inp.mask_id, query_start=inp.query_start)  # [B, Q]
        conf = self._confidence(window_of(logits, inp.window), x0, inp)  # [B, W]
        score = expand_window(conf, inp.window, q, float("-inf"))  # [B, Q]

        # 1. mean raw top-2 logit gap over the monitored positions (each gap in the logits dtype, their mean in
        # float64, as Prophet's ``.item()`` then Python mean); none monitored: 0 / 0, never fires
        if cfg.span is None:
            monitored, count = masked, (left if only_block else masked.sum(dim=1, keepdim=True))
        else:
            monitored, count = self._span(run, q0, q, state)
        top2 = logits.topk(2, dim=-1).values  # [B, Q, 2] logits dtype
        gap = (top2 * _plus_minus(logits.dtype, dev)).sum(dim=-1)  # [B, Q]: l(1) - l(2) in the logits dtype
        mean_gap = torch.where(monitored, gap, 0.0).sum(dim=1, keepdim=True, dtype=torch.float64) / count  # [B, 1]

        # 2. threshold by progress: committed generated positions before this step
        tau = run.tau_rows.gather(1, left)  # [B, 1] float64
        if cfg.span is not None:  # a span is monitored committed or not: keep fired rows out
            tau = torch.where(run.fired, float("nan"), tau)
        # (without a span a row that fired in this block fires again only with masks in its query, which it
        # commits now anyway)
        fire = mean_gap >= tau  # [B, 1], compared in float64

        # 3. all in: commit every remaining mask of the query now, with its proposal
        run.fired |= fire
        best = torch.where(inp.active, score, neg_inf(score.device)).argmax(dim=1, keepdim=True)  # [B, 1]
        cols = column_ids(q, dev)  # [Q]
        commit = inp.active & (run.fired | (cols == best))  # [B, Q]
        # every mask of the query right of the block is committed now too (engine: ``beyond``); a mask
        # outside the query (a KV cache's short query) is committed when its block comes, with the
        # proposal of that step (a fired row commits all its active masks at every step)
        beyond = None if we == q else run.fired & masked
        return StepOutput(commit=commit, tokens=x0, score=score, beyond=beyond, active_only=True)

    @staticmethod
    def _confidence(logits: torch.Tensor, x0: torch.Tensor, inp: StepInput) -> torch.Tensor:
        """``softmax(l)[x0]`` over the block window, [B, W] in the logits' dtype. At T = 0, x0 is the
        arg-max of l without the mask id, so its probability is the largest without it (the softmax
        is monotone in l): ``chunked.max_prob_excluding``."""
        if inp.temperature > 0:
            return gather_prob(torch.softmax(logits, dim=-1), window_of(x0, inp.window))
        return max_prob_excluding(logits, inp.mask_id)

    def _run(self, inp: StepInput, state: DecodeState) -> _Run:
        """The call's ``_Run`` (made at its first step) with the block's tensors (at the block's first)."""
        x, lp = state.x, state.prompt_length
        run = state.extras.get("prophet")
        if run is None:
            fired = torch.zeros(x.shape[0], 1, dtype=torch.bool, device=x.device)  # [B, 1]
            run = state.extras["prophet"] = _Run(fired, thresholds(self.config, x.shape[1] - lp,
                                                                  state.gen_length, x.device))
            state.extras["prophet_fired"] = fired
        q0 = inp.query_start
        s, e = q0 + inp.window[0], q0 + inp.window[1]  # the block's canvas columns
        if run.block != (s, e):
            done = (x[:, lp:] != inp.mask_id).sum(dim=1, keepdim=True)  # [B, 1] committed generated positions
            outside = done - (x[:, s:e] != inp.mask_id).sum(dim=1, keepdim=True)  # [B, 1] ... outside the block
            committed = outside + (e - s) - torch.arange(e - s + 1, device=x.device)  # [B, W + 1] by masks left
            run.tau_rows = torch.where(run.fired, float("nan"), run.taus[committed])
            run.block, run.views = (s, e), {}
        return run

    def _span(self, run: _Run, q0: int, q: int, state: DecodeState) -> tuple[torch.Tensor, torch.Tensor]:
        """The query's monitored positions [B, Q] and their count [B, 1] (``span``; made once per query)."""
        key = (q0, q, "span")
        if key not in run.views:
            cols = torch.arange(q0, q0 + q, device=run.fired.device)  # canvas columns of the query
            lp, (a, b) = state.prompt_length, self.config.span
            start, end = lp + a, lp + min(b, state.gen_length)
            monitored = ((cols >= start) & (cols < end)).expand(run.fired.shape[0], q)
            run.views[key] = (monitored, monitored.sum(dim=1, keepdim=True))
        return run.views[key]
