"""Fast-dLLM's block-approximate caches ``prefix`` and ``dual`` (NVlabs/Fast-dLLM v1, arXiv
2505.22618; its drivers ``generate_with_prefix_cache`` / ``generate_with_dual_cache`` in
``llada/generate.py`` and ``dream/model/generation_utils_block.py``), with dInfer's vicinity
refresh (inclusionAI/dInfer ``VicinityCacheDiffusionLLM``, arXiv 2510.08666) as options of ``dual``.

Both run one full forward over the whole canvas at every block start; its logits drive the block's
first step and its K/V fill the buffers of every layer. The later steps of block ``[s, e)`` on a
canvas of L columns:

- ``prefix``: queries ``[s, L)`` (the block and everything right of it) attend to the cached K/V of
  ``[0, s)`` plus their own fresh K/V. The prefix is frozen until the next full forward.
- ``dual``: queries ``[s, e)`` attend to the whole cache ``[0, L)`` whose rows ``[s, e)`` are
  overwritten in place by their fresh K/V every step; prefix and suffix rows stay as the last full
  forward left them.

Options (both): ``refresh = k`` (>= 1) also redoes the full forward at every k-th step of a block
(k = 1: every step, which is exactly ``cache="none"``). ``dual`` only: ``look_back`` /
``look_ahead`` widen the recomputed region to ``[s - look_back, e + look_ahead)`` (dInfer's
vicinity refresh, defaults there 16 / 16; here 0 / 0 = Fast-dLLM), and ``warmup = w`` makes the
first w steps of every block full forwards (dInfer's ``warmup_steps``, default there 4).

Differences from Fast-dLLM, on purpose:
- Keys are stored after RoPE (Fast-dLLM stores them before and re-rotates all keys at every step);
  the keys are bit-identical, since a column's position never changes during a call.
- Left-padded batches work (explicit positions and a key-padding mask; Fast-dLLM ignores the
  padding, NVlabs/Fast-dLLM#40) and so does ``dual`` with batch > 1 (NVlabs/Fast-dLLM PR #17).
- Dream (``logit_shift = 1``): a cached query starts one column early, at ``s - 1``, so the logits
  of column s exist after the shift (the hidden state at s - 1 predicts s). Fast-dLLM's Dream driver
  instead commits ``x[s]`` from the block-start forward unconditionally, whatever the sampler says
  (``dream/model/generation_utils_block.py``). Here every commit is the sampler's; the price is one extra query row, and the
  K/V of column ``s - 1`` are recomputed (fresh) at every cached step.
- Counting: NFE counts every forward (the block-start one included, as Fast-dLLM does);
  ``forwarded_tokens`` adds rows x queries: L for a full forward, L - s (+1 for Dream) for a cached
  prefix step, e - s (+ look-back/ahead, +1 for Dream) for a cached dual step.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

from dllm.cache.base import CachePolicy, Query, check_refresh, register_cache
from dllm.options import check_int
from dllm.state import DecodeState


@dataclass(frozen=True)
class PrefixConfig:
    refresh: Optional[int] = None  # full forward every `refresh` steps of a block (None: block starts only)

    def __post_init__(self) -> None:
        check_refresh(self.refresh)


@register_cache("prefix")
class PrefixCache(CachePolicy):
    """Fast-dLLM PrefixCache: queries [s, L) against K/V of [0, s) frozen at the block start."""

    Config = PrefixConfig

    def cached_query(self, state: DecodeState, shift: int) -> Query:
        length = state.x.shape[1]
        return Query(*self.cached_span(length, state.block_start, state.block_end, shift), length)

    def cached_span(self, length: int, start: int, end: int, shift: int) -> tuple[int, int]:
        """The query columns of a cached step of block ``[start, end)`` on a canvas of ``length``."""
        return start - shift, length


@dataclass(frozen=True)
class DualConfig:
    refresh: Optional[int] = None  # full forward every `refresh` steps of a block (None: block starts only)
    look_back: int = 0  # also recompute this many columns left of the block (dInfer prefix_look)
    look_ahead: int = 0  # also recompute this many columns right of the block (dInfer after_look)
    warmup: int = 0  # the first `warmup` steps of every block are full forwards (dInfer warmup_steps)

    def __post_init__(self) -> None:
        check_refresh(self.refresh)
        check_int("look_back", self.look_back, 0)
        check_int("look_ahead", self.look_ahead, 0)
        check_int("warmup", self.warmup, 0)


@register_cache("dual")
class DualCache(CachePolicy):
    """Fast-dLLM DualCache: queries [s, e) against the whole cache, block rows refreshed in place."""

    Config = DualConfig

    def cached_query(self, state: DecodeState, shift: int) -> Query:
        length = state.x.shape[1]
        return Query(*self.cached_span(length, state.block_start, state.block_end, shift), length)

    def cached_span(self, length: int, start: int, end: int, shift: int) -> tuple[int, int]:
        """The query columns of a cached step of block ``[start, end)`` on a canvas of ``length``."""
        cfg = self.config
        return max(0, start - max(shift, cfg.look_back)), min(length, end + cfg.look_ahead)
