"""Fused per-row vocabulary statistics in Triton: one pass over the logits, a few numbers per row.

Every sampler step needs, per active position, some of: the arg-max without the mask token, its
probability, the top-2 probability margin, the entropy, the raw top-2 logit gap, and at T > 0 a
Gumbel-max draw. The references get them from a float64 softmax over [B, L, V] (518 MB per step for
LLaDA at L = 512). This kernel reads each row of logits once, in tiles of BLOCK_V, and keeps only
running scalars in float32 (m = running max, Z = sum exp(l - m), S = sum exp(l - m)(l - m)):

    when the max grows m -> m':   Z <- Z e^(m-m') + sum_tile e^(l-m')
                                  S <- e^(m-m') (S + (m - m') Z) + sum_tile e^(l-m') (l - m')
    at the end:                   lse = m + log Z,  entropy = log Z - S / Z

plus the two largest logits (for margin and gap), the best allowed logit (banned id excluded) with
its first index, and the best Gumbel-perturbed score with its index and raw logit.

Outputs (``PackedVocabStats``: the fields of ``dllm.kernels.reference.VocabStats``, views of two
tensors): argmax, top1_prob, margin, entropy, gap, lse, and at
T > 0 sample, sample_prob. Shapes follow the leading dims of the logits.

Random numbers at T > 0, two ways:
- ``uniforms=`` a tensor like the logits (float32 or float64): the draw is then the same arg-max as
  LLaDA's ``exp(l) / (-log u)^T`` on those uniforms (up to float32 rounding of near-ties), so a
  sampler can keep its torch random stream.
- ``seed=`` an int: uniforms from Philox (``tl.rand``) keyed by (seed, row * V + v), generated in
  registers. Reproducible and independent of tiling, but NOT torch's random stream: the same seed
  gives different tokens from ``torch.rand`` + the reference formula.

Float32 accumulation (the references use float64 in Fast-dLLM, bf16 in LLaDA HEAD and Dream); the
plain-PyTorch neighbour is ``dllm.kernels.reference.vocab_stats_reference``.

Non-finite logits give what torch gives on the reference (``VocabStats``): NaN ranks above every
number in the arg-max, the sample and the top-2; a row with a NaN or a +inf has NaN probabilities
(``top1_prob``, ``margin``, ``entropy``, ``sample_prob``), ``lse`` +inf (NaN with a NaN). The
kernel reads NaN as -inf in its reductions (a NaN in a max reduction gives a tree-dependent result)
and keeps per-row flags instead; no host read.
"""

from __future__ import annotations

from typing import Any, Optional

import torch
import triton
import triton.language as tl

from dllm.kernels.reference import VocabStats
from dllm.kernels.triton.launch import checked_out, next_pow2 as _next_pow2, observed_launch
from dllm.kernels.triton.attention import _check_device, _interpreted

_NOISE_NONE, _NOISE_EXTERNAL, _NOISE_PHILOX = 0, 1, 2


