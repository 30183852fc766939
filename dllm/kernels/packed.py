"""Attention over padded rows without the padding: sdpa per group of rows with the same real columns.

A ragged batch is padded to its longest row (left-padded prompts in the engine, right-padded
examples in training), and a broadcast key mask ``[B, 1, 1, Tk]`` hides the pads
(``dllm.models.inputs.padding_attn_mask``). sdpa then pays for every padded key of every row: a batch
of long-prompt suite prompts of 256, 512, 1,024 and 2,040 words (two each) spends 2x the attention
of its real keys, and the masked call cannot use the unmasked kernels. Here the rows are grouped by
their run of real columns ``[start, end)`` (one contiguous run per row), and each group attends to
those keys only, unmasked:

    out[b] = sdpa(q[b], k[b, :, start_b:end_b], v[b, :, start_b:end_b])

which is what the mask computes: every query (a pad query too) attends to the row's real keys,
so the result is the masked call's up to float summation order (tests/kernels/test_packed.py).
Queries are not cut: with a cache the query columns are not the key columns, and a pad query's
output stays defined as before.

The grouping needs the runs on the host: one device->host copy per mask, i.e. per forward (the
models pass one mask object to every layer; the last conversion is remembered), and only for calls
with at least ``MIN_WORK`` query x key pairs per row, where that copy is small against the
attention itself. Off the CPU (where a copy is a sync that stalls the launch queue) only full
forwards take the path (as many queries as keys: a prefill, a no-cache step, a cache's block-start
refresh), so the cached steps of a decode stay free of host syncs. Masks whose rows are not one run
of real columns (holes), float masks, per-query masks, one-row batches, less than ``MIN_PADDED`` of
the keys padded, or off the CPU more than ``MAX_GROUPS_OFF_CPU`` groups take the plain masked call.
"""

from __future__ import annotations

import threading
from typing import Optional

import torch

MIN_WORK = 1 << 16  # query x key pairs per row below which the masked call is used as is
MIN_PADDED = 0.125  # share of padded keys (over the batch) below which the masked call is used as is
MAX_GROUPS_OFF_CPU = 8  # off the CPU, more groups than this (launch-bound small calls) take the masked call

class _Memo(threading.local):
    """The last conversion, per thread: [(mask, version or None, groups or None)]. Holding the mask
    keeps its id from being reused; ``tensor_version`` catches in-place edits, except on inference-mode
    tensors, which have none: those are assumed not to be edited in place between calls (the models
    build a fresh mask per forward), as in ``dllm.kernels.triton.attention``."""

    def __init__(self) -> None:
        self.last: list = []


_memo = _Memo()


def tensor_version(t: torch.Tensor) -> Optional[int]:
    """``t``'s version counter (bumped by every in-place write), None for an inference tensor (untracked)."""
    return None if t.is_inference() else t._version


Group = tuple[int, int, torch.Tensor]  # (start, end, row indices [G] long): rows whose real keys are [start, end)


def padding_groups(mask: torch.Tensor) -> Optional[list[Group]]:
    """bool [B, 1, 1, Tk] key mask -> [(start, end, row indices [G] long), ...] when every row's real
    keys are one run ``[start, end)`` (left padding: ``end = Tk``; right padding: ``start = 0``; the
    rows grouped by their run), and at least ``MIN_PADDED`` of the keys are pads; else None. One
    host sync (remembered for the same mask object)."""
    last = _memo.last
    if last and last[0][0] is mask and last[0][1] == tensor_version(mask):
        return last[0][2]
    b, tk = mask.shape[0], mask.shape[-1]
    m = mask.reshape(b, tk)  # [B, Tk]
    real = m.sum(dim=1)  # [B]
    start = m.int().argmax(dim=1)  # [B] the first real column (0 for a row without any)
    col = torch.arange(tk, device=m.device)[None, :]
    run = (col >= start[:, None]) & (col < (start + real)[:, None])  # [B, Tk]
    ok = (run == m).all(dim=1) & (real > 0)  # [B]
    counts, starts, oks = torch.stack([real, start.long(), ok.long()]).tolist()  # the one host sync
    groups: Optional[list[Group]] = None
    if all(oks) and (b * tk - sum(counts)) >= MIN_PADDED * b * tk:
        by_run: dict[tuple[int, int], list[int]] = {}
        for row, (s0, n) in enumerate(zip(starts, counts)):
            by_run.setdefault((s0, s0 + n), []).append(row)
        groups = [(s0, e0, torch.tensor(rows, device=m.device)) for (s0, e0), rows in sorted(by_run.items())]
    _memo.last = [(mask, tensor_version(mask), groups)]
    return groups


def wants_packing(q: torch.Tensor, k: torch.Tensor, mask: Optional[torch.Tensor]) -> bool:
    """Shape-only test (no sync): a boolean broadcast key mask over a batch of rows, enough work,
    and on a device other than the CPU a full forward (as many queries as keys)."""
    return (mask is not None and mask.dtype == torch.bool and mask.dim() == 4 and q.shape[0] > 1
            and mask.shape[0] == q.shape[0] == k.shape[0] and mask.shape[1] == 1 and mask.shape[2] == 1
            and mask.shape[3] == k.shape[2] and q.shape[2] * k.shape[2] >= MIN_WORK
            and (q.device.type == "cpu" or q.shape[2] == k.shape[2]))


def few_enough(groups: list[Group], device: torch.device) -> bool:
    """One call per group pays on a CPU; on an accelerator many small calls are launch-bound (a
    training batch of 64 rows of 64 lengths would make 64 calls per layer), so at most
    ``MAX_GROUPS_OFF_CPU`` groups there."""
    return device.type == "cpu" or len(groups) <= MAX_GROUPS_OFF_CPU


def packed_sdpa(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, groups: list[Group]) -> torch.Tensor:
    """q [B, H, Tq, hd], k / v [B, H, Tk, hd] (KV heads already expanded) -> out [B, H, Tq, hd]:
    each group of rows attends, unmasked, to its keys ``[start, end)``."""
    import torch.nn.functional as F

    if len(groups) == 1 and groups[0][2].numel() == q.shape[0]:  # every row padded alike
        s0, e0, _ = groups[0]
        return F.scaled_dot_product_attention(q, k[:, :, s0:e0], v[:, :, s0:e0])
    out: Optional[torch.Tensor] = None
    for s0, e0, rows in groups:
        part = F.scaled_dot_product_attention(q[rows], k[rows, :, s0:e0], v[rows, :, s0:e0])
        if out is None:  # sdpa's dtype (under autocast it may differ from q's)
            out = part.new_empty(q.shape)
        out[rows] = part
    assert out is not None  # groups is never empty
    return out


__all__ = ["Group", "MAX_GROUPS_OFF_CPU", "MIN_PADDED", "MIN_WORK", "few_enough", "packed_sdpa", "padding_groups",
           "wants_packing"]
