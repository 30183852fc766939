"""The models' boolean attention masks as the Triton attention kernel's contract
(``dllm.kernels.triton.attention.flash_attention``): two int32 vectors, a count per key [B, Tk] and a
threshold per query row [B, Tq], with ``allowed(t, j) <=> key_count[j] >= query_threshold[t]``.

Every mask whose rows' allowed-key sets are nested (totally ordered by inclusion) has that form:
key padding, pad-query rows that see every key, block-causal masks (SDAR, arXiv 2510.06303; Fast-dLLM
v2; LLaDA 2) and their ANDs. Any other mask (e.g. a sliding window, per-head masks, float masks) is
refused (``UnsupportedMaskError``, a ``RequestRefused``: ``attn_backend="auto"`` then takes its fallback).
"""

from __future__ import annotations

import threading
from typing import Optional

import torch

from dllm.kernels.autotune import RequestRefused
from dllm.kernels.packed import tensor_version


class UnsupportedMaskError(RequestRefused):
    """The mask is not of a form the kernel can express (rows' key sets nested: padding, block-causal)."""


# The models pass ONE mask object to every layer of a forward: remember the last conversion so the
# check below (a host sync) runs once per forward, not once per layer. Holding the tensor keeps its
# id from being reused; ``tensor_version`` catches in-place edits, except on inference-mode tensors, which
# have no version counter: those are assumed not to be edited in place between calls (the models
# build a fresh mask per forward). The conversion depends on the batch and query count a broadcast
# mask is expanded to, so they are part of the key; one memo per thread (``dllm.kernels.packed``).
class _Memo(threading.local):
    def __init__(self) -> None:
        self.last: Optional[tuple] = None  # (mask, version or None, batch, n_queries, (key_count, query_threshold))


_memo = _Memo()


def nested_thresholds(m: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """bool [B, Tq, Tk] -> (key_count [B, Tk], query_threshold [B, Tq]) int32, no host sync.

    key_count[j] = the number of rows that may attend key j; query_threshold[t] = the smallest count
    among row t's keys (Tq + 1, above every count, for a row with no key). When the rows' key sets
    S_t are nested, ``m[t, j] <=> key_count[j] >= query_threshold[t]``: for j not in S_t every row
    that sees j has a strict superset of S_t, so each key of S_t is seen by those rows and by t
    itself, one more. Otherwise the equality fails somewhere (the caller checks it)."""
    tq = m.shape[1]
    count = m.sum(dim=1, dtype=torch.int32)  # [B, Tk]
    small = torch.int16 if tq < torch.iinfo(torch.int16).max else torch.int32  # the [B, Tq, Tk] temporary
    big = torch.full((), tq + 1, dtype=small, device=m.device)
    threshold = torch.where(m, count.to(small)[:, None, :], big).amin(dim=2)  # [B, Tq]; Tk = 0: amin refuses
    return count, threshold.to(torch.int32)


def mask_to_thresholds(
    mask: torch.Tensor, batch: int, n_queries: int, n_keys: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """bool mask broadcastable to [B, 1, Tq, Tk] -> (key_count int32 [B, Tk], query_threshold int32 [B, Tq]).

    Accepted: [B|1, 1, 1, Tk] (key padding: counts 0/1, threshold 1, a stride-0 view) and
    [B|1, 1, Tq, Tk] whose rows' key sets are nested (``padding_attn_mask``, ``CacheView.attn_mask``,
    ``block_causal_mask`` and their ANDs); a new square mask is checked once (one host read).
    Anything else (per-head masks, float masks, rows not nested) raises ``UnsupportedMaskError``.
    """
    if mask.dtype != torch.bool:
        raise UnsupportedMaskError(f"the triton attention backend takes boolean masks only, got {mask.dtype}")
    if (mask.dim() != 4 or mask.shape[0] not in (1, batch) or mask.shape[1] != 1
            or mask.shape[2] not in (1, n_queries) or mask.shape[3] != n_keys):
        raise UnsupportedMaskError(
            f"the triton attention backend takes masks [B, 1, 1, Tk] or [B, 1, Tq, Tk] "
            f"(B={batch}, Tq={n_queries}, Tk={n_keys}), got {tuple(mask.shape)}; use attn_backend='sdpa'")
    last = _memo.last  # read once: another call may replace it meanwhile
    if (last is not None and last[0] is mask and last[1] == tensor_version(mask)
            and last[2] == batch and last[3] == n_queries):
        return last[4]
    m = mask[:, 0].expand(batch, mask.shape[2], n_keys)  # [B, Tq|1, Tk]
    if mask.shape[2] == 1 or n_keys == 0:  # key padding: allowed(t, j) = real[j] >= 1
        one = torch.ones((), dtype=torch.int32, device=mask.device)
        result = (m[:, 0].to(torch.int32), one.expand(batch, n_queries))
    elif mask.is_cuda and torch.cuda.is_current_stream_capturing():  # the check below reads the mask back
        raise UnsupportedMaskError(
            f"the triton attention backend reads a new [B, 1, Tq, Tk] mask back to check its form, which a CUDA "
            f"graph capture cannot do (got {tuple(mask.shape)}); use attn_backend='sdpa' or 'auto' with cuda_graphs")
    else:
        count, threshold = nested_thresholds(m)
        if not bool(((count[:, None, :] >= threshold[:, :, None]) == m).all()):  # host sync, once per mask
            raise UnsupportedMaskError(
                "the triton attention backend supports masks whose rows' allowed keys are nested (key padding, "
                "pad queries, block-causal and their ANDs) only; this mask is not one (e.g. a sliding window "
                "or a block-diagonal mask); use attn_backend='sdpa' or 'reference'")
        result = (count, threshold)
    _memo.last = (mask, tensor_version(mask), batch, n_queries, result)
    return result


__all__ = ["UnsupportedMaskError", "mask_to_thresholds", "nested_thresholds"]
