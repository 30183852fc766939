"""LoPA's per-step selection in two Triton launches (``dllm.samplers.lopa``, arXiv 2512.16229).

A LoPA step around its variant forward is some forty small tensor ops on [N, k, W] tensors (the
anchor's threshold rule, the ranking of the variant positions, the variants' canvases, each
variant's score over its remaining masks, the guard, the winner, its fills and the bonus). Each op
is a kernel launch and a Python dispatch; on a GPU the step is bound by those, not by the math.
Here they are two kernels, one program per batch row, reading the vocabulary statistics that
``dllm.kernels.triton.stats.vocab_stats`` wrote (its ``idx`` [..., 2] / ``val`` [..., 6] tensors,
read in place: no field is sliced out on the host):

- ``lopa_propose``: from the step's statistics, the anchor ``B0'`` (Fast-dLLM's threshold rule on
  the block's active masks: ``p >= tau`` and always the most confident), the ``n_extra`` best other
  masks by the confidence kind (descending, the lower column first on ties: a stable arg-sort), and
  the ``1 + n_extra`` variant canvases (variant 0 = ``B0'``, variant j = ``B0'`` plus position
  ``p_j`` filled; ``p_j = -1`` where a row has fewer candidates: a copy of ``B0'`` that never wins).
- ``lopa_select``: from the variants' statistics, each variant's mean confidence over its remaining
  masks (``+inf`` when none remain), the guard (variant j may win only if variant 0's logits still
  propose its token at ``p_j``), the winner (the first maximum: ties go to the lower variant), its
  fills, and optionally the bonus (the threshold rule on the winner's own statistics).

Same decisions as the torch ops of ``dllm.samplers.lopa`` on the same statistics, except that a
variant's score is a float32 sum taken in another order: two variants whose scores tie within
float32 rounding may swap (the caveat of ``stats="fused"``, which is the only path that runs these).
Tests: tests/kernels/test_triton_lopa.py (the interpreter on CPU, against the torch ops).
"""

from __future__ import annotations

from typing import Optional

import torch
import triton
import triton.language as tl

from dllm.kernels.triton.launch import checked_out, next_pow2, observed_launch
from dllm.kernels.triton.attention import _check_device

_SLOT_TOP1, _SLOT_ENTROPY = 0, 2  # columns of vocab_stats' val tensor [..., 6]


@triton.jit
def _row_start(SRows, SIdx, s_in, s_iw, Active, s_an, s_aw, W, HAS_ROWS: tl.constexpr, BLOCK_W: tl.constexpr):
    """A program's batch row n, its columns, their block masks and its statistics' arg-max (x0, read
    at row SRows[n] when HAS_ROWS)."""
    n = tl.program_id(0).to(tl.int64)
    r = n
    if HAS_ROWS:
        r = tl.load(SRows + n)
    w = tl.arange(0, BLOCK_W)
    inw = w < W
    act = tl.load(Active + n * s_an + w * s_aw, mask=inw, other=0) != 0
    x0 = tl.load(SIdx + r * s_in + w * s_iw, mask=inw, other=0)
    return n, r, w, inw, act, x0


@triton.jit
def _lopa_propose_kernel(
    SIdx, SVal,  # the step's statistics: int64 [M, W, 2] (argmax), float32 [M, W, 6]; any row strides
    SRows,  # int64 [N]: row n's statistics are row SRows[n] (HAS_ROWS), else row n
    Active, Cur,  # bool [N, W], int64 [N, W] (strided views of the block window)
    Variants, At, Anchor,  # out: int64 [N, K, W], int64 [N, K], bool [N, W] (contiguous)
    s_in, s_iw, s_vn, s_vw, s_an, s_aw, s_cn, s_cw,
    W, K, tau,
    CONF_SLOT: tl.constexpr, NEGATE: tl.constexpr, HAS_ROWS: tl.constexpr, BLOCK_W: tl.constexpr,
):
    n, r, w, inw, act, x0 = _row_start(SRows, SIdx, s_in, s_iw, Active, s_an, s_aw, W, HAS_ROWS, BLOCK_W)
    NEG_INF: tl.constexpr = float("-inf")
    top1 = tl.load(SVal + r * s_vn + w * s_vw, mask=inw, other=0.0)
    conf = tl.load(SVal + r * s_vn + w * s_vw + CONF_SLOT, mask=inw, other=0.0)
    if NEGATE:
        conf = -conf
    cur = tl.load(Cur + n * s_cn + w * s_cw, mask=inw, other=0)
    # the threshold rule: p >= tau, and the most confident active mask (the first on ties)
    best = tl.argmax(tl.where(act, top1, NEG_INF), 0, tie_break_left=True)
    anchor = ((top1 >= tau) | (w == best)) & act
    base = tl.where(anchor, x0, cur)
    tl.store(Anchor + n * W + w, anchor, mask=inw)
    tl.store(Variants + n * K * W + w, base, mask=inw)
    tl.store(At + n * K, -1)
    # the variant positions: the best remaining masks in turn
    rank = tl.where(act & (anchor == 0) & inw, conf, NEG_INF)
    for j in range(1, K):
        top = tl.max(rank, 0)
        p = tl.argmax(rank, 0, tie_break_left=True)
        real = top > NEG_INF
        at = tl.where(real, p, -1).to(tl.int64)
        tl.store(At + n * K + j, at)
        tl.store(Variants + n * K * W + j * W + w, tl.where(w == at, x0, base), mask=inw)
        rank = tl.where(w == p, NEG_INF, rank)


