"""Flash-attention forward in Triton for the cached steps of full-attention dLLMs.

The cached step (``dllm.cache``) runs a short query block against a long key set: queries
q [B, H, Tq, D] (the block, or the window) and keys/values k, v [B, Hkv, Tk, D] read straight from
the preallocated K/V buffers. This kernel computes

    out[b, h, t] = softmax_j(q[b, h, t] . k[b, h // g, j] * scale  | allowed(b, t, j)) @ v[b, h // g]

with online softmax (running max and denominator per query row, float32 accumulators), so neither
the [Tq, Tk] scores nor a [Tq, Tk] mask are ever materialised, and without copying K/V per query
head (g = H / Hkv; query head h reads KV head h // g, as ``repeat_interleave`` does in LLaDA and
Qwen2). Allowed keys are described per key and per row, never per (query, key) pair, by two int32
vectors:

    allowed(b, t, j) = j < key_end[b]  and  key_count[b, j] >= query_threshold[b, t]

which express exactly the masks whose rows' allowed-key sets are nested (totally ordered by
inclusion): with key_count[j] = the number of rows that may attend key j and query_threshold[t] =
the smallest count among row t's keys (``dllm.kernels.triton.padding.nested_thresholds``). That covers
key padding, pad queries that attend to everything, block-causal masks (SDAR, arXiv 2510.06303;
Fast-dLLM v2; LLaDA 2) and their ANDs. The older arguments ``key_padding`` (the canvas padding mask)
and ``query_attends_all`` (pad queries that see every key: ``keys | pad_queries``) are special cases,
turned into the two vectors (counts 0/1; thresholds 1, or 0 for such a row).
``key_end`` lets a caller pass a whole buffer and have the keys past a window ignored.

A cached step has few query tiles against thousands of keys, so on a GPU the keys are also split
into ranges run by separate programs (flash-decoding); each writes a float32 partial output and
its log-sum-exp, and one more kernel merges them (``num_splits``: ``dllm.kernels.triton.launch``; 1 in the
interpreter unless asked for).

Public API:
- ``flash_attention(q, k, v, key_padding=, query_attends_all=, key_end=, key_count=, query_threshold=,
  return_lse=, num_splits=)`` -> out [, lse [B, H, Tq] float32] — the kernel contract.
- ``triton_attention(q, k, v, mask=None, return_probs=False)`` — the ``attn_backend="triton"``
  function: turns boolean masks ([B, 1, 1, Tk], the models', or [B, 1, Tq, Tk] with nested rows:
  padding, block-causal) into the contract's vectors (``dllm.kernels.triton.padding``); refuses other
  masks and ``return_probs``.
- ``unavailable_reason()`` — None when the kernel can run here, else why not.

Dtypes: float32 (dot products in IEEE fp32, not TF32), float16 and, on a GPU only, bfloat16; the
output has q's dtype. The plain-PyTorch neighbour is ``dllm.kernels.reference.attention_reference``.

Notes:
- 2026-11-29, triton 3.9: the CPU interpreter (TRITON_INTERPRET=1) treats bfloat16 as raw uint16
  bits (triton-lang/triton#11584), so bf16 is refused there; fp32/fp16 are exact enough to test.
- A query row with no allowed key returns 0 (and lse -inf) instead of NaN.
- Tested on CPU under the interpreter only so far: GPU compilation, bf16, tile sizes / num_warps and
  the split heuristic (``dllm.kernels.triton.launch``) still need a GPU run (``pytest tests/kernels`` and ``dllm bench kernels``).
"""

from __future__ import annotations

import functools
import math
import os
from typing import Any, Optional, Union

import torch
import triton
import triton.language as tl

from dllm.kernels.triton.launch import next_pow2, observed_launch, plan_attention, recording
from dllm.kernels.reference import key_end_tensor
from dllm.kernels.triton.padding import UnsupportedMaskError, mask_to_thresholds


def _interpreted(fn) -> bool:
    """True when ``fn`` was decorated under TRITON_INTERPRET=1 (runs on CPU tensors)."""
    return type(fn).__name__ == "InterpretedFunction"


# ----------------------------------------------------------------------------------------------
# Kernel


