"""``PackedView``: a forward without a cache of a padded batch's real tokens only, packed into one row.

A ragged batch of short rows (the merged forwards of a serving loop: 32 rows of 15 to 40 tokens) is
padded to its longest row, and a layer's projections, norms and MLP, nearly all of its work, run on
every pad column. Rows of one run of real columns each could run as one forward per run
(``dllm.models.core.packed_rows``), but short rows make many small calls. Here the real tokens of
every row are packed into one sequence [1, N] (N = the real tokens), so every per-token part of the
model runs on N tokens instead of B x T, and only attention runs on the padded layout: in each layer
the packed q, k and v are scattered into zeroed [B, H, T, hd] rows, the attention backend runs with
the batch's key mask as the padded forward does, and its output is gathered back:

    out[b, t] = attention(q[b], k[b], v[b], mask[b])[t]    for the real (b, t), packed in order

Every real position gets the padded forward's value up to float summation order (a matmul over N
rows instead of B x T); pad columns get the final norm and head of zeros (no caller reads them).
Rotary embeddings are per token (the packed positions). Not for block-causal models (their mask is
built from the positions inside the forward) or a forward with a cache.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Hashable, Optional

import torch


@dataclass(frozen=True)
class PackedView:
    """The packing of a [B, T] batch's real tokens (``index``: their flat positions ``b * T + t``)."""

    index: torch.Tensor  # [N] long
    source: torch.Tensor  # [B * T] long: each flat position's packed token, N at the padding
    rows: int  # B
    columns: int  # T

    @classmethod
    def of(cls, real: torch.Tensor, most: Optional[int] = None) -> Optional["PackedView"]:
        """real [B, T] bool (True: a real token) -> the packing (one host read: N); None when there are
        more than ``most`` real tokens (nothing else made then)."""
        b, t = real.shape
        index = real.reshape(-1).nonzero().squeeze(1)  # [N]
        n = index.shape[0]
        if most is not None and n > most:
            return None
        source = torch.full((b * t,), n, dtype=torch.long, device=real.device)
        source[index] = torch.arange(n, device=real.device)
        return cls(index, source, b, t)

    @property
    def tokens(self) -> int:
        return int(self.index.shape[0])

    def pack(self, x: torch.Tensor) -> torch.Tensor:
        """x [B, T, ...] -> its real tokens [1, N, ...]."""
        return x.reshape(self.rows * self.columns, *x.shape[2:]).index_select(0, self.index).unsqueeze(0)

    def _spread(self, x: torch.Tensor, dim: int) -> torch.Tensor:
        """x with its N packed tokens along ``dim`` -> B x T there, zeros at the padding (a zero row
        appended, then one ``index_select``: ``index_copy_`` into zeros is several times slower on a CPU)."""
        pad = [0, 0] * (x.dim() - 1 - dim) + [0, 1]
        return torch.constant_pad_nd(x, pad, 0).index_select(dim, self.source)

    def unpack(self, x: torch.Tensor) -> torch.Tensor:
        """x [1, N, ...] -> [B, T, ...] with zeros at the padding."""
        return self._spread(x[0], 0).view(self.rows, self.columns, *x.shape[2:])

    def _heads_out(self, x: torch.Tensor) -> torch.Tensor:
        """x [1, H, N, hd] -> [B, H, T, hd] (a strided view), zeros at the padding."""
        h, _, hd = x.shape[1:]
        return self._spread(x[0], 1).view(h, self.rows, self.columns, hd).transpose(0, 1)

    def _heads_in(self, x: torch.Tensor) -> torch.Tensor:
        """x [B, H, T, hd] -> [1, H, N, hd]."""
        b, h, t, hd = x.shape
        return x.transpose(0, 1).reshape(h, b * t, hd).index_select(1, self.index).unsqueeze(0)

    def attend(self, layer: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: Optional[torch.Tensor],
               attn_fn: Callable, return_probs: bool) -> tuple[torch.Tensor, Optional[torch.Tensor]]:
        """Packed q [1, H, N, hd], k / v [1, Hkv, N, hd] -> the padded attention's output [1, H, N, hd];
        ``mask`` is the batch's [B, 1, 1|T, T] (probabilities, where asked, come back [B, H, T, T])."""
        out, probs = attn_fn(self._heads_out(q), self._heads_out(k), self._heads_out(v), mask, return_probs)
        return self._heads_in(out), probs

    def memoized(self, name: Hashable, inputs: tuple, make: Callable[[], Any]) -> Any:
        return make()  # one forward: nothing to keep

    def query_rows(self, h: torch.Tensor, a: int, b: int) -> torch.Tensor:
        """The final hidden states of the packed tokens h [1, N, D] -> rows [a, b) of the padded
        layout [B, b - a, D] (zeros at the padding)."""
        out = self.unpack(h)  # [B, T, D]
        return out if a == 0 and b == self.columns else out[:, a:b]


__all__ = ["PackedView"]