@triton.jit
def _lopa_select_kernel(
    VIdx, VVal,  # the variants' statistics: int64 [N * K, W, 2], float32 [N * K, W, 6] (contiguous)
    SIdx, SRows, s_in, s_iw,  # the step's arg-max (x0), as in _lopa_propose_kernel
    Active, s_an, s_aw,
    Variants, At, Anchor,  # _lopa_propose_kernel's outputs
    Commit, Out, Win,  # out: bool [N, W], int64 [N, W], int64 [N] (n * K + the winning variant)
    W, K, tau,
    CONF_SLOT: tl.constexpr, NEGATE: tl.constexpr, VERIFY: tl.constexpr, BONUS: tl.constexpr,
    HAS_ROWS: tl.constexpr, BLOCK_W: tl.constexpr,
):
    n, r, w, inw, act, x0 = _row_start(SRows, SIdx, s_in, s_iw, Active, s_an, s_aw, W, HAS_ROWS, BLOCK_W)
    NEG_INF: tl.constexpr = float("-inf")
    POS_INF: tl.constexpr = float("inf")
    anchor = tl.load(Anchor + n * W + w, mask=inw, other=0) != 0
    cand = act & (anchor == 0)
    base = tl.load(Variants + n * K * W + w, mask=inw, other=0)
    tok0 = tl.load(VIdx + (n * K * W + w) * 2, mask=inw, other=-1)  # variant 0's arg-max
    agrees = tok0 == x0
    best = tl.sum(tl.zeros([BLOCK_W], tl.float32), 0) + NEG_INF  # float32 / int32 scalars for the loop
    win = tl.sum(tl.zeros([BLOCK_W], tl.int32), 0)
    for j in range(0, K):
        at = tl.load(At + n * K + j)
        row = n * K * W + j * W + w
        conf = tl.load(VVal + row * 6 + CONF_SLOT, mask=inw, other=0.0)
        if NEGATE:
            conf = -conf
        rem = cand & (w != at)
        count = tl.sum(rem.to(tl.int32), 0)
        total = tl.sum(tl.where(rem, conf, 0.0), 0)
        score = tl.where(count > 0, total / tl.maximum(count, 1).to(tl.float32), POS_INF)
        valid = (j == 0) | (at >= 0)
        if VERIFY:
            valid = valid & ((j == 0) | (tl.sum(tl.where((w == at) & agrees, 1, 0), 0) > 0))
        score = tl.where(valid, score, NEG_INF)
        take = score > best  # strict: ties go to the lower variant, B0' first
        win = tl.where(take, j, win)
        best = tl.where(take, score, best)
    at_win = tl.load(At + n * K + win)
    won = w == at_win
    commit = anchor | won
    out = tl.where(won, x0, base)
    if BONUS:  # the threshold rule on the winner's own statistics, on the masks it leaves
        wrow = n * K * W + win * W + w
        w_tok = tl.load(VIdx + wrow * 2, mask=inw, other=0)
        w_top1 = tl.load(VVal + wrow * 6, mask=inw, other=0.0)
        elig = act & (commit == 0)
        top = tl.argmax(tl.where(elig, w_top1, NEG_INF), 0, tie_break_left=True)
        more = ((w_top1 >= tau) | (w == top)) & elig
        commit = commit | more
        out = tl.where(more, w_tok, out)
    tl.store(Commit + n * W + w, commit, mask=inw)
    tl.store(Out + n * W + w, out, mask=inw)
    tl.store(Win + n, n * K + win.to(tl.int64))  # the winner's row of the variant batch



