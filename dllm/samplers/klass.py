"""KLASS, KL-Adaptive Stability Sampling (``klass``; shkim0116/KLASS ``src/model/llada_klass.py``
``stable_confident_decode``, arXiv 2511.05664).

Rule (one step, per row): for every active mask i of the block,
``KL_t(i) = KL(p_t(i) || p_{t-1}(i)) = sum_v p_t(v) (log p_t(v) - log p_{t-1}(v))`` between this
step's and the previous step's predicted distribution. Position i is *ready* when

    KL_s(i) < kappa for each of the last H steps s = t-H+1 .. t    AND    c_i = p_t(x0_i) > tau_conf

Commit every ready position (``unmask="all"``; the authors' other modes: ``"max_conf"`` commits the
most confident ready one, ``"min_kl"`` the one with the smallest current KL). A row with no ready
position commits its single most confident active mask.

Adaptive: the engine loops until the block has no masks, so ``steps`` is ignored.
Defaults (LLaDA, GSM8K, from the authors' scripts): ``tau_conf = 0.6``, ``kappa = 0.015``, ``H = 2``
(LLaDA HumanEval: tau_conf 0.9, MBPP 0.7, other tasks kappa 0.01; Dream: tau_conf 0.9,
kappa 0.001, H 2).

History across blocks (as the authors): the authors keep the previous distribution of every canvas
position and test the KL history only from a block's step H - 1 on, so the KLs that count are the
block's own steps' (block steps 0 .. t); but its step-0 KL compares with the previous block's last
step, which already predicted the new block's positions. We keep the window's distributions
([B, W, V] float64, ``state.extras["klass"]``) and, at each row's steps in a block, the logits of the
next block's columns when the query covers them (``state.extras["klass_next"]``, [B, BL, V] in the
logits dtype): a new block's first KL is measured against them, so its earliest parallel commit is
at block step H - 1, as in the authors' code. Where the row's last step did not reach the next block
(``cache="dual"`` after its block-start forward) nothing is carried and the row starts afresh.
``reset_each_block=True`` always starts afresh: KL = inf at block step 0, earliest parallel commit
at block step H (the authors' code behaves so in its first block only).

Decisions where we differ from the authors' code:
- Fallback when nothing is ready: the official code takes the LLaDA schedule's count for this
  step, ``m // S + (s < m % S)``. An adaptive sampler has no step budget, so we commit the top-1 by
  confidence, which is exactly that count in the authors' own configuration (``steps =
  gen_length``, one scheduled token per step).
- At T > 0 the official code measures KL and confidence on the Gumbel-perturbed logits (a noisy
  distribution); we measure both on the model's softmax and only sample the proposal.
- The KL is exact (a term with p = 0 counts 0; p > 0 where q = 0 gives inf); the authors add 1e-12
  inside both logarithms, which moves a KL by about that much. Their first step compares with a
  zero-initialised distribution: a KL of log(1e12) = 27.6 nats minus the entropy, where ours is
  inf; the two differ only for a kappa above that.
- The mask id is never proposed (runner-up instead). Comparisons are strict (``<`` kappa,
  ``>`` tau_conf), as in the official code.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import NamedTuple, Optional

import torch

from dllm.options import check_bool, check_choice, check_int, check_number, check_unit
from dllm.samplers._ops import gather_prob, propose_with_log_probs, top1, window_of, window_output
from dllm.samplers.base import Sampler, register_sampler
from dllm.samplers.chunked import column_ids, max_excluding, neg_inf
from dllm.state import DecodeState, StepInput, StepOutput

UNMASK_MODES = ("all", "max_conf", "min_kl")
EXTRAS_KEY = "klass"  # state.extras[EXTRAS_KEY] = (logp [B, W, V] float64, since [B, W] long, t) or None: the
#   last step's log-probabilities, per position the first step of its current run of KLs below kappa
#   (t + 1 where the last KL is not below), and t, the last step's index since the history started
NEXT_KEY = "klass_next"  # state.extras[NEXT_KEY] = a ``Carry`` or None


class Carry(NamedTuple):
    """The columns right of the window at each row's last step (a next block's first KL compares with
    them): ``col`` their first canvas column, ``logits`` [B, N, V], ``valid`` [B] bool, and
    ``settled``: no later step of this block can change ``valid`` (see ``_next_block_logits``)."""

    col: int
    logits: torch.Tensor
    valid: torch.Tensor
    settled: bool


def kl_divergence(logp: torch.Tensor, logq: torch.Tensor, p: Optional[torch.Tensor] = None) -> torch.Tensor:
    """``KL(p || q)`` over the last axis from log-probabilities. Terms with p = 0 count 0 (no
    0 * inf = nan); p > 0 where q = 0 gives inf. [..., V] -> [...]. ``p``: ``logp.exp()`` when the
    caller has it."""
    p = logp.exp() if p is None else p
    # a p = 0 term is 0 * -inf or 0 * nan = nan: counted 0 (every other term, inf included, as is)
    terms = (p * (logp - logq)).nan_to_num_(nan=0.0, posinf=math.inf, neginf=-math.inf)  # [..., V]
    return terms.sum(dim=-1)


@dataclass(frozen=True)
class KLASSConfig:
    conf_threshold: float = 0.6  # tau_conf: ready needs p(x0) > this, in [0, 1)
    kl_threshold: float = 0.015  # kappa: ready needs KL < this at each of the last H steps, > 0
    history: int = 2  # H: how many consecutive steps the KL must stay below kappa, >= 1
    unmask: str = "all"  # which ready positions to commit: all | max_conf | min_kl
    reset_each_block: bool = False  # True: forget the previous step's distributions at each block
    #   start (first KL at block step 1); False: carry them into the next block, as the authors

    def __post_init__(self) -> None:
        check_unit("conf_threshold", self.conf_threshold, high_open=True)
        check_number("kl_threshold", self.kl_threshold, low=0.0, low_open=True)
        check_int("history", self.history, 1)
        check_choice("unmask", self.unmask, UNMASK_MODES)
        check_bool("reset_each_block", self.reset_each_block)


@register_sampler("klass")
class KLASS(Sampler):
    """KLASS: commit masks whose distribution is stable (KL < kappa for H steps) and confident."""

    Config = KLASSConfig
    fixed_steps = False

    @property
    def commits_every_step(self) -> bool:
        return True  # the ready masks, else the row's best active one

    @property
    def reads_right_of_block(self) -> bool:
        return not self.config.reset_each_block  # the next block's first KL reads its logits of this step

    def begin_block(self, state: DecodeState) -> None:
        state.extras[EXTRAS_KEY] = None  # a new window: its KL history starts empty
        if self.config.reset_each_block:
            state.extras[NEXT_KEY] = None

    def step(self, inp: StepInput, state: DecodeState) -> StepOutput:
        """The rule of the module docstring. A position's last H KLs are below kappa exactly when its run of
        such KLs, counted over the steps its history holds, is at least H long: the history keeps where
        each run starts, not the KLs."""
        cfg = self.config
        x0, logp = propose_with_log_probs(inp)  # [B, W], [B, W, V] float64
        active = window_of(inp.active, inp.window)  # [B, W]
        probs = logp.exp()  # [B, W, V]
        # p(x0); at T = 0 x0 is the arg-max without the mask id: the largest probability without it
        conf = gather_prob(probs, x0) if inp.temperature > 0 else max_excluding(probs, inp.mask_id)  # [B, W] float64
        prev = state.extras.get(EXTRAS_KEY)
        if prev is not None and prev[0].shape != logp.shape:  # another window: start afresh
            prev = None
        if prev is None:  # the block's first step: at most the KL against the carried step
            kl = None if cfg.reset_each_block else _carried_kl(logp, inp, state)
            kl = torch.full_like(conf, float("inf")) if kl is None else kl
            t, since = 0, 0
        else:
            prev_logp, since, t = prev
            t += 1
            kl = kl_divergence(logp, prev_logp, probs)  # [B, W]
        since = torch.where(kl < cfg.kl_threshold, since, t + 1)  # [B, W] long
        state.extras[EXTRAS_KEY] = (logp, since, t)
        if not cfg.reset_each_block:
            state.extras[NEXT_KEY] = _next_block_logits(inp, state, active)

        scored = torch.where(active, conf, neg_inf(conf.device))  # [B, W] the active masks' confidences
        ready = (since <= t + 1 - cfg.history) & (scored > cfg.conf_threshold)  # [B, W] active only
        if cfg.unmask == "max_conf":
            ready = top1(conf, ready)
        elif cfg.unmask == "min_kl":
            ready = top1(-kl, ready)
        # no ready position: the most confident active mask (the schedule's count at steps = G), the
        # first of equal ones
        best = scored.argmax(dim=1, keepdim=True)  # [B, 1]
        columns = column_ids(active.shape[1], best.device)  # [W]
        commit = torch.where(ready.any(dim=1, keepdim=True), ready, (columns == best) & active)  # [B, W]
        out = window_output(inp, commit, x0, scored)
        out.active_only = True  # ready and the fallback hold active masks only
        return out


def _next_block_logits(inp: StepInput, state: DecodeState, active: torch.Tensor) -> Optional[Carry]:
    """What a block that starts after this step compares its first distributions with: a ``Carry`` of
    canvas column e, the logits [B, N, V] of the N <= BL columns from e and valid [B] bool, or None.

    A row that still had masks in the block (``active`` [B, W] bool) takes this step's logits of those
    columns -- valid only if the query reached them (``cache="dual"``'s cached steps stop at the
    block end); a row whose block is already full keeps what it stored at its own last step, so it
    carries what it would carry decoding alone. A copy in the logits dtype: the float64
    log-probabilities are computed only when a block starts.

    Steps that do not reach the next block only clear ``valid`` for the rows with masks, and a row's
    masks only shrink within a block (KLASS never re-masks): after the first such step, the rows with
    masks at a later one had them then too and are cleared already, so ``valid`` is settled for the
    rest of the block (no calls at those steps).
    """
    ws, we = inp.window
    col = inp.query_start + we
    q = inp.logits.shape[1]
    n = getattr(state, "block_length", 0) or (q - we)
    reached = max(0, min(we + n, q) - we)  # columns of the query right of the window (at most n)
    old = state.extras.get(NEXT_KEY)
    if old is None or old.col != col:  # the block's first step (every row has masks) or no carry
        return None if reached == 0 else Carry(col, inp.logits[:, we:we + n].clone(),
                                               torch.ones(active.shape[0], dtype=torch.bool, device=active.device),
                                               False)
    if reached == 0:
        if old.settled:
            return old
        return old._replace(valid=old.valid > active.any(dim=1), settled=True)  # bool >: valid, no masks in the row
    rows = active.any(dim=1)  # [B]
    right = inp.logits[:, we:we + n]  # [B, N, V]
    if right.shape != old.logits.shape:
        return Carry(col, right.clone(), rows.clone(), False)
    return Carry(col, torch.where(rows[:, None, None], right, old.logits), old.valid | rows, False)


def _carried_kl(logp: torch.Tensor, inp: StepInput, state: DecodeState) -> Optional[torch.Tensor]:
    """KL [B, W] of this window's distributions ``logp`` [B, W, V] against the previous step's, inf
    for rows that have none; None when nothing was carried (``_next_block_logits``)."""
    carried = state.extras.get(NEXT_KEY)
    ws, we = inp.window
    if carried is None or carried.col != inp.query_start + ws or carried.logits.shape[1] < we - ws:
        return None
    kl = kl_divergence(logp, torch.log_softmax(carried.logits[:, :we - ws], dim=-1, dtype=torch.float64))  # [B, W]
    return kl.masked_fill(~carried.valid[:, None], float("inf"))
