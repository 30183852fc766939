"""K/V buffers of one ``generate`` call, and the view a cached forward uses.

``KVCache`` holds, for every layer, a key and a value buffer of shape [R, Hkv, L, hd] (R = rows of
the forward batch: B, or 2B under classifier-free guidance; L = the whole canvas). Buffers are
allocated once per call, on the device of their layer (so a model spread over GPUs by
``device_map`` keeps each layer's K/V beside it), and only ever written in place.

Keys are stored AFTER RoPE. Every canvas column has a fixed position for the whole call
(``positions = cumsum(valid) - 1`` for left-padded rows), so a key rotated once stays valid; this
saves re-rotating the full key set at every step, which Fast-dLLM does because it stores keys
before RoPE. The two give bit-identical keys: a rotation reads only the key and its position.

``CacheView`` tells one forward what to do with the buffers: the forward's T query rows are canvas
columns ``[start, start + T)``; in every layer their fresh K/V overwrite buffer rows
``[start, start + T)``, and the queries attend to buffer rows ``[0, key_end)``. Columns at or past
``key_end`` are not attended at all (pruned). A view with ``start = 0`` and ``T = key_end``
is a full forward: it fills the buffers and attends to the fresh K/V directly, so its output is
exactly that of a forward without a cache.
"""

from __future__ import annotations

from typing import Optional, Sequence

import torch

from dllm.models.core.views import (CacheView, HeldView, RowsView, StackedView, StaticView, canvas_columns,  # noqa: F401
                                    grouped_backend, stack_groups)


class KVCache:
    """Per-layer K/V buffers ``k[i]``, ``v[i]``: [R, Hkv, L, hd] in the model dtype, post-RoPE."""

    def __init__(self, k: Sequence[torch.Tensor], v: Sequence[torch.Tensor]) -> None:
        if len(k) != len(v) or not k:
            raise ValueError(f"KVCache needs one key and one value buffer per layer, got {len(k)} and {len(v)}")
        self.k = list(k)
        self.v = list(v)
        self.drift_probe: Optional["DriftProbe"] = None  # set by a policy that measures K drift
        # [R, L] long: the RoPE position of every written column; block-causal models read the keys'
        # positions from it (``CacheView.key_positions``). Allocated on the first write, or given for
        # every column at once (``fix_positions``).
        self.positions: Optional[torch.Tensor] = None
        self.positions_fixed = False
        self._block_ids: Optional[tuple[int, torch.Tensor, torch.Tensor]] = None
        # (start, n_queries, key_end, block_size, mask): block_mask's last, whose query rows cover the
        #   next call's when a block's first forward also writes the block before (SDAR's block cache)
        self._last_block_mask: Optional[tuple[int, int, int, int, torch.Tensor]] = None
        # RowsView.attend's stacked masks without padding, by shape and columns: the same for every
        # variant forward of a block (``grouped_mask``), so built once instead of once per step
        self.grouped_masks: dict[tuple, torch.Tensor] = {}
        # a cached shadow-block forward's masks without padding, by shape and span: the same for every
        # step of a block (``dllm.models.core.shadow.shadow_attn_mask``), so built once per block
        self.shadow_masks: dict[tuple, torch.Tensor] = {}

    def fix_positions(self, positions: torch.Tensor) -> None:
        """Every column's position for the whole call, [R, L] long (a ``generate`` call's canvas
        positions: fixed per column, as the keys stored after RoPE already assume). Forwards then
        record nothing, and a block-causal forward of a plain view reads its mask from the block ids
        of this tensor (``block_mask``); the tensor is kept, never written."""
        if positions.shape != (self.rows, self.length) or positions.dtype.is_floating_point:
            raise ValueError(f"fix_positions takes integer positions [{self.rows}, {self.length}], got "
                             f"{positions.dtype} {list(positions.shape)}")
        self.positions, self.positions_fixed, self._block_ids, self._last_block_mask = positions, True, None, None

    def block_mask(self, start: int, n_queries: int, key_end: int, block_size: int) -> torch.Tensor:
        """With ``fix_positions``: bool [R, 1, T, key_end], True where the key's block
        (``position // block_size``) is at most the query's, for the queries at columns ``[start,
        start + T)``: ``dllm.models.core.layer.block.block_causal_mask`` of the columns' positions,
        from block ids computed once per call (a slice of each side and one comparison), or a slice of
        the last mask made when its query columns cover these with the same keys (the values are a
        function of the fixed positions alone)."""
        assert self.positions_fixed and self.positions is not None
        last = self._last_block_mask
        if last is not None and last[2:4] == (key_end, block_size) and last[0] <= start \
                and start + n_queries <= last[0] + last[1]:
            return last[4][:, :, start - last[0]:start - last[0] + n_queries]  # [R, 1, T, K]
        mask = self._block_mask(start, n_queries, key_end, block_size)
        self._last_block_mask = (start, n_queries, key_end, block_size, mask)
        return mask

    def _block_mask(self, start: int, n_queries: int, key_end: int, block_size: int) -> torch.Tensor:
        """``block_mask`` made anew from the block ids."""
        if self._block_ids is None or self._block_ids[0] != block_size:
            ids = torch.div(self.positions, block_size, rounding_mode="floor")  # [R, L]
            r, length = ids.shape
            self._block_ids = (block_size, ids.view(r, 1, 1, length), ids.view(r, 1, length, 1))
        _, keys, queries = self._block_ids
        keys = keys if key_end == self.length else keys[..., :key_end]  # [R, 1, 1, K]
        return keys <= queries[:, :, start:start + n_queries]  # [R, 1, T, K]

    @classmethod
    def allocate(
        cls,
        n_layers: int,
        rows: int,
        n_kv_heads: int,
        length: int,
        head_dim: int,
        *,
        dtype: torch.dtype,
        devices: Sequence[torch.device],
    ) -> "KVCache":
        """Empty buffers (contents are undefined until a full forward writes them)."""
        if len(devices) != n_layers:
            raise ValueError(f"need one device per layer ({n_layers}), got {len(devices)}")
        shape = (rows, n_kv_heads, length, head_dim)
        k = [torch.empty(shape, dtype=dtype, device=d) for d in devices]
        v = [torch.empty(shape, dtype=dtype, device=d) for d in devices]
        return cls(k, v)

    @property
    def n_layers(self) -> int:
        return len(self.k)

    @property
    def rows(self) -> int:
        return self.k[0].shape[0]

    @property
    def length(self) -> int:
        return self.k[0].shape[2]

    @property
    def nbytes(self) -> int:
        return sum(t.numel() * t.element_size() for t in self.k + self.v)

    def gather(self, rows: torch.Tensor) -> "KVCache":
        """A copy holding buffer rows ``rows`` [N], every layer at once (the reference of
        ``rows_view``, which copies one layer at a time)."""
        return KVCache([t.index_select(0, rows.to(t.device)) for t in self.k],
                       [t.index_select(0, rows.to(t.device)) for t in self.v])

    def view(self, start: int, key_end: Optional[int] = None, extra: Optional[torch.Tensor] = None, *,
             reuse: bool = False) -> "CacheView":
        """A forward whose queries start at canvas column ``start`` (after the ``extra`` columns'
        rows, if any) and attend to ``[0, key_end)``. ``reuse``: the caller runs several forwards
        through this one view, each with the same ``positions`` tensor and padding mask (the same
        objects, unchanged), and the forwards may keep what they derive from them (``memoized``)."""
        return CacheView(self, start, self.length if key_end is None else key_end, extra,
                         memo={} if reuse else None)

    def rows_view(self, rows: torch.Tensor, start: int, key_end: Optional[int] = None,
                  extra: Optional[torch.Tensor] = None, group: int = 1, *, every_row: bool = False,
                  stacked: bool = False, reuse: bool = False) -> "RowsView":
        """``gather(rows).view(start, key_end, extra)`` without the all-layer copy: a forward of
        copies of buffer rows ``rows`` [N] that never writes the call's buffers (verification variants).
        ``group`` > 1: ``rows`` comes in runs of ``group`` equal rows (the variants of one row), which
        then share one copy of their row (``RowsView.attend``). ``every_row``: the runs are the
        buffer rows 0..R-1 in order (the caller knows it), read in place by ``attend``. ``stacked``: the
        forward takes each run as one sequence of ``group`` x T query rows (``StackedView``). ``reuse``:
        as ``view``'s (several forwards through this view keep what they derive from their inputs)."""
        kind = StackedView if stacked else RowsView
        return kind(self, start, self.length if key_end is None else key_end, extra, rows, group, every_row=every_row,
                    memo={} if reuse else None)

    def held_view(self, rows: torch.Tensor, start: int, key_end: Optional[int] = None,
                  extra: Optional[torch.Tensor] = None) -> "HeldView":
        """``view`` for a forward of the buffer rows ``rows`` [N] only (distinct; the rows of a decode
        still held, ``dllm.rows``): their fresh K/V are written into the call's buffers as ``view``
        writes every row's; the other rows' buffers are left as they are."""
        return HeldView(self, start, self.length if key_end is None else key_end, extra, rows)