def _slot(confidence: str) -> tuple[int, bool]:
    """vocab_stats' val column of the confidence kind, and whether it is negated (entropy)."""
    if confidence == "max_prob":
        return _SLOT_TOP1, False
    if confidence == "negative_entropy":
        return _SLOT_ENTROPY, True
    raise ValueError(f"confidence must be 'negative_entropy' or 'max_prob', got {confidence!r}")


def _check_rows(idx: torch.Tensor, val: Optional[torch.Tensor], rows: Optional[torch.Tensor], n_rows: int,
                width: int) -> None:
    """The step's statistics idx [N | M, W, 2] (and val [.., 6]), unit stride over their last dim (the
    kernels read the fields at offsets 0 .. 5 of a row), and ``rows`` [N] long."""
    lead = n_rows if rows is None else idx.shape[0]
    if (tuple(idx.shape) != (lead, width, 2) or (val is not None and tuple(val.shape) != (lead, width, 6))
            or idx.stride(-1) != 1 or (val is not None and val.stride(-1) != 1)):
        raise ValueError(f"LoPA's statistics must be [{'M' if rows is not None else n_rows}, {width}, 2 / 6] "
                         f"(idx / val) with unit stride over the last dim, got {tuple(idx.shape)} / "
                         f"{None if val is None else tuple(val.shape)}, strides {idx.stride()} / "
                         f"{None if val is None else val.stride()}")
    if rows is not None and (rows.shape != (n_rows,) or rows.dtype != torch.long):
        raise ValueError(f"rows must be a long tensor [{n_rows}], got {rows.dtype} {tuple(rows.shape)}")


def _check_proposal(variants: torch.Tensor, at: torch.Tensor, anchor: torch.Tensor, active: torch.Tensor) -> None:
    """``lopa_select``'s inputs from ``lopa_propose``: contiguous (the kernel reads them row-major, as
    ``lopa_propose`` writes them) and of its shapes and dtypes; ``active`` [N, W] (any strides)."""
    n_rows, k, width = variants.shape
    want = (((n_rows, k, width), torch.long), ((n_rows, k), torch.long), ((n_rows, width), torch.bool))
    got = (variants, at, anchor)
    if any(tuple(t.shape) != shape or t.dtype != dtype or not t.is_contiguous() for t, (shape, dtype) in zip(got, want)):
        raise ValueError(f"lopa_select: variants / at / anchor must be lopa_propose's contiguous "
                         f"{[(str(d), s) for s, d in want]}, got {[(str(t.dtype), tuple(t.shape), t.is_contiguous()) for t in got]}")
    if tuple(active.shape) != (n_rows, width):
        raise ValueError(f"lopa_select: active must be [{n_rows}, {width}] like the variants' rows, got {tuple(active.shape)}")


