"""``CacheView``: a forward's query rows are canvas columns ``[start, start + T)`` (after ``extra``
columns); in every layer their fresh K/V overwrite those buffer rows and the queries attend to
buffer rows ``[0, key_end)``. ``StaticView``: the same with the written columns given as a tensor
(CUDA graphs)."""

from __future__ import annotations

import operator
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Callable, Hashable, Optional, Union

import torch

if TYPE_CHECKING:  # annotations only: the buffers' module imports this one
    from dllm.models.core.kv import KVCache


def canvas_columns(start: int, end: int, extra: Optional[torch.Tensor] = None,
                   device: Optional[torch.device] = None) -> Union[slice, torch.Tensor]:
    """A forward's canvas columns, what ``x[:, ...]`` takes: ``[start, end)``, after the ``extra``
    columns [n] when there are any (then a long tensor on ``device``, default the extra's)."""
    if extra is None or not extra.numel():
        return slice(start, end)
    cols = torch.cat([extra, torch.arange(start, end, device=extra.device)])
    return cols if device is None else cols.to(device)


@dataclass(frozen=True)
class CacheView:
    """How one forward uses a ``KVCache`` (see the module docstring)."""

    kv: "KVCache"
    start: int  # canvas column of the first contiguous query row; fresh K/V go to [start, start + T')
    key_end: int  # keys/values attended: buffer rows [0, key_end)
    extra: Optional[torch.Tensor] = None  # [n] long: columns < start recomputed too (their rows come first)
    # a view reused by several forwards (``KVCache.view(reuse=True)``): what they derive from the
    # positions and the padding mask, kept (``memoized``); None: every forward derives it anew
    memo: Optional[dict] = field(default=None, compare=False, repr=False, kw_only=True)

    def __post_init__(self) -> None:
        if not 0 <= self.start < self.key_end <= self.kv.length:
            raise ValueError(f"CacheView needs 0 <= start < key_end <= {self.kv.length}, got "
                             f"start={self.start}, key_end={self.key_end}")

    @property
    def n_extra(self) -> int:
        return 0 if self.extra is None else int(self.extra.numel())  # metadata, no device sync

    def check_queries(self, n_queries: int) -> None:
        """ValueError unless the T query rows fit inside the attended keys."""
        if self.start + n_queries - self.n_extra > self.key_end:
            raise ValueError(f"{n_queries - self.n_extra} query rows from column {self.start} pass key_end="
                             f"{self.key_end}: the queries' own keys must be attended")

    @property
    def rows(self) -> int:
        """Rows of the forward batch this view serves."""
        return self.kv.rows

    def is_full(self, n_queries: int) -> bool:
        return self.start == 0 and n_queries == self.key_end and not self.n_extra

    def columns(self, n_queries: int, device: Optional[torch.device] = None) -> Union[slice, torch.Tensor]:
        """The canvas columns of the forward's ``n_queries`` rows (``canvas_columns``)."""
        return canvas_columns(self.start, self.start + n_queries - self.n_extra, self.extra, device)

    def write(self, kb: torch.Tensor, vb: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> None:
        """Fresh k/v [R, Hkv, T, hd] into kb/vb [R, Hkv, >= key_end, hd]: the first ``n_extra`` rows
        at the columns ``extra``, the rest at ``[start, start + T - n_extra)``."""
        n = self.n_extra
        if n:
            cols = self.extra.to(kb.device)
            kb.index_copy_(2, cols, k[:, :, :n])
            vb.index_copy_(2, cols, v[:, :, :n])
            k, v = k[:, :, n:], v[:, :, n:]
        kb[:, :, self.start:self.start + k.shape[2]].copy_(k)
        vb[:, :, self.start:self.start + v.shape[2]].copy_(v)

    def update(self, layer: int, k: torch.Tensor, v: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Write the fresh k/v [R, Hkv, T, hd] of layer ``layer`` in place; return the keys and
        values to attend ([R, Hkv, key_end, hd])."""
        t, kv = k.shape[2], self.kv
        kb, vb = kv.k[layer], kv.v[layer]
        full = self.is_full(t)
        if full and kv.drift_probe is not None:
            kv.drift_probe.record(layer, kv.n_layers, k, kb[:, :, :t])
        if self.memo is None or self.n_extra or type(self).write is not CacheView.write:
            self.write(kb, vb, k, v)
            # full: the attended set IS the fresh set (no cache read, exactly a plain forward)
            return (k, v) if full else self.attended_keys(kb, vb)
        k_to, v_to, keys, values = self.buffer_views(layer, kb, vb, t)  # made once per reused view
        k_to.copy_(k)
        v_to.copy_(v)
        return (k, v) if full else (keys, values)

    def attended_keys(self, kb: torch.Tensor, vb: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """A layer's buffers kb / vb up to ``key_end``: the buffers themselves when every column is
        attended (dual), else their first ``key_end`` columns."""
        if self.key_end == kb.shape[2]:
            return kb, vb
        return kb[:, :, :self.key_end], vb[:, :, :self.key_end]

    def buffer_views(self, layer: int, kb: torch.Tensor, vb: torch.Tensor,
                     t: int) -> tuple[torch.Tensor, ...]:
        """(where the fresh K and V of ``t`` rows go, the attended K and V) of layer ``layer``'s buffers:
        ``write``'s and ``update``'s views, made once per reused view while the buffers are the same
        objects (``memoized``: the steps of a block write the same columns and attend to the same keys,
        two to four ATen calls per layer fewer; views share the buffers' storage, so the same reads
        and writes)."""
        end = self.start + t
        return self.memoized(("buffer views", layer, t), (kb, vb),
                             lambda: (kb[:, :, self.start:end], vb[:, :, self.start:end], *self.attended_keys(kb, vb)))

    def attend(self, layer: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: Optional[torch.Tensor],
               attn_fn, return_probs: bool) -> tuple[torch.Tensor, Optional[torch.Tensor]]:
        """One layer's cached attention: ``update`` with the fresh k/v [R, Hkv, T, hd], then the
        backend ``attn_fn`` over the attended keys; q [R, H, T, hd], mask [R, 1, T|1, K] or None."""
        keys, values = self.update(layer, k, v)
        return attn_fn(q, keys, values, mask, return_probs)

    def key_positions(self, positions: torch.Tensor) -> torch.Tensor:
        """Record the query rows' positions [R, T] at their canvas columns (``kv.positions``) and
        return the attended keys' positions [R, key_end] (a block-causal mask needs them)."""
        store = self.kv.positions
        if self.kv.positions_fixed and store is not None:  # every column's position, given once
            return store if self.key_end == store.shape[1] else store[:, :self.key_end]
        if store is None or store.shape[0] != positions.shape[0] or store.device != positions.device:
            store = torch.zeros((positions.shape[0], self.kv.length), dtype=torch.long, device=positions.device)
            self.kv.positions = store
        store[:, self.columns(positions.shape[1], positions.device)] = positions
        return store[:, :self.key_end]

    def attn_mask(self, key_padding_mask: Optional[torch.Tensor], n_queries: int) -> Optional[torch.Tensor]:
        """bool [R, 1, 1, key_end] (True = attend, broadcast over the queries) from the canvas-wide
        padding mask [R, L]: every query attends to the real keys only, as
        ``dllm.models.inputs.padding_attn_mask`` does. None when there is no padding."""
        if key_padding_mask is None:
            return None
        return self.memoized("attn_mask", (key_padding_mask,),
                             lambda: key_padding_mask[:, None, None, :self.key_end])  # [R, 1, 1, K]

    def memoized(self, name: Hashable, inputs: tuple, make: Callable[[], Any]) -> Any:
        """``make()``, kept on a reused view (``memo``) under ``name`` and given again while ``inputs``
        are the same objects as when it was made; on any other view ``make()`` each time."""
        if self.memo is None:
            return make()
        hit = self.memo.get(name)
        if hit is not None and len(hit[0]) == len(inputs) and all(map(operator.is_, hit[0], inputs)):
            return hit[1]
        value = make()
        self.memo[name] = (inputs, value)
        return value


@dataclass(frozen=True)
class StaticView(CacheView):
    """A cached forward whose query columns are a device tensor ``cols`` [T] (a static buffer the caller
    updates between forwards) instead of the Python int ``start``: its fresh K/V are written with
    ``index_copy_`` at ``cols`` and the queries attend to ``[0, key_end)``. Nothing in such a forward
    depends on where the block is, so one capture (``dllm.engine.graphs``) serves every block of a call
    with the same ``key_end``. ``start`` only has to satisfy the base check; it is not used."""

    cols: Optional[torch.Tensor] = None  # [T] long on the buffers' device

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.memo is not None:  # its columns and the static positions change in place between forwards
            raise ValueError("a StaticView keeps nothing between forwards (memo must be None)")

    def columns(self, n_queries: int, device: Optional[torch.device] = None) -> torch.Tensor:
        assert self.cols is not None and self.cols.shape[0] == n_queries
        return self.cols if device is None else self.cols.to(device)

    def check_queries(self, n_queries: int) -> None:
        if self.cols is None or self.cols.shape != (n_queries,):
            raise ValueError(f"a static view needs cols [{n_queries}] (one canvas column per query row), got "
                             f"{None if self.cols is None else list(self.cols.shape)}")

    def is_full(self, n_queries: int) -> bool:
        return False

    def write(self, kb: torch.Tensor, vb: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> None:
        kb.index_copy_(2, self.columns(k.shape[2]), k)
        vb.index_copy_(2, self.columns(v.shape[2]), v)


__all__ = ["CacheView", "StaticView", "canvas_columns"]