# ``banned`` (the mask id) is not specialized: Triton makes an int argument equal to 1 a compile-time
# constant, and then ``banned == 0`` is a Python bool with no ``.to`` (the embedded models' mask id is 1)
@triton.jit(do_not_specialize=["banned"])
def _vocab_stats_kernel(
    X,  # logits [B, W, V] (any row strides, unit stride over V)
    U,  # uniforms [B, W, V] when NOISE == 1
    OutIdx,  # int64 [N, 2]: argmax, sample
    OutVal,  # float32 [N, 6]: top1_prob, margin, entropy, gap, lse, sample_prob
    stride_xb, stride_xw, stride_ub, stride_uw,
    W, V, banned, inv_temp, seed,
    BLOCK_V: tl.constexpr, NOISE: tl.constexpr,
):
    row = tl.program_id(0)
    b = row // W
    w = row % W
    x_row = X + b.to(tl.int64) * stride_xb + w.to(tl.int64) * stride_xw
    u_row = U + b.to(tl.int64) * stride_ub + w.to(tl.int64) * stride_uw
    cols0 = tl.arange(0, BLOCK_V)
    NEG_INF: tl.constexpr = float("-inf")

    zero = tl.sum(tl.zeros([BLOCK_V], tl.float32), 0)  # a float32 scalar to seed the loop carries
    izero = tl.sum(tl.zeros([BLOCK_V], tl.int32), 0)  # an int32 scalar (flags: 0 / 1)
    POS_INF: tl.constexpr = float("inf")
    m = zero + NEG_INF  # running max of the finite logits
    z = zero  # sum exp(l - m) over the finite logits
    s = zero  # sum exp(l - m) (l - m)
    v1 = zero + NEG_INF  # largest logit (all ids, NaN left out)
    v2 = zero + NEG_INF  # second largest (all ids; equal to v1 on a tie)
    any_nan = izero  # 1 once a NaN logit was read (any id, the banned one included)
    a_val = zero + NEG_INF  # best allowed logit
    # its first index; a row whose allowed ids are all -inf keeps the lowest allowed id (0, or 1 when
    # 0 is banned), as ``argmax_excluding`` does: never -1, never the banned id
    a_idx = izero + (banned == 0).to(tl.int32)
    a_nan = izero  # 1 once an allowed NaN was read: a_idx is then the first one (torch's arg-max)
    g_val = zero + NEG_INF  # best perturbed score
    g_idx = a_idx
    g_nan = izero  # 1 once an allowed NaN score was read: g_idx is then the first one
    g_logit = zero + NEG_INF  # raw logit of the best perturbed id

    for start in range(0, V, BLOCK_V):
        cols = start + cols0
        in_row = cols < V
        x_raw = tl.load(x_row + cols, mask=in_row, other=NEG_INF).to(tl.float32)
        # torch's order puts NaN above every number (argmax, topk); here every max / arg-max reads the
        # logits with NaN at -inf (no NaN in a reduction: its result would depend on the tree) and the
        # NaNs are tracked apart: the first allowed one is the arg-max, any one makes the row's float
        # statistics NaN (set at the end)
        is_nan = x_raw != x_raw
        x = tl.where(is_nan, NEG_INF, x_raw)
        any_nan = tl.maximum(any_nan, tl.max(is_nan.to(tl.int32), 0))
        # -- top-2 over all ids (ties: the second equals the first)
        t1 = tl.max(x, 0)
        t1_at = tl.argmax(x, 0, tie_break_left=True)
        t2 = tl.max(tl.where(cols0 == t1_at, NEG_INF, x), 0)
        better = t1 > v1  # strict: an earlier tile keeps its (lower) index on a tie
        v2 = tl.where(better, tl.maximum(v1, t2), tl.maximum(v2, t1))
        v1 = tl.where(better, t1, v1)
        # -- best allowed id (the banned one never wins; the first allowed NaN beats every number)
        allowed = in_row & (cols != banned)
        nan_at = tl.min(tl.where(allowed & is_nan, cols0, BLOCK_V), 0)
        take_nan = (a_nan == 0) & (nan_at < BLOCK_V)
        a_idx = tl.where(take_nan, start + nan_at, a_idx)
        a_nan = tl.where(take_nan, 1, a_nan)
        xa = tl.where(allowed, x, NEG_INF)
        ta = tl.max(xa, 0)
        ta_at = tl.argmax(xa, 0, tie_break_left=True)
        take = (ta > a_val) & (a_nan == 0)
        a_idx = tl.where(take, start + ta_at, a_idx)
        a_val = tl.where(take, ta, a_val)
        # -- rescale the running sums to the new max, add the tile (finite logits only: a row with a
        # +inf or a NaN gets its softmax statistics at the end, as torch gives them)
        xf = tl.where(x == POS_INF, NEG_INF, x)
        m_new = tl.maximum(m, tl.max(xf, 0))
        m_shift = tl.where(m_new == NEG_INF, 0.0, m_new)  # nothing finite yet: no rescale
        alpha = tl.exp(m - m_shift)
        e = tl.exp(xf - m_shift)
        d = tl.where(e > 0, xf - m_shift, 0.0)  # -inf logits add nothing (and no 0 * inf)
        shift = tl.where(m == NEG_INF, 0.0, m - m_shift)  # z = 0 while m = -inf
        s = alpha * (s + shift * z) + tl.sum(e * d, 0)
        z = z * alpha + tl.sum(e, 0)
        m = m_new
        # -- Gumbel-max: argmax l / T - log(-log u) over allowed ids (a NaN score, from a NaN logit or
        # +inf - inf, wins as in torch's arg-max of the reference scores)
        if NOISE != 0:
            if NOISE == 1:
                u = tl.load(u_row + cols, mask=in_row, other=0.5)
                expo = (-tl.log(u)).to(tl.float32)  # -log u in the uniforms' precision (u near 1)
            else:
                u = tl.rand(seed, row.to(tl.int64) * V + cols)
                expo = -tl.log(u)
            raw = x_raw * inv_temp - tl.log(expo)
            bad = allowed & (raw != raw)
            gnan_at = tl.min(tl.where(bad, cols0, BLOCK_V), 0)
            take_gnan = (g_nan == 0) & (gnan_at < BLOCK_V)
            g_idx = tl.where(take_gnan, start + gnan_at, g_idx)
            g_nan = tl.where(take_gnan, 1, g_nan)
            score = tl.where(allowed & (raw == raw), raw, NEG_INF)
            tg = tl.max(score, 0)
            tg_at = tl.argmax(score, 0, tie_break_left=True)
            tg_logit = tl.sum(tl.where(cols0 == tg_at, x, 0.0), 0)
            take_g = (tg > g_val) & (g_nan == 0)
            g_idx = tl.where(take_g, start + tg_at, g_idx)
            g_logit = tl.where(take_g, tg_logit, g_logit)
            g_val = tl.where(take_g, tg, g_val)

    # torch's softmax of a row with a NaN or a +inf is NaN everywhere; its logsumexp is NaN with a NaN,
    # else +inf with a +inf; its top-2 puts NaN first
    nan_row = any_nan != 0
    undefined = nan_row | (v1 == POS_INF)
    inv_z = 1.0 / z
    nan = zero + float("nan")
    tl.store(OutIdx + row * 2, a_idx.to(tl.int64))
    tl.store(OutVal + row * 6 + 0, tl.where(undefined, nan, tl.exp(a_val - m) * inv_z))
    tl.store(OutVal + row * 6 + 1, tl.where(undefined, nan, (tl.exp(v1 - m) - tl.exp(v2 - m)) * inv_z))
    tl.store(OutVal + row * 6 + 2, tl.where(undefined, nan, tl.log(z) - s * inv_z))
    tl.store(OutVal + row * 6 + 3, tl.where(nan_row, nan, v1 - v2))
    tl.store(OutVal + row * 6 + 4, tl.where(nan_row, nan, tl.where(v1 == POS_INF, POS_INF, m + tl.log(z))))
    if NOISE != 0:
        tl.store(OutIdx + row * 2 + 1, g_idx.to(tl.int64))
        tl.store(OutVal + row * 6 + 5, tl.where(undefined, nan, tl.exp(g_logit - m) * inv_z))