@triton.jit
def _attn_fwd_kernel(
    Q, K, V, Out, Lse,  # q/out [B, H, Tq, D]; k/v [B, Hkv, Tk, D]; lse [B, H, Tq] float32
    # (split: out [S, B, H, Tq, D] float32 partials, lse [S, B, H, Tq]; split s owns key tiles
    #  [s * split_len, (s + 1) * split_len), and the wrapper merges the partials by their lse)
    KeyCnt, RowThr, KeyEnd,  # int32 [B, Tk], int32 [B, Tq]: key j allowed to row t iff cnt >= thr; int32 [B]
    stride_qb, stride_qh, stride_qt, stride_qd,
    stride_kb, stride_kh, stride_kt, stride_kd,
    stride_vb, stride_vh, stride_vt, stride_vd,
    stride_ob, stride_oh, stride_ot, stride_od,
    stride_cb, stride_cj,  # KeyCnt
    stride_rb, stride_rt,  # RowThr
    H, Tq, Tk, qk_scale,  # qk_scale = sm_scale * log2(e): softmax in base 2 (exp2 is the cheap one)
    split_len, stride_os, stride_ls,  # keys per split (a multiple of BLOCK_N); split strides of Out, Lse
    GROUPS: tl.constexpr,  # H // Hkv
    HEAD_DIM: tl.constexpr, BLOCK_D: tl.constexpr,  # BLOCK_D = next power of two >= max(HEAD_DIM, 16)
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
    HAS_MASK: tl.constexpr, HAS_KEY_END: tl.constexpr,
    WRITE_LSE: tl.constexpr, DOT_PRECISION: tl.constexpr,
):
    tl.static_assert(BLOCK_M >= 16 and BLOCK_N >= 16 and BLOCK_D >= 16)
    pid_m = tl.program_id(0)
    pid_bh = tl.program_id(1)
    split = tl.program_id(2)
    b = (pid_bh // H).to(tl.int64)  # 64-bit batch/head offsets: a [R, Hkv, L, D] buffer can pass 2^31
    h = (pid_bh % H).to(tl.int64)
    hk = h // GROUPS  # GQA: the KV head of this query head, no K/V copy

    offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)  # query rows
    offs_n = tl.arange(0, BLOCK_N)
    offs_d = tl.arange(0, BLOCK_D)
    d_ok = offs_d < HEAD_DIM
    m_ok = offs_m < Tq

    # q stays in registers for the whole key loop
    q_ptrs = Q + b * stride_qb + h * stride_qh + offs_m[:, None] * stride_qt + offs_d[None, :] * stride_qd
    q = tl.load(q_ptrs, mask=m_ok[:, None] & d_ok[None, :], other=0.0)
    k_base = K + b * stride_kb + hk * stride_kh
    v_base = V + b * stride_vb + hk * stride_vh

    if HAS_KEY_END:
        kend = tl.minimum(tl.load(KeyEnd + b), Tk)
    else:
        kend = Tk
    if HAS_MASK:
        thr = tl.load(RowThr + b * stride_rb + offs_m * stride_rt, mask=m_ok, other=0)  # [BLOCK_M] int32

    m_i = tl.full([BLOCK_M], float("-inf"), tl.float32)  # running max of the base-2 scores
    l_i = tl.zeros([BLOCK_M], tl.float32)  # running denominator
    acc = tl.zeros([BLOCK_M, BLOCK_D], tl.float32)

    lo = split * split_len
    hi = tl.minimum(lo + split_len, kend)
    for start_n in range(lo, hi, BLOCK_N):
        cols = start_n + offs_n
        n_ok = cols < hi
        # -- compute qk
        k = tl.load(k_base + cols[:, None] * stride_kt + offs_d[None, :] * stride_kd,
                    mask=n_ok[:, None] & d_ok[None, :], other=0.0)
        s = tl.dot(q, tl.trans(k), input_precision=DOT_PRECISION) * qk_scale  # [BLOCK_M, BLOCK_N]
        # -- mask as broadcast comparisons: per key, per query row; never a [Tq, Tk] tensor
        if HAS_MASK:
            cnt = tl.load(KeyCnt + b * stride_cb + cols * stride_cj, mask=n_ok, other=0)  # [BLOCK_N] int32
            ok = (cnt[None, :] >= thr[:, None]) & n_ok[None, :]
        else:
            ok = n_ok[None, :]
        s = tl.where(ok, s, float("-inf"))
        # -- update m_i and l_i (a row with nothing allowed yet keeps m = -inf: shift by 0 instead)
        m_new = tl.maximum(m_i, tl.max(s, 1))
        m_shift = tl.where(m_new == float("-inf"), 0.0, m_new)
        p = tl.math.exp2(s - m_shift[:, None])
        alpha = tl.math.exp2(m_i - m_shift)
        l_i = l_i * alpha + tl.sum(p, 1)
        # -- update the output accumulator
        v = tl.load(v_base + cols[:, None] * stride_vt + offs_d[None, :] * stride_vd,
                    mask=n_ok[:, None] & d_ok[None, :], other=0.0)
        acc = acc * alpha[:, None] + tl.dot(p.to(v.dtype), v, input_precision=DOT_PRECISION)
        m_i = m_new

    empty = l_i == 0.0  # no allowed key: output 0, lse -inf
    acc = acc / tl.where(empty, 1.0, l_i)[:, None]
    o_ptrs = Out + split * stride_os + b * stride_ob + h * stride_oh + offs_m[:, None] * stride_ot + offs_d[None, :] * stride_od
    tl.store(o_ptrs, acc.to(Out.dtype.element_ty), mask=m_ok[:, None] & d_ok[None, :])
    if WRITE_LSE:
        lse = tl.where(empty, float("-inf"), (m_i + tl.math.log2(tl.where(empty, 1.0, l_i))) * 0.6931471805599453)
        tl.store(Lse + split * stride_ls + pid_bh.to(tl.int64) * Tq + offs_m, lse, mask=m_ok)


