"""Shared tensor math for samplers: schedules, proposals, confidences, per-row top-k by ranks, the
top-1 and threshold commit rules. Samplers import this module, never each other.

Every function is pure and batched; none reads a tensor back to the host.
"""

from __future__ import annotations

from typing import Optional

import torch
import torch.nn.functional as F

from dllm.samplers import draws
from dllm.samplers.chunked import (argmax_excluding, column_ids, constant, greedy_with_prob, gumbel_argmax, neg_inf,
                                    pick_last, rows_per_chunk, softmax_prob)
from dllm.samplers.stats import fused_propose, use_fused
from dllm.samplers.draws import Generator
from dllm.state import StepInput, StepOutput


def transfer_schedule(mask_count: torch.Tensor, steps: int) -> torch.Tensor:
    """LLaDA's per-step commit counts: ``n[j, i] = m_j // S + (i < m_j % S)``.

    mask_count: [B] long, masks of each row in the block at its start. Returns [B, S] long whose
    rows sum to ``mask_count``. (32 masks / 5 steps -> 7, 7, 6, 6, 6.)
    """
    base = mask_count[:, None] // steps  # [B, 1]
    i = column_ids(steps, mask_count.device)  # [S], made once per S
    return base + (i < mask_count[:, None] % steps)  # [B, S] long (bool promotes on the add)


def full_block_count(width: int, steps: int, step: int) -> int:
    """``transfer_schedule``'s count at ``step`` for a block that starts with all ``width`` positions
    masked: ``width // steps + (step < width % steps)``, a host int. No row's count at that step is
    larger (the schedule grows with the mask count), so it bounds every row's."""
    return width // steps + int(step < width % steps)


def take_top_k(score: torch.Tensor, k: torch.Tensor, eligible: torch.Tensor) -> torch.Tensor:
    """Per row, the ``k[j]`` eligible positions with the largest score, as a bool map.

    score: [B, Q] float (ineligible entries may hold anything); k: [B] or [] long;
    eligible: [B, Q] bool. Ranks come from one stable descending sort, so no per-row loop.
    """
    score = torch.where(eligible, score, neg_inf(score.device))
    ranks = ranks_of(score.argsort(dim=-1, descending=True, stable=True))  # [B, Q]
    k = k.reshape(-1, 1) if k.dim() else k
    return (ranks < k) & eligible


TIES = ("reference", "first")  # how equal scores at a top-k cut are resolved (the ``ties`` option)


def prefix_masks(counts: torch.Tensor, k: int) -> torch.Tensor:
    """counts [...] long -> bool [..., k]: ``arange(k) < counts[..., None]`` (the first counts entries)."""
    return column_ids(k, counts.device) < counts[..., None]


def top_k_of_topk(score: torch.Tensor, counts: Optional[torch.Tensor], k_max: int,
                  eligible: torch.Tensor, *, keep: Optional[torch.Tensor] = None) -> torch.Tensor:
    """Per row j, the ``counts[j]`` eligible positions with the largest score, from ONE
    ``torch.topk(score, k_max)`` call: row j keeps the first ``counts[j]`` entries of its sorted
    result, as a bool map.

    score: [B, Q] float; counts: [B] long, each in [0, k_max]; k_max: a host int <= Q; eligible:
    [B, Q] bool. Ineligible entries are -inf, as in LLaDA. A row whose count is ``k_max`` gets
    exactly ``torch.topk(score[j], k_max)``'s set (equal scores at the cut resolved in the device's
    order); a row with a smaller count gets the first ``counts[j]`` of that sorted result, so among
    equal scores at its cut the order of ``topk``'s output decides (on the CPU kernel not
    necessarily the set of ``topk(score[j], counts[j])``). ``keep``: ``prefix_masks(counts, k_max)``
    [B, k_max] when the caller has it already (counts is then not read). Nothing is read back to
    the host; the result holds eligible positions only.
    """
    if k_max == 0:
        return torch.zeros_like(eligible)
    score = torch.where(eligible, score, neg_inf(score.device))
    idx = torch.topk(score, k_max, dim=-1).indices  # [B, k_max] sorted by score
    if keep is None:
        assert counts is not None
        keep = prefix_masks(counts.reshape(-1), k_max)  # [B, k_max]
    zeros = constant(("zeros", eligible.shape, eligible.dtype, eligible.device), lambda: torch.zeros_like(eligible))
    return zeros.scatter(1, idx, keep) & eligible  # a new map: the kept zeros are never written


