"""Shared-vicinity verification variants: the variants of one row packed into ONE sequence.

A verification variant (``dllm.samplers._verify``) is a copy of a row whose block differs from the
canvas. Under a cache whose query is wider than the block (``dual`` with ``look_back`` /
``look_ahead``: dInfer's vicinity refresh), every variant recomputes the whole vicinity on its own
copy of the buffers (``RowsView``): g variants of a 36-column query forward 36 g rows, although
their inputs differ inside the block only.

With ``dual:share_vicinity=True`` the engine packs a row's g variants into one sequence instead:

    [ first variant: the whole query [a, b) | variant 2: its own columns [c, d) | ... | variant g ]

where ``[c, d) = [s - shift, e)`` is the block (plus column s - 1 for a shifted family such as
Dream, whose hidden state there predicts column s). The first variant is computed exactly as
``RowsView`` does. A later variant recomputes only its own columns; its queries attend to the row's
buffers outside ``[a, b)``, to the FIRST variant's fresh keys/values of ``[a, b)`` outside ``[c, d)``,
and to their own fresh keys/values. One forward of ``(b - a) + (g - 1)(d - c)`` rows instead of
``g (b - a)``.

What it approximates: a later variant's vicinity columns are those of the first variant, whose
block holds other tokens (LoPA: one more committed position; spec_threshold / ssd: fewer drafts).
Variants whose blocks equal the first's get exactly ``RowsView``'s logits (tests/cache/
test_shared_vicinity.py), and so does every variant when the query is the block itself. The call's
buffers are never written.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Optional

import torch

from dllm.models.kv import CacheView, grouped_backend


@dataclass(frozen=True)
class SharedLayout:
    """Columns of the packed sequence: the first variant's query ``[a, b)``, each later variant's
    own columns ``[c, d)`` (inside ``[a, b)``), ``group`` variants per row."""

    a: int
    b: int
    c: int
    d: int
    group: int

    def __post_init__(self) -> None:
        if not (self.a <= self.c < self.d <= self.b and self.group >= 1):
            raise ValueError(f"shared-vicinity layout needs a <= c < d <= b and group >= 1, got {self}")

    @property
    def first(self) -> int:
        return self.b - self.a

    @property
    def own(self) -> int:
        return self.d - self.c

    @property
    def length(self) -> int:
        """P, the packed sequence's rows."""
        return self.first + (self.group - 1) * self.own

    def offset(self, j: int) -> int:
        """Packed row of variant j's first column (j >= 1)."""
        return self.first + (j - 1) * self.own

    def pack(self, x: torch.Tensor) -> torch.Tensor:
        """[N, L, ...] canvases in runs of ``group`` -> [N / group, P, ...] packed sequences."""
        g = self.group
        runs = x.reshape(x.shape[0] // g, g, *x.shape[1:])  # [n, g, L, ...]
        parts = [runs[:, 0, self.a:self.b]] + [runs[:, j, self.c:self.d] for j in range(1, g)]
        return torch.cat(parts, dim=1)

    def fresh_mask(self, device: torch.device) -> torch.Tensor:
        """bool [P, P]: which packed rows' fresh keys each packed query sees (True = attend)."""
        p, t, w = self.length, self.first, self.own
        mask = torch.zeros(p, p, dtype=torch.bool, device=device)
        mask[:t, :t] = True
        lo, hi = self.c - self.a, self.d - self.a  # the own columns inside the first variant's rows
        for j in range(1, self.group):
            o = self.offset(j)
            mask[o:o + w, :t] = True
            mask[o:o + w, lo:hi] = False  # replaced by the variant's own
            mask[o:o + w, o:o + w] = True
        return mask


@dataclass(frozen=True)
class SharedView(CacheView):
    """A ``CacheView`` for one forward of packed variants (``SharedLayout``) against copies of the
    buffer rows ``select`` [n]; ``start`` = the layout's ``a``. The call's buffers are never written."""

    select: Optional[torch.Tensor] = None  # [n] long, one buffer row per packed sequence
    layout: Optional[SharedLayout] = None
    key_padding_mask: Optional[torch.Tensor] = None  # [n, L] bool (True = real) or None
    _masks: dict = field(default_factory=dict, compare=False, repr=False)

    @property
    def rows(self) -> int:
        assert self.select is not None
        return int(self.select.shape[0])

    def check_queries(self, n_queries: int) -> None:
        assert self.layout is not None
        if n_queries != self.layout.length:
            raise ValueError(f"a shared-vicinity forward takes {self.layout.length} packed rows, got {n_queries}")

    def attn_mask(self, key_padding_mask: Optional[torch.Tensor], n_queries: int) -> Optional[torch.Tensor]:
        return None  # ``attend`` builds the packed layout's own mask

    def mask(self, device: torch.device) -> torch.Tensor:
        """bool [n, 1, P, key_end + P]: the row's buffers outside ``[a, b)``, then the packed fresh keys
        (``SharedLayout.fresh_mask``); padding keys are never attended, pad queries attend everything."""
        lay, n, k = self.layout, self.rows, self.key_end
        assert lay is not None
        buf = torch.ones(n, k, dtype=torch.bool, device=device)  # [n, K]
        real = torch.ones(n, lay.length, dtype=torch.bool, device=device)  # [n, P] packed rows
        if self.key_padding_mask is not None:
            kpm = self.key_padding_mask.to(device)
            buf = kpm[:, :k].clone()
            real[:, :lay.first] = kpm[:, lay.a:lay.b]  # later variants' own columns are never padding
        buf[:, lay.a:lay.b] = False  # stale copies: their fresh versions are in the packed rows
        fresh = lay.fresh_mask(device)[None] & real[:, None, :]  # [n, P, P]
        allowed = torch.cat([buf[:, None, :].expand(n, lay.length, k), fresh], dim=2)  # [n, P, K + P]
        return (allowed | ~real[:, :, None])[:, None]  # [n, 1, P, K + P]

    def attend(self, layer: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: Optional[torch.Tensor],
               attn_fn, return_probs: bool) -> tuple[torch.Tensor, Optional[torch.Tensor]]:
        """q [n, H, P, hd] and the fresh k/v [n, Hkv, P, hd] against ``[buffers[0, key_end) | fresh]``."""
        kind = grouped_backend(attn_fn)
        if kind is None:
            raise ValueError("share_vicinity needs an attention backend that takes arbitrary masks "
                             "('sdpa' or 'reference'); the Triton kernel takes padding masks only")
        assert self.select is not None
        kb, vb = self.kv.k[layer], self.kv.v[layer]
        sel = self.select.to(kb.device)
        keys = torch.cat([kb[:, :, :self.key_end].index_select(0, sel), k], dim=2)  # [n, Hkv, K + P, hd]
        values = torch.cat([vb[:, :, :self.key_end].index_select(0, sel), v], dim=2)
        key = (kind, q.dtype)  # every layer of the forward has the same mask
        if key not in self._masks:
            allowed = self.mask(q.device)
            # sdpa on CPU runs an additive float mask faster than a boolean one
            self._masks[key] = (allowed if kind == "bool" else
                                torch.zeros(allowed.shape, dtype=q.dtype, device=q.device).masked_fill(~allowed, float("-inf")))
        return attn_fn(q, keys, values, self._masks[key], return_probs)


def shared_variant_logits(model, kv, x: torch.Tensor, positions: torch.Tensor,
                          key_padding_mask: Optional[torch.Tensor], kv_rows: torch.Tensor, group: int, *,
                          query: tuple[int, int, int], block: tuple[int, int], shift: int) -> torch.Tensor:
    """Block logits [N, e - s, V] of N variant canvases ``x`` [N, L] (runs of ``group`` per row, the
    first of each run shared) in one packed forward against copies of buffer rows ``kv_rows`` [N].

    query = (a, b, key_end): the policy's cached query; block = (s, e); shift = the model's
    ``logit_shift``. Forwarded rows: ``N / group * SharedLayout.length``."""
    (a, b, key_end), (s, e) = query, block
    lay = SharedLayout(a, b, s - shift, e, group)
    select = kv_rows[::group]  # [n]
    kpm = None if key_padding_mask is None else key_padding_mask[::group]
    view = SharedView(kv, a, key_end, select=select, layout=lay, key_padding_mask=kpm)
    first = s - a  # shifted row of the first variant's block
    out = model(lay.pack(x), positions=lay.pack(positions), cache=view,
                logits_rows=(first, lay.length)).logits  # [n, P - first, V]
    w = e - s
    starts = [0] + [lay.offset(j) + shift - first for j in range(1, group)]
    blocks = torch.stack([out[:, o:o + w] for o in starts], dim=1)  # [n, g, W, V]
    return blocks.reshape(-1, w, out.shape[-1])  # [N, W, V], a row's variants next to each other


__all__ = ["SharedLayout", "SharedView", "shared_variant_logits"]
