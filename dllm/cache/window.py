"""``window``: a prefix cache that prunes the far field (after Window-Diffusion,
the upstream repository vhicrgit/Window-Diffusion).

Exactly what it does, for block ``[s, e)`` on a canvas of L columns with ``buffer = W`` (>= the
block length):

- block start (and every ``refresh``-th step of the block): one full forward over the whole canvas
  ``[0, L)``, as ``prefix`` does; its logits drive the step and its K/V fill the buffers;
- every other step: the queries are the window ``[s, min(s + W, L))`` (the block plus ``W - BL``
  columns to its right, all recomputed, with fresh K/V), and they attend to the cached K/V of the
  prefix ``[0, s)`` (frozen since the last full forward) plus their own fresh K/V. Columns at or
  after ``s + W`` (the far field, still masked) are pruned: they are neither computed nor attended.

With W >= L - s the window reaches the end of the canvas and the policy is ``prefix`` exactly. Dream
(``logit_shift = 1``) queries start at ``s - 1``, as in ``prefix``.

Differences from Window-Diffusion: the window is anchored at the block start instead of sliding
with every commit (the engine decodes block by block), and the refresh forwards see the whole
canvas, so ``refresh=1`` reproduces ``cache="none"`` exactly; pruning happens in the cached steps
only. Window-Diffusion's knobs map as: ``window_tokens``/``o_win_size`` ~ ``buffer``,
``active_tokens``/``i_win_size`` ~ ``block_length``, ``refresh_cycle`` ~ ``refresh``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

from dllm.cache.base import CachePolicy, Query, check_refresh, register_cache
from dllm.options import check_int
from dllm.state import DecodeState


@dataclass(frozen=True)
class WindowConfig:
    buffer: Optional[int] = None  # window length from the block start (>= block_length); None: 2 blocks
    refresh: Optional[int] = None  # full forward every `refresh` steps of a block (None: block starts only)

    def __post_init__(self) -> None:
        if self.buffer is not None:
            check_int("buffer", self.buffer, 1)
        check_refresh(self.refresh)


@register_cache("window")
class WindowCache(CachePolicy):
    """Window-Diffusion style: recompute block + buffer, reuse the prefix, prune the far field."""

    Config = WindowConfig

    def check(self, model, *, block_length: int, gen_length: int) -> None:
        buffer = self.config.buffer
        if buffer is not None and buffer < block_length:
            raise ValueError(
                f"window buffer={buffer} is smaller than block_length={block_length}: the window "
                f"must hold the whole block; use buffer >= {block_length}"
            )

    def window(self, block_length: int) -> int:
        return self.config.buffer if self.config.buffer is not None else 2 * block_length

    def cached_query(self, state: DecodeState, shift: int) -> Query:
        s = state.block_start
        end = min(state.x.shape[1], s + self.window(state.block_length))
        return Query(s - shift, end, end)