# ----------------------------------------------------------------------------------------------
# Wrapper


def unavailable_reason() -> Optional[str]:
    """None when the kernel can run here; otherwise a sentence saying why not."""
    if _interpreted(_attn_fwd_kernel):
        return None
    if os.environ.get("TRITON_INTERPRET") == "1":
        return ("TRITON_INTERPRET=1 was set after dllm.kernels.triton.attention was imported; set it "
                "before (in the shell or a conftest) to run the kernels on CPU")
    if not torch.cuda.is_available():
        return ("no CUDA device, and TRITON_INTERPRET=1 is not set (triton has no CPU backend; the "
                "interpreter runs the kernels slowly on CPU, for tests)")
    return None


def _check_device(t: torch.Tensor, kernel) -> None:
    if recording() is not None:  # launches recorded for a GPU target, run nowhere (dllm.kernels.triton.ahead)
        return
    if _interpreted(kernel):
        if t.dtype == torch.bfloat16:
            raise TypeError("bfloat16 is not supported by the Triton interpreter (it treats bf16 as raw "
                            "uint16 bits); use float32/float16 on CPU, or run on a GPU")
    elif t.device.type != "cuda":
        raise ValueError(f"the Triton kernels need CUDA tensors (got {t.device}); on CPU set "
                         "TRITON_INTERPRET=1 before importing triton")