def top1(score: torch.Tensor, eligible: torch.Tensor) -> torch.Tensor:
    """Per row, the eligible position with the largest score (the lowest index among ties), as a
    bool map; a row with nothing eligible gets nothing. Equals ``take_top_k(score, 1, eligible)``
    (its stable sort also ranks the lowest index first) without the sort.
    score, eligible: [..., N] -> [..., N] bool."""
    best = torch.where(eligible, score, neg_inf(score.device)).argmax(dim=-1, keepdim=True)  # [..., 1]
    return (column_ids(eligible.shape[-1], eligible.device) == best) & eligible


def threshold_commit(conf: torch.Tensor, eligible: torch.Tensor, tau) -> torch.Tensor:
    """Fast-dLLM's threshold rule (arXiv 2505.22618): every eligible position with ``conf >= tau``,
    and always the most confident one (``top1``). conf, eligible: [..., N]; tau a float or a tensor
    of per-position thresholds broadcastable to them -> [..., N] bool, eligible positions only.
    Computed as ``((conf >= tau) with the top-1 set) & eligible``: five calls."""
    hit = conf >= tau  # [..., N]
    if hit.shape != eligible.shape:  # a threshold tensor that broadcasts the shape up
        return (eligible & hit) | top1(conf, eligible)
    best = torch.where(eligible, conf, neg_inf(conf.device)).argmax(dim=-1, keepdim=True)  # [..., 1]
    return hit.scatter_(-1, best, True) & eligible


def gumbel_perturb(
    logits: torch.Tensor, temperature: float, noise: Optional[torch.Tensor] = None
) -> torch.Tensor:
    """LLaDA's Gumbel-max perturbation ``exp(l) / (-log u)^T`` in float64 (identity at T = 0).

    ``argmax`` of the result is an exact sample from ``softmax(l / T)``. ``noise`` holds the
    uniforms ``u`` (same shape as logits, float64); it is drawn by the caller so that the random
    stream can match the reference (which draws over the whole canvas).
    """
    if temperature == 0:
        return logits
    assert noise is not None, "temperature > 0 needs uniform noise"
    l64 = logits.to(torch.float64)
    return torch.exp(l64) / (-torch.log(noise)) ** temperature


def gumbel_uniforms(logits: torch.Tensor, temperature: float, generator: Generator) -> Optional[torch.Tensor]:
    """The float64 uniforms of LLaDA's Gumbel-max draw, in the shape of ``logits`` [B, W, V] (one
    ``torch.rand`` call, so a seed reproduces it; per-row generators: one per row, ``draws.rand``);
    None at T = 0, where nothing is drawn."""
    if temperature == 0:
        return None
    return draws.rand(logits.shape, generator, logits.device, torch.float64)


def propose(logits: torch.Tensor, temperature: float, generator: Generator,
            mask_id: int, query_start: Optional[int] = None) -> torch.Tensor:
    """Proposals: arg-max at T = 0, else LLaDA's float64 Gumbel-max sample on uniforms of the
    logits' shape (as ``gumbel_uniforms`` draws them; a few rows at a time on CPU, the same stream:
    ``dllm.samplers.chunked``); never the mask id. logits: [..., V] -> [...] long. ``query_start``:
    the canvas column of logits' column 0 when they span query columns from the query's start
    (not a block window), so per-row generators draw each row without its padding.
    """
    if temperature == 0:
        return argmax_excluding(logits, mask_id)
    return gumbel_argmax(logits, temperature, generator, mask_id, query_start=query_start)