class DriftProbe:
    """Per-column key drift measured at full forwards (``dllm.cache.drift``).

    A full forward recomputes every column's keys; just before they overwrite the buffers, the probe
    compares them with what the buffers held, i.e. the keys the steps since the previous full forward
    attended to. ``drift`` [R, L] float32 is the mean over layers of ``||k_new - k_old||^2 /
    ||k_new||^2`` per column (summed over heads and channels): the relative squared error of the
    cached keys. None until a second full forward (the first one has nothing to compare with).
    """

    def __init__(self) -> None:
        self.filled = False  # a full forward has written the buffers
        self.drift: Optional[torch.Tensor] = None  # [R, L]
        self._acc: Optional[torch.Tensor] = None
        self.decision: Optional[tuple] = None  # the policy's per-block choice (dllm.cache.drift)

    def record(self, layer: int, n_layers: int, fresh: torch.Tensor, old: torch.Tensor) -> None:
        """fresh / old keys of layer ``layer``: [R, Hkv, L, hd]."""
        if self.filled:
            f = fresh.float()
            err = (f - old.float()).square().sum(dim=(1, 3)) / f.square().sum(dim=(1, 3)).clamp_min(1e-12)  # [R, L]
            self._acc = err if self._acc is None else self._acc + err.to(self._acc.device)  # reset after the last layer
        if layer == n_layers - 1:
            if self.filled:
                self.drift = self._acc / n_layers
            self.filled, self._acc = True, None


__all__ = ["CacheView", "DriftProbe", "HeldView", "KVCache", "RowsView", "StackedView", "StaticView", "canvas_columns",
           "grouped_backend", "stack_groups"]