def vocab_stats(
    logits: torch.Tensor,  # [..., V] float32 / float16 (bfloat16 on GPU)
    *,
    banned: Optional[int] = None,  # never returned as arg-max or sample (the mask token)
    temperature: float = 0.0,
    uniforms: Optional[torch.Tensor] = None,  # [..., V] in (0, 1); or
    seed: Optional[int] = None,  # Philox seed (not torch's stream)
    block_v: Optional[int] = None,
    out: Optional[tuple[torch.Tensor, torch.Tensor]] = None,  # (idx [..., 2] int64, val [..., 6] float32)
) -> "PackedVocabStats":
    """Per-row statistics of ``logits`` in one fused pass (see the module docstring and
    ``VocabStats`` for the fields). At ``temperature > 0`` pass exactly one of ``uniforms`` /
    ``seed``. Float fields are float32, ``argmax`` / ``sample`` int64; shapes are ``logits.shape[:-1]``.
    ``out``: the two output tensors to write (contiguous, ``logits.shape[:-1]`` + (2,) int64 and + (6,)
    float32, on the logits' device), which a caller keeps from step to step: no allocation.

    >>> st = vocab_stats(logits[:, ws:we], banned=mask_id)  # doctest: +SKIP
    >>> x0, conf = st.argmax, st.top1_prob
    """
    if logits.dim() == 0 or logits.shape[-1] < 2:
        raise ValueError(f"logits must be [..., V] with V >= 2, got {tuple(logits.shape)}")
    if logits.dtype not in (torch.float32, torch.float16, torch.bfloat16):
        raise TypeError(f"logits must be float32/float16/bfloat16, got {logits.dtype}")
    _check_device(logits, _vocab_stats_kernel)
    lead, vocab = logits.shape[:-1], logits.shape[-1]
    if not temperature >= 0:  # NaN too (it failed both tests below and drew nothing)
        raise ValueError(f"temperature must be a number >= 0, got {temperature}")
    noise = _NOISE_NONE
    if temperature > 0:
        if (uniforms is None) == (seed is None):
            raise ValueError("temperature > 0 needs exactly one of uniforms= (a tensor like the logits) "
                             "or seed= (Philox)")
        noise = _NOISE_EXTERNAL if uniforms is not None else _NOISE_PHILOX
    if block_v is not None and (isinstance(block_v, bool) or not isinstance(block_v, int) or block_v < 1
                                or block_v & (block_v - 1)):
        raise ValueError(f"block_v must be a power of two (logits per tile), got {block_v!r}")
    if banned is not None and not 0 <= banned < vocab:
        raise ValueError(f"banned id {banned} is outside the vocabulary [0, {vocab})")

    x3 = _rows3(logits)  # [B, W, V] view when possible
    u3 = x3
    if noise == _NOISE_EXTERNAL:
        assert uniforms is not None
        if uniforms.shape != logits.shape:
            raise ValueError(f"uniforms must have the logits' shape {tuple(logits.shape)}, got {tuple(uniforms.shape)}")
        if uniforms.dtype not in (torch.float32, torch.float64):
            raise TypeError(f"uniforms must be float32/float64, got {uniforms.dtype}")
        u3 = _rows3(uniforms)
    n = x3.shape[0] * x3.shape[1]
    out_idx, out_val = (stats_buffers(lead, logits.device) if out is None  # every read slot is written
                        else checked_out("vocab_stats", out, ((*lead, 2), (*lead, 6)), STATS_DTYPES, logits.device))
    if n:
        interp = _interpreted(_vocab_stats_kernel)
        block = block_v if block_v is not None else min(_next_pow2(vocab), 1024 if interp else 2048)
        launch = {} if interp else {"num_warps": 8 if block >= 2048 else 4}
        observed_launch(
            "vocab_stats", _vocab_stats_kernel, (n,),
            x3, u3, out_idx, out_val,
            x3.stride(0), x3.stride(1), u3.stride(0), u3.stride(1),
            x3.shape[1], vocab, -1 if banned is None else banned,
            1.0 / temperature if temperature > 0 else 0.0, 0 if seed is None else int(seed),
            BLOCK_V=block, NOISE=noise, **launch,
        )
    return PackedVocabStats(out_idx, out_val, sampled=noise != _NOISE_NONE)