def lopa_propose(idx: torch.Tensor, val: torch.Tensor, active: torch.Tensor, cur: torch.Tensor, n_extra: int,
                 tau: float, confidence: str, rows: Optional[torch.Tensor] = None,
                 out: Optional[tuple[torch.Tensor, torch.Tensor, torch.Tensor]] = None
                 ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The anchor and the variants of a LoPA step (module docstring) in one launch.

    idx [N, W, 2] / val [N, W, 6]: ``vocab_stats`` of the block's logits (``PackedVocabStats.idx/val``),
    or [M, W, ...] with ``rows`` [N] long: row n's statistics are row ``rows[n]`` (the winners' rows
    of the last step's variant statistics, read in place); active [N, W] bool: the block's masks;
    cur [N, W] long: its tokens; ``n_extra`` (>= 0) variant positions per row. Returns (variants
    [N, 1 + n_extra, W] long, variant 0 = B0'; at [N, 1 + n_extra] long: variant j's filled column,
    -1 for variant 0 and for the copies a row without enough candidates gets; anchor [N, W] bool),
    written into ``out`` when given (three contiguous tensors of those shapes and dtypes, which a
    caller keeps from step to step: no allocation; ``propose_buffers`` makes them)."""
    slot, negate = _slot(confidence)
    _check_device(val, _lopa_propose_kernel)
    n_rows, width = active.shape
    if cur.shape != active.shape:
        raise ValueError(f"lopa_propose: tokens {tuple(cur.shape)} must match active {tuple(active.shape)}")
    _check_rows(idx, val, rows, n_rows, width)
    if not 0 <= n_extra <= width:
        raise ValueError(f"n_extra must be in [0, {width}] (the block's width), got {n_extra}")
    k = 1 + n_extra
    if out is None:
        out = propose_buffers(n_rows, k, width, val.device)
    variants, at, anchor = checked_out("lopa_propose", out, ((n_rows, k, width), (n_rows, k), (n_rows, width)),
                                        (torch.long, torch.long, torch.bool), val.device)
    if n_rows:
        observed_launch("lopa_propose", _lopa_propose_kernel, (n_rows,),
                        idx, val, idx if rows is None else rows, active, cur, variants, at, anchor,
                        idx.stride(0), idx.stride(1), val.stride(0), val.stride(1), active.stride(0),
                        active.stride(1), cur.stride(0), cur.stride(1), width, k, float(tau),
                        CONF_SLOT=slot, NEGATE=negate, HAS_ROWS=rows is not None, BLOCK_W=max(16, next_pow2(width)))
    return variants, at, anchor


def propose_buffers(n_rows: int, k: int, width: int, device: torch.device
                    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Empty outputs of ``lopa_propose``: variants [N, k, W] long, at [N, k] long, anchor [N, W] bool."""
    return (torch.empty((n_rows, k, width), dtype=torch.long, device=device),
            torch.empty((n_rows, k), dtype=torch.long, device=device),
            torch.empty((n_rows, width), dtype=torch.bool, device=device))


def lopa_select(v_idx: torch.Tensor, v_val: torch.Tensor, idx: torch.Tensor, active: torch.Tensor,
                variants: torch.Tensor, at: torch.Tensor, anchor: torch.Tensor, tau: float, confidence: str,
                verify: bool, bonus: bool, rows: Optional[torch.Tensor] = None,
                out: Optional[tuple[torch.Tensor, torch.Tensor, torch.Tensor]] = None
                ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The winner of a LoPA step and what it commits (module docstring) in one launch.

    v_idx [N * K, W, 2] / v_val [N * K, W, 6] (or [N, K, W, ...]): ``vocab_stats`` of the variants'
    logits [N * K, W, V] (contiguous, variant j of row n at n * K + j);
    idx (and ``rows``): the step's statistics as in ``lopa_propose`` (x0 = its arg-max); active, and ``lopa_propose``'s
    variants / at / anchor. ``verify``: the guard; ``bonus``: also the threshold fills of the winner's
    statistics. Returns (commit [N, W] bool, tokens [N, W] long, win [N] long: the winner's row of the
    variant batch [N * K, ...], ``n * K + j`` for variant j of row n), written into ``out`` when given
    (three contiguous tensors of those shapes and dtypes, ``select_buffers``: no allocation)."""
    slot, negate = _slot(confidence)
    _check_device(v_val, _lopa_select_kernel)
    if variants.dim() != 3:
        raise ValueError(f"lopa_select: variants must be [N, K, W], got {tuple(variants.shape)}")
    n_rows, k, width = variants.shape
    _check_proposal(variants, at, anchor, active)
    _check_rows(idx, None, rows, n_rows, width)
    if (v_idx.numel(), v_val.numel(), v_idx.shape[-2], v_val.shape[-2]) != (n_rows * k * width * 2,
                                                                            n_rows * k * width * 6, width, width):
        raise ValueError(f"lopa_select: variant statistics {tuple(v_idx.shape)} / {tuple(v_val.shape)} must "
                         f"be [{n_rows * k}, {width}, 2 / 6]: the variants' {(n_rows, k, width)} flattened")
    if not (v_idx.is_contiguous() and v_val.is_contiguous()):
        raise ValueError("lopa_select needs contiguous variant statistics (as vocab_stats writes them)")
    if out is None:
        out = select_buffers(n_rows, width, v_val.device)
    commit, tokens, win = checked_out("lopa_select", out, ((n_rows, width), (n_rows, width), (n_rows,)),
                                       (torch.bool, torch.long, torch.long), v_val.device)
    if n_rows:
        observed_launch("lopa_select", _lopa_select_kernel, (n_rows,),
                        v_idx, v_val, idx, idx if rows is None else rows, idx.stride(0), idx.stride(1), active,
                        active.stride(0),
                        active.stride(1), variants, at, anchor, commit, tokens, win, width, k, float(tau),
                        CONF_SLOT=slot, NEGATE=negate, VERIFY=bool(verify), BONUS=bool(bonus),
                        HAS_ROWS=rows is not None, BLOCK_W=max(16, next_pow2(width)))
    return commit, tokens, win


def select_buffers(n_rows: int, width: int, device: torch.device) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Empty outputs of ``lopa_select``: commit [N, W] bool, tokens [N, W] long, win [N] long."""
    return (torch.empty((n_rows, width), dtype=torch.bool, device=device),
            torch.empty((n_rows, width), dtype=torch.long, device=device),
            torch.empty((n_rows,), dtype=torch.long, device=device))


__all__ = ["lopa_propose", "lopa_select", "propose_buffers", "select_buffers"]