def flash_attention(
    q: torch.Tensor,  # [B, H, Tq, D]
    k: torch.Tensor,  # [B, Hkv, Tk, D]
    v: torch.Tensor,  # [B, Hkv, Tk, D]
    key_padding: Optional[torch.Tensor] = None,  # bool [B, Tk], True = real key
    query_attends_all: Optional[torch.Tensor] = None,  # bool [B, Tq], True = ignore key_padding
    key_end: Union[int, torch.Tensor, None] = None,  # int or [B]: keys at or past it are ignored
    *,
    key_count: Optional[torch.Tensor] = None,  # int32 [B, Tk] } key j allowed to row t iff
    query_threshold: Optional[torch.Tensor] = None,  # int32 [B, Tq] } key_count[j] >= query_threshold[t]
    sm_scale: Optional[float] = None,  # default 1 / sqrt(D)
    return_lse: bool = False,
    block_m: Optional[int] = None,
    block_n: Optional[int] = None,
    num_splits: Optional[int] = None,
    num_warps: Optional[int] = None,
    num_stages: Optional[int] = None,
) -> Union[torch.Tensor, tuple[torch.Tensor, torch.Tensor]]:
    """Bidirectional GQA attention of a query block against a key set, see the module docstring.

    Returns out [B, H, Tq, D] in q's dtype, plus lse [B, H, Tq] float32 (natural log of the softmax
    denominator of the scaled scores) when ``return_lse``. Any strides are accepted (e.g. a slice
    ``buf[:, :, :key_end]`` of a cache buffer); nothing is copied except the bool masks (to int32).

    The mask: either ``key_count`` and ``query_threshold`` (any int32 values, strides 0 allowed:
    ``dllm.kernels.triton.padding.mask_to_thresholds`` builds them from a bool mask with nested rows,
    e.g. block-causal), or ``key_padding`` (optionally with ``query_attends_all``), or none.

    num_splits: split the keys into this many ranges run by separate programs (flash-decoding), then
    merge the float32 partial outputs by their lse. A cached step has few query tiles (B x H x
    Tq / BLOCK_M programs, e.g. 32 for LLaDA-8B with a 32-token block) against thousands of keys,
    too few programs to fill a GPU; default: ``dllm.kernels.triton.launch.plan_splits`` for the device's
    SM count (1 in the interpreter). block_m / block_n: see ``dllm.kernels.triton.launch.plan_attention``.
    num_warps / num_stages: the compiled kernel's launch options (default 4 and 3 up to head dim 128,
    else 8 and 2; the interpreter ignores them): ``dllm bench kernels --tiles`` times other choices.

    >>> out = flash_attention(q, k, v, key_padding=valid, key_end=64)  # doctest: +SKIP
    """
    if q.dim() != 4 or k.dim() != 4 or v.dim() != 4:
        raise ValueError(f"q, k, v must be 4-D [B, H, T, D], got {tuple(q.shape)}, {tuple(k.shape)}, {tuple(v.shape)}")
    bsz, h, tq, d = q.shape
    hkv, tk = k.shape[1], k.shape[2]
    if k.shape != v.shape or k.shape[0] != bsz or k.shape[3] != d:
        raise ValueError(f"k and v must be [B={bsz}, Hkv, Tk, D={d}] and equal, got {tuple(k.shape)}, {tuple(v.shape)}")
    if hkv == 0 or h % hkv:
        raise ValueError(f"query heads ({h}) must be a multiple of key/value heads ({hkv})")
    if not (q.dtype == k.dtype == v.dtype) or q.dtype not in (torch.float32, torch.float16, torch.bfloat16):
        raise TypeError(f"q, k, v must share one dtype among float32/float16/bfloat16, got {q.dtype}, {k.dtype}, {v.dtype}")
    if d > 256:
        raise ValueError(f"head dim {d} > 256 is not supported")
    _check_device(q, _attn_fwd_kernel)
    if num_warps is not None and num_warps not in (1, 2, 4, 8, 16):
        raise ValueError(f"num_warps must be a power of two from 1 to 16, got {num_warps!r}")
    if num_stages is not None and (isinstance(num_stages, bool) or not isinstance(num_stages, int) or num_stages < 1):
        raise ValueError(f"num_stages must be an int >= 1, got {num_stages!r}")
    if recording() is None and (k.device != q.device or v.device != q.device):
        raise ValueError(f"q, k, v must be on one device, got {q.device}, {k.device}, {v.device}")
    keys, rows = f"B={bsz}, Tk={tk}", f"B={bsz}, Tq={tq}"
    for name, flags, dims, dtype in (("key_padding", key_padding, keys, torch.bool),
                                     ("query_attends_all", query_attends_all, rows, torch.bool),
                                     ("key_count", key_count, keys, torch.int32),
                                     ("query_threshold", query_threshold, rows, torch.int32)):
        # exact dtypes: a float 0.5 key_padding cast to int would mask its key
        shape = (bsz, tk) if dims is keys else (bsz, tq)
        if flags is not None and (tuple(flags.shape) != shape or flags.dtype != dtype
                                  or (recording() is None and flags.device != q.device)):
            raise ValueError(f"{name} must be {str(dtype).removeprefix('torch.')} [{dims}] on {q.device}, got "
                             f"{flags.dtype} {tuple(flags.shape)} on {flags.device}")
    if (key_count is None) != (query_threshold is None):
        raise ValueError("key_count and query_threshold go together (allowed iff key_count >= query_threshold); "
                         f"got only {'key_count' if query_threshold is None else 'query_threshold'}")
    if key_count is not None and (key_padding is not None or query_attends_all is not None):
        raise ValueError("pass the mask either as key_count/query_threshold or as key_padding/query_attends_all, not both")
    if key_padding is not None:  # the same contract: counts 0/1, thresholds 1 (0 for a row that sees every key)
        key_count = key_padding.to(torch.int32)
        query_threshold = ((~query_attends_all).to(torch.int32) if query_attends_all is not None
                           else torch.ones((), dtype=torch.int32, device=q.device).expand(bsz, tq))

    if tq == 0 or bsz == 0:  # nothing to compute (the launch plan needs a query row and a batch row)
        out = torch.empty_like(q)
        return (out, torch.empty((bsz, h, tq), dtype=torch.float32, device=q.device)) if return_lse else out
    dummy = q  # stands in for absent optional pointers (never read)
    has_mask = key_count is not None  # else no mask loads at all
    kc = key_count if has_mask else dummy
    qt = query_threshold if has_mask else dummy
    ends = key_end_tensor(key_end, bsz, tk, q.device)
    ke = ends.to(torch.int32) if ends is not None else dummy

    interp = _interpreted(_attn_fwd_kernel)
    plan = plan_attention(bsz, h, tq, tk, d, sms=None if interp else _sm_count(q.device),
                          block_m=block_m, block_n=block_n, num_splits=num_splits)
    block_d, block_m, block_n = plan.block_d, plan.block_m, plan.block_n
    m_tiles, num_splits, split_len = plan.query_tiles, plan.splits, plan.split_len
    if num_splits == 1:
        out = torch.empty_like(q)
        lse = torch.empty((bsz, h, tq), dtype=torch.float32, device=q.device) if return_lse else dummy
    else:  # float32 partials, merged below
        out = torch.empty((num_splits, bsz, h, tq, d), dtype=torch.float32, device=q.device)
        lse = torch.empty((num_splits, bsz, h, tq), dtype=torch.float32, device=q.device)
    o_strides = out.stride()[-4:]
    scale = 1.0 / math.sqrt(d) if sm_scale is None else float(sm_scale)
    # GPU launch settings are first guesses (untuned): tune with ``dllm bench kernels``
    launch = {} if interp else {"num_warps": num_warps or (4 if block_d <= 128 else 8),
                                "num_stages": num_stages or (3 if block_d <= 128 else 2)}
    observed_launch(
        "flash_attention", _attn_fwd_kernel, (m_tiles, bsz * h, num_splits),
        q, k, v, out, lse, kc, qt, ke,
        *q.stride(), *k.stride(), *v.stride(), *o_strides,
        *(kc.stride() if has_mask else (0, 0)), *(qt.stride() if has_mask else (0, 0)),
        h, tq, tk, scale * 1.4426950408889634,
        split_len, out.stride(0) if num_splits > 1 else 0, lse.stride(0) if num_splits > 1 else 0,
        GROUPS=h // hkv, HEAD_DIM=d, BLOCK_D=block_d, BLOCK_M=block_m, BLOCK_N=block_n,
        HAS_MASK=has_mask, HAS_KEY_END=ends is not None, WRITE_LSE=return_lse or num_splits > 1,
        DOT_PRECISION="ieee" if q.dtype == torch.float32 else "tf32",  # fp32: no TF32 rounding
        **launch,
    )
    if num_splits > 1:
        out, lse = _merge_splits(out, lse, q.dtype, return_lse)
    return (out, lse) if return_lse else out