STATS_DTYPES = (torch.int64, torch.float32)  # vocab_stats' two outputs: idx [..., 2] and val [..., 6]


def stats_buffers(lead: tuple[int, ...], device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
    """Empty outputs of ``vocab_stats`` for logits [*lead, V]: idx [*lead, 2] int64, val [*lead, 6] float32."""
    return (torch.empty((*lead, 2), dtype=STATS_DTYPES[0], device=device),
            torch.empty((*lead, 6), dtype=STATS_DTYPES[1], device=device))


def _field(name: str, tensor: str, col: int, sampled_only: bool = False) -> property:
    """A ``PackedVocabStats`` field: the view ``<tensor>[..., col]``, made once (None for a sample
    field of statistics taken at T = 0)."""
    def get(self: "PackedVocabStats") -> Optional[torch.Tensor]:
        if sampled_only and not self.sampled:
            return None
        got = self._views.get(name)
        if got is None:
            got = self._views[name] = getattr(self, tensor)[..., col]
        return got

    return property(get, doc=f"``VocabStats.{name}``: ``{tensor}[..., {col}]``")


class PackedVocabStats:
    """``VocabStats``' fields as views of the kernel's two outputs, each made on its first read:
    ``idx`` int64 [..., 2] (argmax, sample) and ``val`` float32 [..., 6] (top1_prob, margin, entropy,
    gap, lse, sample_prob). A caller that reads one field issues one view, not eight; a kernel that
    reads the statistics takes ``idx`` / ``val`` themselves (``dllm.kernels.triton.lopa``)."""

    FIELDS = VocabStats.FIELDS

    def __init__(self, idx: torch.Tensor, val: torch.Tensor, sampled: bool) -> None:
        self.idx, self.val, self.sampled = idx, val, sampled
        self._views: dict[str, torch.Tensor] = {}

    argmax = _field("argmax", "idx", 0)
    top1_prob = _field("top1_prob", "val", 0)
    margin = _field("margin", "val", 1)
    entropy = _field("entropy", "val", 2)
    gap = _field("gap", "val", 3)
    lse = _field("lse", "val", 4)
    sample = _field("sample", "idx", 1, sampled_only=True)
    sample_prob = _field("sample_prob", "val", 5, sampled_only=True)

    def rows(self, index: Any) -> "PackedVocabStats":
        """The statistics of ``t[index]`` for an index of the leading dims (two indexing calls)."""
        return PackedVocabStats(self.idx[index], self.val[index], self.sampled)


def _rows3(t: torch.Tensor) -> torch.Tensor:
    """[..., V] -> [B, W, V] with unit stride over V, as a view when the strides allow (a slice
    ``logits[:, ws:we]`` stays a view); otherwise a copy."""
    if t.stride(-1) != 1:
        t = t.contiguous()
    if t.dim() == 1:
        return t[None, None]
    if t.dim() == 2:
        return t[:, None]
    if t.dim() == 3:
        return t
    return t.reshape(-1, t.shape[-2], t.shape[-1])


__all__ = ["PackedVocabStats", "STATS_DTYPES", "stats_buffers", "vocab_stats", "VocabStats"]
