"""Rows that leave a running ``generate`` call before it ends.

A batch row whose answer is no longer needed (its answer ended under ``stop_at_eos``; a served
request that is done early or was cancelled, through ``release_rows`` in a step callback) is
*released*: its remaining masks are filled (the model's first EOS id, else a non-mask token), so no
sampler step commits or re-masks anything in it and no block waits for it, and from then on a
forward computes only the rows still held (``forward_held``; with a KV cache, against the held rows
of its buffers, their fresh K/V written back). The released rows' logits are zeros, which no
sampler reads (they have no active position), and their buffers go stale, which nothing reads
either. The other rows decode to the same tokens: a row's logits never depend on the other rows of
its batch, except where a sampler couples the rows by design: Dream's fixed-step samplers count the
masks over the held rows only (``dllm.samplers.dream``), and the batch-shaped random draws of
``origin`` and ``random`` change with any batch (as they do between a batch and a row alone).

The reference path forwards every row (``generate(..., skip_released=False)``, passed down to
``forward_rows``); tests compare the two. Forwards with attention maps, with a shadow block, of
verification variants (rows the sampler picks) and of a cache that measures key drift still run on
every row they name.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Iterable, Optional, Sequence

import torch

from dllm.state import DecodeState

_HELD_MASK, _HELD_ROWS = "held_mask", "held_rows"  # DecodeState.extras keys


def release_fill_id(eos_ids: Sequence[int], mask_id: int) -> int:
    """The id a released row's masks become: its first EOS/EoT id, else an id that is not the mask."""
    return int(eos_ids[0]) if eos_ids else (1 if mask_id == 0 else 0)


def release_rows(state: DecodeState, rows: Iterable[int]) -> None:
    """Release batch rows ``rows`` of a running decode (row indices in [0, B)); idempotent."""
    b = state.batch_size
    new = set()
    for r in rows:
        if isinstance(r, bool) or not isinstance(r, int) or not 0 <= r < b:
            raise ValueError(f"a released row is a batch row index in [0, {b}), got {r!r}")
        new.add(r)
    new -= state.released
    if not new:
        return
    state.released = state.released | frozenset(new)
    eos_ids = state.extras.get("eos_ids", ())
    fill_id = release_fill_id(eos_ids, state.mask_id)
    device = state.x.device
    released = torch.zeros(b, dtype=torch.bool, device=device)  # [B]
    released[sorted(state.released)] = True
    gen = state.generated  # [B, G] view of the canvas
    gen.masked_fill_(released[:, None] & (gen == state.mask_id), fill_id)
    state.extras[_HELD_MASK] = ~released  # [B]
    state.extras[_HELD_ROWS] = torch.tensor([r for r in range(b) if r not in state.released],
                                            dtype=torch.long, device=device)  # [H]


def held_mask(state: DecodeState) -> Optional[torch.Tensor]:
    """[B] bool, False on released rows; None while every row is held."""
    return state.extras.get(_HELD_MASK) if state.released else None


def forward_rows(state: DecodeState, forward_rows_count: int, *, cache: Any = None, wants_maps: bool,
                 skip_released: bool) -> Optional[torch.Tensor]:
    """The forward-batch rows to compute ([R'] long) when some rows are released and the forward can
    skip them, else None. ``forward_rows_count`` is the forward's batch: B, or 2B under
    classifier-free guidance (the unconditional copies follow the conditional rows; the K/V buffers
    have the same rows). ``cache``: the forward's cache view, if any (one whose buffers measure key
    drift, ``dllm.cache.drift``, keeps every row: its measure spans the batch). ``skip_released``
    False: always None (the reference path, every row forwarded)."""
    if not (skip_released and state.released) or wants_maps:
        return None
    if cache is not None and getattr(cache.kv, "drift_probe", None) is not None:
        return None
    held = state.extras[_HELD_ROWS]  # [H]
    if held.numel() == 0:  # every row released (a caller that goes on anyway): compute one row only
        held = held.new_zeros(1)
    b = state.batch_size
    if forward_rows_count == b:
        return held
    if forward_rows_count == 2 * b:
        return torch.cat([held, held + b])
    return None


def forward_held(model, x: torch.Tensor, kwargs: dict[str, Any], rows: torch.Tensor):
    """``model(x, **kwargs)`` computed on the forward rows ``rows`` only; the other rows' logits are
    zeros. x [R, Q]; positions [R, Q]; key_padding_mask [R, L] or None; a cache view
    becomes the held rows' view of the same buffers (``KVCache.held_view``: their fresh K/V written)."""
    sub = dict(kwargs)
    view = sub.get("cache")
    if view is not None:
        sub["cache"] = view.kv.held_view(rows, view.start, view.key_end, view.extra)
    for name in ("positions", "key_padding_mask"):
        if sub.get(name) is not None:
            sub[name] = sub[name][rows]
    out = model(x[rows], **sub)
    part = out.logits  # [R', Q', V]
    logits = part.new_zeros((x.shape[0],) + tuple(part.shape[1:]))  # [R, Q', V]
    logits[rows] = part
    return dataclasses.replace(out, logits=logits)


__all__ = ["forward_held", "forward_rows", "held_mask", "release_fill_id", "release_rows"]