def _sm_count(device: torch.device) -> int:
    rec = recording()
    return rec.sms if rec is not None else _device_sms(device)


@functools.lru_cache(maxsize=None)
def _device_sms(device: torch.device) -> int:
    return torch.cuda.get_device_properties(device).multi_processor_count


@triton.jit
def _merge_kernel(
    Part, PartLse, Out, Lse,  # part [S, R, D] float32, part_lse [S, R]; out [R, D]; lse [R] (R = B*H*Tq)
    R, S, HEAD_DIM: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_R: tl.constexpr, WRITE_LSE: tl.constexpr,
):
    rows = (tl.program_id(0) * BLOCK_R + tl.arange(0, BLOCK_R)).to(tl.int64)
    offs_d = tl.arange(0, BLOCK_D)
    r_ok = rows < R
    ok = r_ok[:, None] & (offs_d < HEAD_DIM)[None, :]
    m = tl.full([BLOCK_R], float("-inf"), tl.float32)
    for s in range(0, S):  # the largest partial lse per row
        m = tl.maximum(m, tl.load(PartLse + s * R + rows, mask=r_ok, other=float("-inf")))
    m_safe = tl.where(m == float("-inf"), 0.0, m)  # a row with no key anywhere: weights exp(-inf) = 0
    den = tl.zeros([BLOCK_R], tl.float32)
    acc = tl.zeros([BLOCK_R, BLOCK_D], tl.float32)
    for s in range(0, S):
        w = tl.exp(tl.load(PartLse + s * R + rows, mask=r_ok, other=float("-inf")) - m_safe)
        part = tl.load(Part + s * R * HEAD_DIM + rows[:, None] * HEAD_DIM + offs_d[None, :], mask=ok, other=0.0)
        den += w
        acc += w[:, None] * part
    empty = den == 0.0
    acc = acc / tl.where(empty, 1.0, den)[:, None]
    tl.store(Out + rows[:, None] * HEAD_DIM + offs_d[None, :], acc.to(Out.dtype.element_ty), mask=ok)
    if WRITE_LSE:
        tl.store(Lse + rows, tl.where(empty, float("-inf"), m_safe + tl.log(tl.where(empty, 1.0, den))), mask=r_ok)


