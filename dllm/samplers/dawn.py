"""DAWN, dependency-aware decoding (``dawn``; lizhuo-luo/DAWN ``llada/generate.py``
``get_transfer_index_dawn`` and ``gdllm_utils.py``, ``dream/model/generation_utils.py``
``_sample_block(alg='dawn')``; arXiv 2602.06953).

The sampler reads the attention probabilities of the model's last 4 layers from the same forward
(``attention_layers = (-4, -3, -2, -1)``; the engine asks the model for them) and builds a
dependency graph over positions:

- ``A`` [B, Q, K] = mean over heads and over those layers of the attention probabilities
  (query i x key j). Sink removal: key j is a sink if its column mean ``mean_i A[i, j] > tau_sink``;
  its column is zeroed. The diagonal is zeroed. Edge ``i <- j`` ("i depends on j") iff
  ``A[i, j] >= tau_edge``.

Per step (M = active masks of the block; ``c_i = p_i(x0_i)`` from a float64 softmax, for every
position up to the block end, decoded ones included; x0 = arg-max at T = 0, LLaDA's float64
Gumbel-max at T > 0, never the mask id):

1. ``S_high = {i in M : c_i >= tau_high}`` (0.9, hard-coded in the official code).
2. Anchors = decoded positions before the block end with ``c_j >= tau_high`` (the prompt's first
   one included, except under a logit shift: see Decisions);
   ``S_ind = {i in M : c_i >= tau_induce, i <- j for some anchor j}``.
3. ``Blocked = {i : i <- j for some j in S_ind & S_high}`` (the official code intersects the
   two sets); candidates ``C = {i in M : c_i >= tau_low} - S_high - S_ind - Blocked``.
4. Conflict graph on C: i and k conflict if ``i <- k`` or ``k <- i``. Greedy maximal independent
   set: repeatedly take the most confident remaining candidate (leftmost on ties) and drop its
   neighbours -> ``S_mis``.
5. Commit ``S_high | S_ind | S_mis``; a row that chose nothing commits its most confident mask
   (the engine's progress rule does this from ``score``).

Defaults: those of the official ``generate()`` (and ``get_transfer_index_dawn``): tau_sink 0.01,
tau_edge 0.07, tau_induce 0.7, tau_low 0.7; tau_high 0.9. The published LLaDA evaluation scripts
(``llada/eval_instruct.sh``) pass tau_low 0.75 for GSM8K and MATH, 0.8 for HumanEval, 0.7 for MBPP
(``dawn:tau_low=0.75``); the Dream scripts tau_sink 0.03, tau_edge 0.10, tau_induce 0.75, tau_low 0.8
(pass them as options). Until 2026-12-03 the default tau_low was 0.75 (the GSM8K value), so
measurements of ``dawn`` dated before then are of ``dawn:tau_low=0.75``.

Decisions:
- Batched: every set is a bool tensor [B, Q]; the greedy MIS is sequential over candidates, so it
  runs ``block length - 1`` rounds of four calls, each one batched over rows (no host reads): the
  fixed point of "a candidate is kept unless an earlier-ranked conflicting one is" (``greedy_mis``;
  its reference, ``greedy_mis_by_picks``, takes each row's best remaining candidate a round, as the
  official loop, at ten calls a round). The official fallback (top-1 when ANY row chose nothing,
  added to EVERY row) is per row here.
- The official greedy loop (``select_parallel_tokens_conflict_mis``) makes as many picks as it had
  candidates; once a conflict has dropped one, the remaining picks are the arg-max of an all -inf
  row, position 0, and the step writes its proposal there: the prompt's first token becomes the
  arg-max at position 0 (LLaDA's, not reset to the token; Dream's shifted one, the prediction for
  position 1), the mask id included. We stop after the last candidate and never write the prompt.
- Left padding: the column mean runs over the row's real query positions only, pads are never
  anchors, so a prompt gives the same graph alone or in a batch. Under a logit shift (Dream) the
  first real position is never an anchor: its logits are a placeholder (Dream copies position 0's;
  in a padded batch they are a pad's output); the official Dream code lets it be one when that
  copy's probability is >= 0.9. Unshifted (LLaDA) it is an anchor as any decoded position, as
  officially (until 2026-12-07 it never was).
- Dtypes: the official maps are ``attn_avg`` in the model dtype (softmax, head and layer means in
  bf16 on LLaDA-8B / Dream-7B); ours are the float32 probabilities of the ``reference`` backend,
  averaged in float32. The official Dream confidence is ``softmax`` in the logits dtype (bf16);
  ours is float64 as LLaDA's. On a bf16 model an edge, sink or threshold test near its bar may
  therefore differ; on float32 models (the tests) they agree.
- The mask id is never proposed; the official LLaDA code may propose it (the position stays
  masked) and may take a decoded position whose arg-max is the mask id at >= 0.9 as an anchor
  (never here: the runner-up's probability is then below 0.5).
- Sampling (T > 0): the Gumbel uniforms of the columns before the block end are those columns of a
  draw over the whole canvas, [B, L, V] (the other columns drawn and dropped), the official code's
  stream: under cache none, its only setting, the same tokens seeded alike (tested).
- Compared token for token and NFE for NFE with a transcription of the official loops
  (tests/reference/decoders/dawn_generate.py, tests/samplers/test_dawn_upstream.py): 16 suite
  prompts per setting on tiny-llada (generate()'s defaults, tau_low 0.75, blocks of 8 and 32; T = 1 on
  the official draw) and tiny-dream (the Dream script's settings): equal. The tiny models attend
  almost evenly, so at those settings every column is a sink and the graph is empty; with one that
  decides (tau_sink 0.045, tau_edge 0.06): equal except where the official overflow rewrites
  position 0, and equal everywhere to the transcription without it. One step on random numbers
  (graph, anchors, blocking, conflicts): equal to the official rule without its overflow.
- Coordinates: queries are canvas columns ``[query_start, query_start + Q)``, keys are canvas
  columns ``[0, K)`` (K = L without a KV cache). The graph is the square query x query part of A;
  anchors and candidates must be query positions (they need logits). Attention stays in token
  coordinates for Dream (its logits are shifted, its attention is not), as the official Dream code.
- The sink column mean is over the query rows of this forward (all rows without a cache).
- A model without attention maps cannot run ``dawn``; the step says so if the maps are missing.
  The engine asks for layers -4..-1, which needs a model with at least 4 layers; ``layers=k``
  reads the last k instead (``dllm.generate(model, ..., sampler="dawn", layers=2)`` for a 2-layer
  model).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from dllm.options import check_int, check_unit
from dllm.samplers._ops import propose_with_prob, top1
from dllm.samplers.base import Sampler, register_sampler
from dllm.samplers.chunked import columns_gumbel_argmax, constant, softmax_prob
from dllm.schedule import LOGIT_SHIFT_KEY
from dllm.state import DecodeState, StepInput, StepOutput


MAX_LAYERS = 1024  # the most ``layers`` may ask for (the layer list is built before the model is seen)


@dataclass(frozen=True)
class DawnConfig:
    tau_sink: float = 0.01  # key j is an attention sink if its column mean > this, in [0, 1]
    tau_edge: float = 0.07  # edge i <- j iff A[i, j] >= this, in (0, 1]
    tau_induce: float = 0.7  # a mask attending to a confident anchor is committed if c >= this
    tau_low: float = 0.7  # candidates of the independent set need c >= this, in [0, 1] (DAWN's generate())
    tau_high: float = 0.9  # S_high and anchor confidence (hard-coded 0.9 upstream), in [0, 1]
    layers: int = 4  # read the attention of the last `layers` layers (DAWN: 4), in [1, MAX_LAYERS]; more
    #   than the model has: all of them

    def __post_init__(self) -> None:
        for name in ("tau_sink", "tau_induce", "tau_low", "tau_high"):
            check_unit(name, getattr(self, name))
        check_unit("tau_edge", self.tau_edge, low_open=True)  # 0 would make every pair (and self) an edge
        check_int("layers", self.layers, 1, high=MAX_LAYERS)


def dependency_graph(
    attn: torch.Tensor, real_q: torch.Tensor, q0: int, tau_sink: float, tau_edge: float
) -> torch.Tensor:
    """The edge map ``E[b, i, k]`` = "query i depends on query k" over the query positions.

    attn: [B, Q, K] head- and layer-averaged attention (keys = canvas columns [0, K));
    real_q: [B, Q] bool, real (non-pad) query rows; q0: canvas column of query 0. -> [B, Q, Q] bool.
    """
    bsz, q, k = attn.shape
    if k < q0 + q:
        raise ValueError(f"dawn: the attention keys ({k} canvas columns) do not cover the query "
                         f"positions [{q0}, {q0 + q})")
    sq = attn[:, :, q0:q0 + q].float()  # [B, Q, Q] query i x key column q0 + k
    rows = real_q.to(sq.dtype)  # [B, Q]
    col_mean = (sq * rows[:, :, None]).sum(dim=1) / rows.sum(dim=1, keepdim=True).clamp_min(1)  # [B, Q]
    sq = sq.masked_fill((col_mean > tau_sink)[:, None, :], 0.0)  # remove sink columns
    eye = torch.eye(q, dtype=torch.bool, device=sq.device)
    sq = sq.masked_fill(eye, 0.0)  # no self edges
    return (sq >= tau_edge) & real_q[:, :, None] & real_q[:, None, :]


def greedy_mis(cand: torch.Tensor, conflict: torch.Tensor, score: torch.Tensor, rounds: int) -> torch.Tensor:
    """Greedy maximal independent set per row, batched over rows: the candidates taken in order of
    ``score`` (descending, leftmost on ties), each kept unless a kept one conflicts with it.

    cand: [B, N] bool candidates; conflict: [B, N, N] bool symmetric; score: [B, N] float. ``rounds``
    >= the most candidates of a row, required (with fewer, two conflicting candidates may both be kept;
    the step passes the window's width). -> [B, N] bool.

    Fast path: instead of ``rounds`` picks of the best remaining candidate (``greedy_mis_by_picks``,
    ten calls a round), the greedy set is the fixed point of ``kept = cand & ~(some earlier-ranked
    conflicting candidate is kept)``, iterated from ``kept = cand``: a candidate with no earlier-ranked
    neighbour is right from the start, and one whose longest chain of earlier-ranked neighbours has
    d links is right after d iterations and stays so; d < the row's candidates, so ``rounds - 1``
    iterations of four calls reach it. Same sets, no host read.
    """
    n = cand.shape[-1]
    s_i, s_j = score.unsqueeze(2), score.unsqueeze(1)  # [B, N, 1] rank of i, [B, 1, N] of j
    left = constant(("dawn left of", n, cand.device),
                    lambda: torch.ones(n, n, dtype=torch.bool, device=cand.device).tril(-1))  # [N, N] j < i
    before = (s_j > s_i) | ((s_j == s_i) & left)  # [B, N, N] j is ranked before i
    earlier = conflict & before & cand.unsqueeze(1)  # [B, N, N] i's conflicting candidates ranked before it
    kept = cand  # [B, N] (rebound, never written)
    for _ in range(rounds - 1):  # static: no host read to stop early
        kept = cand > (earlier & kept.unsqueeze(1)).any(dim=2)  # bool > bool: cand and no earlier kept
    return kept


def greedy_mis_by_picks(cand: torch.Tensor, conflict: torch.Tensor, score: torch.Tensor, rounds: int
                        ) -> torch.Tensor:
    """Reference of ``greedy_mis`` (DAWN's loop, batched): each round takes every row's best remaining
    candidate (leftmost on ties) and removes it and its neighbours. Same arguments and result."""
    remaining = cand  # [B, N] (rebound, never written)
    chosen = torch.zeros_like(cand)  # [B, N]
    for _ in range(rounds):  # bounded by the block length; rows with no candidate left pick nothing
        pick = top1(score, remaining)  # [B, N] at most one per row
        gone = (conflict & pick[:, :, None]).any(dim=1) | pick  # [B, N] the pick and its conflicts
        chosen |= pick
        remaining = remaining > gone  # bool > bool: remaining and not gone
    return chosen


def head_proposals(head: torch.Tensor, inp: StepInput, canvas: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Proposals, never the mask id, and their float64 probabilities for the query columns before the block
    end: head [B, we, V] -> ([B, we] long, [B, we] float64). At T > 0 the Gumbel-max is on those columns of
    uniforms drawn over the whole canvas' logits [B, L, V] of ``canvas`` columns (``chunked.columns_gumbel_argmax``:
    DAWN's stream, chunked on CPU: no [B, we, V] float64 tensor, as ``we`` may be most of the canvas)."""
    if inp.temperature == 0:
        return propose_with_prob(head, 0, inp.generator, inp.mask_id, inp.query_start)
    x0 = columns_gumbel_argmax(head, inp.temperature, inp.generator, inp.mask_id, canvas, inp.query_start)  # [B, we]
    return x0, softmax_prob(head, x0)  # chunked: no [B, we, V] float64 either


@register_sampler("dawn")
class Dawn(Sampler):
    """DAWN: attention-graph dependency-aware parallel decoding (needs attention probabilities)."""

    Config = DawnConfig
    fixed_steps = False
    attention_layers = (-4, -3, -2, -1)

    def __init__(self, config=None, **options) -> None:
        super().__init__(config, **options)
        self.attention_layers = tuple(range(-self.config.layers, 0))

    def step(self, inp: StepInput, state: DecodeState) -> StepOutput:
        cfg = self.config
        if not inp.attn:
            raise RuntimeError(
                "sampler 'dawn' needs the attention probabilities of the model's last "
                f"{cfg.layers} layers, but the model returned none; use a model that can return "
                "attention maps (dllm TransformerLM), or a sampler that reads only logits"
            )
        logits = inp.logits  # [B, Q, V]
        bsz, q, _ = logits.shape
        q0, (ws, we) = inp.query_start, inp.window
        mask_id = inp.mask_id

        # attention: mean over heads, then over the layers -> [B, Q, K]
        attn = torch.stack([a.float().mean(dim=1) for a in inp.attn.values()]).mean(dim=0)
        kpm = state.key_padding_mask[:, q0:q0 + q]  # [B, Q] real query rows
        edge = dependency_graph(attn, kpm, q0, cfg.tau_sink, cfg.tau_edge)  # [B, Q, Q] i <- k

        # proposals and confidence for every position before the block end
        head = logits[:, :we]  # [B, we, V]
        x0, c = head_proposals(head, inp, state.x.shape[1])  # [B, we] long, [B, we] float64
        tokens = torch.full((bsz, q), mask_id, dtype=torch.long, device=logits.device)
        tokens[:, :we] = x0
        conf = torch.full((bsz, q), float("-inf"), dtype=torch.float64, device=logits.device)
        conf[:, :we] = c

        active = inp.active  # [B, Q] M
        s_high = active & (conf >= cfg.tau_high)
        before_end = torch.arange(q, device=logits.device) < we
        anchor = kpm & (inp.tokens != mask_id) & before_end & (conf >= cfg.tau_high)  # [B, Q]
        if state.extras.get(LOGIT_SHIFT_KEY, 0):  # shifted (Dream): the first real position's logits are a placeholder
            real = state.key_padding_mask  # [B, L]
            anchor = anchor & ~(real & (real.long().cumsum(dim=1) == 1))[:, q0:q0 + q]  # not the first real one
        s_ind = active & (conf >= cfg.tau_induce) & (edge & anchor[:, None, :]).any(dim=2)
        source = s_ind & s_high
        blocked = (edge & source[:, None, :]).any(dim=2)
        cand = active & (conf >= cfg.tau_low) & ~s_high & ~s_ind & ~blocked  # [B, Q]

        # greedy maximal independent set on the block window (candidates live there)
        conflict = edge[:, ws:we, ws:we] | edge[:, ws:we, ws:we].transpose(1, 2)  # [B, W, W]
        mis_w = greedy_mis(cand[:, ws:we], conflict, conf[:, ws:we], rounds=we - ws)
        s_mis = torch.zeros_like(cand)
        s_mis[:, ws:we] = mis_w

        commit = s_high | s_ind | s_mis
        return StepOutput(commit=commit, tokens=tokens, score=conf.masked_fill(~active, float("-inf")))