def propose_with_prob(logits: torch.Tensor, temperature: float, generator: Generator, mask_id: int,
                      query_start: Optional[int] = None) -> tuple[torch.Tensor, torch.Tensor]:
    """``propose`` and ``p(x0)`` from the float64 softmax of logits [..., V] -> ([...] long, [...]
    float64). At T = 0, x0 is the arg-max without the mask id and p(x0) the largest probability
    without it (the softmax is monotone in the logits): both from one softmax
    (``chunked.greedy_with_prob``, three calls) when it fits one piece (``dllm.samplers.chunked``);
    else the proposals, then the (chunked) gather. ``query_start``: as ``propose``'s."""
    v = logits.shape[-1]
    if temperature == 0 and logits.numel() <= rows_per_chunk(v) * v:
        return greedy_with_prob(logits, mask_id)
    x0 = propose(logits, temperature, generator, mask_id, query_start)
    return x0, softmax_prob(logits, x0)


def propose_with_confidence(inp: StepInput, stats: str = "torch") -> tuple[torch.Tensor, torch.Tensor]:
    """Fast-dLLM proposals and confidences over the block window, placed in query coordinates.
    Returns (tokens [B, Q] long, confidence [B, Q], -inf off the window): float64 from the
    reference softmax (``propose_with_prob``), float32 from the fused kernel (``stats``, see
    ``dllm.samplers.stats``)."""
    logits = window_of(inp.logits, inp.window)  # [B, W, V]
    if use_fused(stats, logits):
        noise = gumbel_uniforms(logits, inp.temperature, inp.generator)  # the ones ``propose`` draws
        x0, conf = fused_propose(logits, inp.temperature, noise, inp.mask_id)  # [B, W], [B, W] f32
    else:
        x0, conf = propose_with_prob(logits, inp.temperature, inp.generator, inp.mask_id)  # [B, W], float64
    width = inp.logits.shape[1]
    return (expand_window(x0, inp.window, width, inp.mask_id),
            expand_window(conf, inp.window, width, float("-inf")))