def _merge_splits(part: torch.Tensor, part_lse: torch.Tensor, dtype: torch.dtype,
                  return_lse: bool) -> tuple[torch.Tensor, torch.Tensor]:
    """Partials part [S, B, H, Tq, D] float32 (each normalised over its keys; contiguous) and
    part_lse [S, B, H, Tq] -> (out [B, H, Tq, D] in ``dtype``, lse [B, H, Tq] float32): the softmax
    over all keys, out = sum_s exp(lse_s - lse) part_s, lse = logsumexp_s lse_s, in one launch."""
    s, b, h, tq, d = part.shape
    rows = b * h * tq
    out = torch.empty((b, h, tq, d), dtype=dtype, device=part.device)
    lse = torch.empty((b, h, tq), dtype=torch.float32, device=part.device) if return_lse else part_lse
    block_d = max(16, next_pow2(d))
    block_r = max(1, 2048 // block_d)
    launch = {} if _interpreted(_merge_kernel) else {"num_warps": 4}
    observed_launch("merge_splits", _merge_kernel, (triton.cdiv(rows, block_r),), part, part_lse, out, lse, rows,
                    s, HEAD_DIM=d, BLOCK_D=block_d, BLOCK_R=block_r, WRITE_LSE=return_lse, **launch)
    return out, lse


def triton_attention(
    q: torch.Tensor,  # [B, H, Tq, hd]
    k: torch.Tensor,  # [B, Hkv, Tk, hd]
    v: torch.Tensor,
    mask: Optional[torch.Tensor] = None,  # bool, [B, 1, 1, Tk] or [B, 1, Tq, Tk] with nested rows (padding, block-causal)
    return_probs: bool = False,
    **launch: Any,
) -> tuple[torch.Tensor, None]:
    """The ``attn_backend="triton"`` function (signature of ``dllm.kernels.attention`` backends);
    ``launch``: ``flash_attention``'s launch settings (``block_m``, ``block_n``, ``num_warps``, ...)."""
    if return_probs:
        raise ValueError("the triton attention backend cannot return attention probabilities; "
                         "use attn_backend='reference'")
    count = threshold = None
    if mask is not None:
        count, threshold = mask_to_thresholds(mask, q.shape[0], q.shape[2], k.shape[2])
    return flash_attention(q, k, v, key_count=count, query_threshold=threshold, **launch), None


__all__ = ["flash_attention", "triton_attention", "mask_to_thresholds", "unavailable_reason",
           "UnsupportedMaskError"]
