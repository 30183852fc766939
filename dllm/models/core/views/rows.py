"""Views over copies of buffer rows: ``RowsView`` (verification variants, the call's buffers
untouched; the variants of one row share one copy, their queries stacked), ``StackedView`` (the
variants forwarded as one sequence per row, already stacked) and ``HeldView`` (a forward of the rows
of a decode still held, ``dllm.rows``)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Optional

import torch

from dllm.models.core.views.base import CacheView


@dataclass(frozen=True)
class RowsView(CacheView):
    """A view for a forward over copies of buffer rows ``select`` [N] (rows may repeat): each layer
    attends to a copy of ITS keys/values ``[0, key_end)`` of those rows with the fresh K/V written
    into the copy, the call's buffers untouched. The same attended tensors as ``kv.gather(select)``
    followed by ``view``, but one layer's copy lives at a time (LLaDA-8B, 8 variants, bf16, 1,056
    columns: 138 MB instead of 4.4 GB) and pruned columns ``>= key_end`` are not copied."""

    select: Optional[torch.Tensor] = None  # [N] long, buffer rows
    group: int = 1  # select comes in runs of `group` equal rows (variants of one row)
    _masks: dict = field(default_factory=dict, compare=False, repr=False)  # attend's mask, built once per forward
    every_row: bool = False  # select is each buffer row 0..R-1 in order, `group` times: no gather needed

    @property
    def rows(self) -> int:
        assert self.select is not None
        return int(self.select.shape[0])

    def attend(self, layer: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: Optional[torch.Tensor],
               attn_fn, return_probs: bool) -> tuple[torch.Tensor, Optional[torch.Tensor]]:
        """With ``group`` = g > 1, the g variants of a row attend to ONE copy of that row's keys and
        values (not g copies): their queries are stacked [N/g, H, g*T, hd] against the row's keys
        ``[0, key_end)`` with the recomputed columns masked out, followed by the g variants' fresh
        keys, each variant seeing only its own. Every query sees exactly the keys it would see in its
        own copy (``update``, the reference path), so the output is the same up to float summation
        order. The stale copies of the recomputed columns are masked, never read."""
        t = k.shape[2]
        g = self.group
        kind = grouped_backend(attn_fn)
        if g == 1 or return_probs or self.is_full(t) or kind is None:
            return super().attend(layer, q, k, v, mask, attn_fn, return_probs)
        out, _ = self.attend_stacked(layer, stack_groups(q, g), stack_groups(k, g), stack_groups(v, g), mask,
                                     attn_fn)  # [n, H, gT, hd]
        return unstack_groups(out, g), None

    def attend_stacked(self, layer: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                       mask: Optional[torch.Tensor], attn_fn) -> tuple[torch.Tensor, None]:
        """The grouped attention in the stacked layout: q [n, H, g*T, hd], fresh k/v [n, Hkv, g*T, hd]
        (the g variants of a row side by side), mask [n*g or n, 1, T|1|g*T, K] (equal within a group
        and across its variants' rows) or None -> [n, H, g*T, hd]."""
        assert self.select is not None
        g = self.group
        kind = grouped_backend(attn_fn)
        n, t, key_end = q.shape[0], q.shape[2] // g, self.key_end
        kb, vb = self.kv.k[layer], self.kv.v[layer]
        if self.every_row and n == kb.shape[0]:  # the rows in order: read in place (cat copies them)
            # a block's variant forwards read the same keys: their views kept on a reused view
            k_rows, v_rows = self.memoized(("attended", layer), (kb, vb), lambda: self.attended_keys(kb, vb))
        else:
            sel = self.select[::g].to(kb.device)  # [n] one buffer row per group
            k_rows, v_rows = kb[:, :, :key_end].index_select(0, sel), vb[:, :, :key_end].index_select(0, sel)
        keys = torch.cat([k_rows, k], dim=2)  # [n, Hkv, K + gT, hd]
        values = torch.cat([v_rows, v], dim=2)
        key = (t, kind, q.dtype)  # every layer of the forward has the same mask
        if key not in self._masks:
            # a function of the shape and the columns alone when there is no mask, or when every row
            # is forwarded in order with the call's fixed positions (its padding and block masks are
            # then the same at every step of the block): kept on the buffers for the block's next
            # forwards (a StaticView moves its columns, extra columns vary: built each time)
            shared = (type(self) is RowsView or type(self) is StackedView) and self.extra is None and (
                mask is None or (self.every_row and self.kv.positions_fixed))
            call_key = (n, t, g, key_end, self.start, mask is None, kind, q.dtype, q.device)
            built = self.kv.grouped_masks.get(call_key) if shared else None
            if built is None:
                # fewer variants than a mask kept for this block: its top-left part; else [n, 1, gT, K + gT]
                #   anew (sdpa on CPU runs an additive float mask faster than a boolean one)
                built = self._fewer_variants(call_key) if shared else None
                if built is None:
                    built = self.grouped_mask(mask, n, t, q.device, None if kind == "bool" else q.dtype)
                if shared:
                    if len(self.kv.grouped_masks) >= 16:
                        self.kv.grouped_masks.clear()
                    self.kv.grouped_masks[call_key] = built
            self._masks[key] = built
        return attn_fn(q, keys, values, self._masks[key], False)  # [n, H, gT, hd]

    def _fewer_variants(self, call_key: tuple) -> Optional[torch.Tensor]:
        """The kept stacked mask of ``call_key`` = (n, t, g, key_end, ...) made from one kept for more
        variants G > g with the rest of the key equal, or None. Variant j's rows see the row's keys and
        their own block only, so the first g variants' mask is the first g*T rows and the first
        K + g*T columns of the G variants' (a slice, no new mask; ``lopa``'s compacted steps change
        the variant count within a block)."""
        n, t, g = call_key[:3]
        for other, mask in self.kv.grouped_masks.items():
            if other[:2] == (n, t) and other[3:] == call_key[3:] and other[2] > g:
                return mask[:, :, :g * t, :call_key[3] + g * t]
        return None

    def grouped_mask(self, mask: Optional[torch.Tensor], n: int, t: int, device: torch.device,
                     dtype: Optional[torch.dtype] = None) -> torch.Tensor:
        """[n, 1, g*T, K + g*T] of ``attend``'s stacked layout from the mask of the variants [n*g or n,
        1, T or 1 or g*T, K] (equal within a group and across its variants' rows) or None (no
        padding): bool (``dtype`` None), or additive in ``dtype`` (0 where attended, else -inf)."""
        g, key_end = self.group, self.key_end
        if mask is not None:  # one variant's per group: [n, 1, T|1, K]
            mask = mask[::g] if mask.shape[0] != n else mask
            mask = (mask[:, :, :t] if mask.shape[2] != 1 else mask).expand(n, 1, t, key_end)
        yes, no = (True, False) if dtype is None else (0.0, float("-inf"))
        cols = self.columns(t, device)
        out = torch.full((n, 1, g, t, key_end + g * t), no, dtype=dtype or torch.bool, device=device)  # [.., j, T, :]
        keys = out[..., :key_end]  # every variant sees the row's keys
        own = out[..., key_end:].view(n, 1, g, t, g, t).diagonal(dim1=2, dim2=4)  # [n, 1, T, T, g] its own block
        if mask is None:
            keys.fill_(yes)
            own.fill_(yes)
        else:
            keys.masked_fill_(mask[:, :, None], yes)
            own.masked_fill_(mask[..., cols].reshape(n, 1, t, t, 1), yes)  # the padding of the recomputed columns
        out[..., cols] = no  # their stale copies in the row's keys: the fresh ones follow, per variant
        return out.view(n, 1, g * t, key_end + g * t)

    def key_positions(self, positions: torch.Tensor) -> torch.Tensor:
        """The keys' positions [N, key_end] of the selected rows with the query rows' ``positions``
        [N, T] written into a copy (the call's ``kv.positions`` stay untouched)."""
        assert self.select is not None
        t = positions.shape[1]
        if self.is_full(t):
            return positions
        if self.kv.positions is None:
            raise RuntimeError("a rows view over a KV cache that no forward has written")
        store = self.kv.positions.index_select(0, self.select.to(self.kv.positions.device))[:, :self.key_end].clone()
        store[:, self.columns(t, store.device)] = positions.to(store.device)
        return store

    def update(self, layer: int, k: torch.Tensor, v: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        t = k.shape[2]
        if self.is_full(t):
            return k, v
        assert self.select is not None
        kb, vb = self.kv.k[layer], self.kv.v[layer]
        sel = self.select.to(kb.device)
        keys = kb[:, :, :self.key_end].index_select(0, sel)  # [N, Hkv, key_end, hd] this layer's copy
        values = vb[:, :, :self.key_end].index_select(0, sel)
        self.write(keys, values, k, v)
        return keys, values


@dataclass(frozen=True)
class StackedView(RowsView):
    """A grouped ``RowsView`` whose forward takes a row's g variants as ONE sequence of g*T queries
    (input [n, g*T]; positions: the T columns' g times over), the layout ``RowsView.attend`` stacks
    them into: the same attention, without its reshapes in and out in every layer. Every query count
    a forward passes in (``check_queries``, ``key_positions``) is g*T."""

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.group < 2 or self.extra is not None or self.select is None or self.select.shape[0] % self.group:
            raise ValueError(f"a stacked view needs group >= 2 with select in runs of it and no extra columns, "
                             f"got group={self.group}, extra={self.extra is not None}")

    @property
    def rows(self) -> int:
        assert self.select is not None
        return int(self.select.shape[0]) // self.group

    def check_queries(self, n_queries: int) -> None:
        if n_queries % self.group:
            raise ValueError(f"a stacked view takes g*T query rows (g = {self.group}), got {n_queries}")
        super().check_queries(n_queries // self.group)

    def is_full(self, n_queries: int) -> bool:
        return super().is_full(n_queries // self.group)

    def key_positions(self, positions: torch.Tensor) -> torch.Tensor:
        """The keys' positions [n, key_end] of the groups' rows (positions [n, g*T], each variant's the same)."""
        g, t = self.group, positions.shape[1] // self.group
        return RowsView(self.kv, self.start, self.key_end, None, self.select[::g]).key_positions(positions[:, :t])

    def query_rows(self, h: torch.Tensor, a: int, b: int) -> torch.Tensor:
        """Rows ``[a, b)`` of every variant: h [n, g*T, D] -> [n, g*(b - a), D]."""
        n, gt, d = h.shape
        if a == 0 and b == gt // self.group:
            return h
        return h.view(n, self.group, gt // self.group, d)[:, :, a:b].reshape(n, -1, d)

    def attend(self, layer: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: Optional[torch.Tensor],
               attn_fn, return_probs: bool) -> tuple[torch.Tensor, Optional[torch.Tensor]]:
        """q [n, H, g*T, hd], k/v [n, Hkv, g*T, hd], mask [n, 1, g*T|1, K] or None -> [n, H, g*T, hd]."""
        g = self.group
        if return_probs or grouped_backend(attn_fn) is None or self.is_full(q.shape[2]):  # as RowsView runs these
            rows = RowsView(self.kv, self.start, self.key_end, None, self.select, g, every_row=self.every_row)
            m = None if mask is None else mask[:, :, :q.shape[2] // g].repeat_interleave(g, dim=0)  # [n*g, 1, T|1, K]
            out, probs = rows.attend(layer, *(unstack_groups(x, g) for x in (q, k, v)), m, attn_fn, return_probs)
            return stack_groups(out, g), None if probs is None else stack_groups(probs, g)
        return self.attend_stacked(layer, q, k, v, mask, attn_fn)


@dataclass(frozen=True)
class StaticStackedView(StackedView):
    """A ``StackedView`` whose query columns are a device tensor ``cols`` [T] (a static buffer the caller
    moves between forwards: ``StaticView``'s role for the variants), so nothing in its forward depends
    on where the block is and one captured variant forward serves every block of a call with the same
    ``key_end`` (``dllm.engine.graphs``). Every buffer row's variants in order (read in place), a backend that
    takes the stacked mask, and no block-causal mask (its blocks come from Python ints)."""

    cols: Optional[torch.Tensor] = None  # [T] long on the buffers' device

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.cols is None or not self.every_row or self.memo is not None:
            raise ValueError("a static stacked view needs cols [T], every_row=True and no memo")

    def columns(self, n_queries: int, device: Optional[torch.device] = None) -> torch.Tensor:
        assert self.cols is not None and self.cols.shape[0] == n_queries
        return self.cols if device is None else self.cols.to(device)

    def check_queries(self, n_queries: int) -> None:
        assert self.cols is not None
        if n_queries != self.group * self.cols.shape[0]:
            raise ValueError(f"a static stacked view takes g*T = {self.group * self.cols.shape[0]} query rows "
                             f"(g = {self.group}, cols [{self.cols.shape[0]}]), got {n_queries}")

    def is_full(self, n_queries: int) -> bool:
        return False

    def key_positions(self, positions: torch.Tensor) -> torch.Tensor:
        raise NotImplementedError("a static stacked view takes no block-causal mask (its blocks are Python ints)")

    def attend(self, layer: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: Optional[torch.Tensor],
               attn_fn, return_probs: bool) -> tuple[torch.Tensor, Optional[torch.Tensor]]:
        if return_probs or grouped_backend(attn_fn) is None:
            raise NotImplementedError("a static stacked view runs the stacked attention only (a backend that takes "
                                      "its mask, no attention maps)")
        return self.attend_stacked(layer, q, k, v, mask, attn_fn)


@dataclass(frozen=True)
class HeldView(RowsView):
    """A forward of the buffer rows ``select`` [N] (distinct) that writes their fresh K/V and
    positions into the call's buffers (``RowsView`` writes into copies): the same keys and values as
    ``view`` gives those rows, for a batch whose other rows no longer need forwards."""

    def fresh_index(self, t: int, device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
        """(the held rows [N, 1], the canvas columns of the forward's ``t`` rows [1, T]): advanced
        indices that write exactly the fresh entries of the call's buffers."""
        assert self.select is not None
        cols = self.columns(t, device)
        cols = torch.arange(cols.start, cols.stop, device=device) if isinstance(cols, slice) else cols
        return self.select.to(device)[:, None], cols[None, :]

    def update(self, layer: int, k: torch.Tensor, v: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Write the held rows' fresh k/v [N, Hkv, T, hd] at their columns of the call's buffers (only
        those columns); return the keys and values they attend to ([N, Hkv, key_end, hd])."""
        t = k.shape[2]
        kb, vb = self.kv.k[layer], self.kv.v[layer]
        sel, cols = self.fresh_index(t, kb.device)
        kb[sel, :, cols] = k.transpose(1, 2)  # advanced indices first: [N, T, Hkv, hd]
        vb[sel, :, cols] = v.transpose(1, 2)
        if self.is_full(t):
            return k, v
        return kb[:, :, :self.key_end].index_select(0, sel[:, 0]), vb[:, :, :self.key_end].index_select(0, sel[:, 0])

    def key_positions(self, positions: torch.Tensor) -> torch.Tensor:
        """Record the held rows' query positions [N, T] in ``kv.positions`` [R, L] (only their
        columns); their keys' positions [N, key_end]."""
        store = self.kv.positions
        if self.kv.positions_fixed and store is not None:  # every column's position, given once
            return store[:, :self.key_end].index_select(0, self.select.to(store.device))
        if store is None or store.device != positions.device:
            store = torch.zeros((self.kv.rows, self.kv.length), dtype=torch.long, device=positions.device)
            self.kv.positions = store
        sel, cols = self.fresh_index(positions.shape[1], positions.device)
        store[sel, cols] = positions
        return store[:, :self.key_end].index_select(0, sel[:, 0])


def stack_groups(x: torch.Tensor, g: int) -> torch.Tensor:
    """[n*g, H, T, hd] (runs of g variants) -> [n, H, g*T, hd]: each run's rows side by side."""
    ng, h, t, hd = x.shape
    return x.reshape(ng // g, g, h, t, hd).transpose(1, 2).reshape(ng // g, h, g * t, hd)


def unstack_groups(x: torch.Tensor, g: int) -> torch.Tensor:
    """``stack_groups``' inverse: [n, H, g*T, hd] -> [n*g, H, T, hd]."""
    n, h, gt, hd = x.shape
    return x.reshape(n, h, g, gt // g, hd).transpose(1, 2).reshape(n * g, h, gt // g, hd)


_GROUPED: list = [-1, {}]  # grouped_backend's [the backends registry's version, {attention fn: mask kind}]


def grouped_backend(attn_fn) -> Optional[str]:
    """The mask ``RowsView.attend``'s stacked layout passes to ``attn_fn``: "float" (additive, sdpa),
    "bool" (reference), or None when the backend cannot take an arbitrary mask (the Triton kernel
    takes padding masks only; the layout then falls back to one copy per variant)."""
    from dllm.kernels.attention import AUTO, backends

    version, table = _GROUPED
    if version != backends.version:  # built once per registry state (a stacked forward asks twice a layer)
        # the measuring "auto" sends an arbitrary float mask to sdpa (its fallback), so it takes "float"
        table = {backends.get("sdpa").fn: "float", backends.get("sdpa_plain").fn: "float", AUTO.fn: "float",
                 backends.get("reference").fn: "bool"}
        _GROUPED[:] = [backends.version, table]
    return table.get(attn_fn)


__all__ = ["HeldView", "RowsView", "StackedView", "StaticStackedView", "grouped_backend", "stack_groups",
           "unstack_groups"]