def propose_with_confidence_on(inp: StepInput, noise: Optional[torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor]:
    """``propose_with_confidence`` (the float64 path) with the Gumbel-max on the caller's uniforms ``noise``
    [B, W, V] float64 of the block window, so that a sampler draws the reference's stream (over the query:
    ``chunked.window_uniforms``); at T = 0 (``noise`` None) it is
    ``propose_with_confidence``. Returns (tokens [B, Q] long, confidence [B, Q] float64, -inf off the window)."""
    if inp.temperature == 0:
        return propose_with_confidence(inp)
    assert noise is not None, "temperature > 0 needs uniform noise"
    logits = window_of(inp.logits, inp.window)  # [B, W, V]
    x0 = argmax_excluding(gumbel_perturb(logits, inp.temperature, noise), inp.mask_id)  # [B, W]
    width = inp.logits.shape[1]
    return (expand_window(x0, inp.window, width, inp.mask_id),
            expand_window(softmax_prob(logits, x0), inp.window, width, float("-inf")))


def propose_with_log_probs(inp: StepInput) -> tuple[torch.Tensor, torch.Tensor]:
    """Proposals and float64 log-probabilities over the block window (window coordinates).

    Same proposals and the same random draws as ``propose_with_confidence`` (uniforms of the
    window's shape, float64), but keeps the whole distribution for samplers that need more than
    ``p(x0)``. Returns (x0 [B, W] long, logp [B, W, V] float64).
    """
    logits = window_of(inp.logits, inp.window)  # [B, W, V]
    x0 = propose(logits, inp.temperature, inp.generator, inp.mask_id)  # [B, W]
    return x0, torch.log_softmax(logits, dim=-1, dtype=torch.float64)


def gather_prob(probs: torch.Tensor, tokens: torch.Tensor) -> torch.Tensor:
    """probs: [..., V], tokens: [...] -> [...] probability of each token (``pick_last``)."""
    return pick_last(probs, tokens)


def top_two_margin(probs: torch.Tensor) -> torch.Tensor:
    """p(1) - p(2), the gap between the two largest probabilities. [..., V] -> [...]."""
    top2 = probs.topk(2, dim=-1).values
    return top2[..., 0] - top2[..., 1]


def negative_entropy(probs: torch.Tensor) -> torch.Tensor:
    """Dream's ``sum_v p_v log(p_v + 1e-10)`` (larger = more certain). [..., V] -> [...]."""
    return (probs * torch.log(probs + 1e-10)).sum(dim=-1)


def top_p_filter(logits: torch.Tensor, top_p: float) -> torch.Tensor:
    """Dream's nucleus filter: drop tokens past cumulative probability ``top_p`` (the first kept).

    Dropped logits become ``finfo(dtype).min``. [..., V] -> [..., V] (a new tensor).
    """
    sorted_logits, sorted_idx = torch.sort(logits, descending=True)
    cum = torch.cumsum(torch.softmax(sorted_logits, dim=-1), dim=-1)
    drop_sorted = cum > top_p
    drop_sorted[..., 1:] = drop_sorted[..., :-1].clone()  # shift right: keep the first over
    drop_sorted[..., 0] = False
    drop = torch.zeros_like(drop_sorted).scatter_(-1, sorted_idx, drop_sorted)
    return logits.masked_fill(drop, torch.finfo(logits.dtype).min)


def top_k_filter(logits: torch.Tensor, top_k: int) -> torch.Tensor:
    """Keep the ``top_k`` largest logits per position; the rest become ``finfo(dtype).min``."""
    top_k = min(top_k, logits.shape[-1])
    kth = torch.topk(logits, top_k)[0][..., -1, None]
    return logits.masked_fill(logits < kth, torch.finfo(logits.dtype).min)


def ranks_of(order: torch.Tensor) -> torch.Tensor:
    """Inverse of a per-row permutation: [B, N] sort indices -> [B, N] rank of each entry (the
    permutation's own sort order: one call; its entries are distinct, so the result is unique)."""
    return order.argsort(dim=-1)


def window_of(logits: torch.Tensor, window: tuple[int, int]) -> torch.Tensor:
    """The block window's columns of query-shaped logits [B, Q, ...] -> [B, W, ...]: ``logits``
    itself when the window is the whole query (no call)."""
    ws, we = window
    return logits if ws == 0 and we == logits.shape[1] else logits[:, ws:we]


def expand_window(values: torch.Tensor, window: tuple[int, int], width: int, fill) -> torch.Tensor:
    """Place a [B, W] tensor of the block window into a [B, Q] tensor filled with ``fill`` (one
    ``constant_pad_nd`` call); when the window is the whole query (``reads_block_only`` samplers,
    the dual cache) that is ``values`` itself, no copy."""
    ws, we = window
    if ws == 0 and we == width == values.shape[1]:
        return values
    return F.pad(values, (ws, width - we), value=fill)


def window_output(inp: StepInput, commit: torch.Tensor, tokens: torch.Tensor, score: Optional[torch.Tensor],
                  remask: Optional[torch.Tensor] = None) -> StepOutput:
    """A step's decision computed in block-window coordinates [B, W] -> its ``StepOutput`` in query
    coordinates [B, Q]: off the window nothing is committed or re-masked, tokens are the mask id
    and scores are -inf (a sampler without scores passes None)."""
    width = inp.tokens.shape[1]
    return StepOutput(
        commit=expand_window(commit, inp.window, width, False),
        tokens=expand_window(tokens, inp.window, width, inp.mask_id),
        score=None if score is None else expand_window(score, inp.window, width, float("-inf")),
        remask=None if remask is None else expand_window(remask, inp.window, width, False),
    )
