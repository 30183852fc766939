"""``drift``: a dual cache that also recomputes the columns whose keys drifted in the last block.

Fast-dLLM's ``dual`` cache (arXiv 2505.22618) recomputes only the block between full forwards;
dInfer's vicinity refresh (arXiv 2510.08666) also recomputes fixed margins around it
(``dual:look_back=16,look_ahead=16``). Which columns a model needs recomputed depends on how far the
block's commits move the other columns' keys, and that changes with the prompt, the task and the
model. In the spirit of Elastic-Cache (arXiv 2510.14973: refresh where the measured drift says so)
and d2Cache (arXiv 2509.23094: recompute the tokens whose states move, reuse the rest), this
policy measures the drift instead of fixing a margin:

- every block starts with a full forward (as ``dual``); just before it overwrites the buffers,
  ``dllm.models.core.kv.DriftProbe`` compares its fresh keys with the cached ones, the keys the previous
  block's steps attended to: per column, the mean over layers of ``||k_new - k_old||^2 /
  ||k_new||^2`` (the relative squared error the cache carried);
- the block's cached steps recompute the block, plus every column left of it whose drift was >=
  ``threshold`` in some row (any columns, not a contiguous margin: ``Query.extra``; at most
  ``max_extra`` of them, the most drifted), plus a right margin reaching the rightmost drifted
  column after the block (capped by ``max_look_ahead``); every other column reuses its cached K/V;
- the first block has no measurement yet: its cached steps recompute the ``first_look_back``
  columns left of it and ``first_look_ahead`` right of it (dInfer's fixed vicinity; None = the
  whole prefix).

The query is fixed for the whole block (chosen at its first cached step), so verification samplers
(``fast``) can use the policy: a variant's forward reproduces the later step it stands for. Across
blocks it does not: the next block's columns are chosen from the buffers the steps that ran wrote,
so ``ssd`` / ``spec_threshold``, which skip the steps they verify, are not token-equal to
``low_confidence`` / ``threshold`` under ``drift`` (they are under ``prefix``, ``dual``, ``window``). The
choice reads the drift on the host once per block (one sync per block, not per step); it is made for
the whole batch (columns drifted in some row), so a batch row may recompute columns it would reuse
alone, and its tokens in a batch can differ from its tokens alone (every other built-in cache gives
the same tokens either way). Samplers with
a shadow block (``wino``) cannot use it (the extra columns have no place in the shadow forward):
the engine says so.

Options: ``threshold`` (relative squared key error, default 0.01, i.e. 10% relative error),
``max_extra``, ``max_look_ahead``, ``first_look_back`` (default 64), ``first_look_ahead`` (default 0).
Counting: ``forwarded_tokens`` adds the extra columns to each cached query's length.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

import torch

from dllm.cache.base import CachePolicy, Query, register_cache
from dllm.models.core.kv import DriftProbe
from dllm.options import check_int, check_number, check_optional_int
from dllm.state import DecodeState


@dataclass(frozen=True)
class DriftConfig:
    threshold: float = 0.01  # recompute the columns whose relative squared key drift was >= this
    max_extra: Optional[int] = None  # cap on the recomputed columns left of the block (the most drifted kept)
    max_look_ahead: Optional[int] = None  # cap on the right margin (None: up to the canvas end)
    first_look_back: Optional[int] = 64  # the first block's left margin (None: the whole prefix)
    first_look_ahead: int = 0  # the first block's right margin

    def __post_init__(self) -> None:
        check_number("drift threshold", self.threshold, low=0, low_open=True,
                     hint=" (a relative squared key error, e.g. 0.01)")
        check_optional_int("max_extra", self.max_extra, 0)
        check_optional_int("max_look_ahead", self.max_look_ahead, 0)
        check_optional_int("first_look_back", self.first_look_back, 0)
        check_int("first_look_ahead", self.first_look_ahead, 0)


def drifted_columns(drift: torch.Tensor, start: int, end: int, threshold: float,
                    max_extra: Optional[int] = None) -> tuple[torch.Tensor, int]:
    """(the columns left of ``start`` whose ``drift`` [R, L] is >= ``threshold`` in some row, sorted,
    at most ``max_extra`` of them: the most drifted; the right margin reaching the rightmost such
    column at or after ``end``)."""
    worst = drift.amax(dim=0)  # [L]
    left = torch.nonzero(worst[:start] >= threshold).flatten()
    if max_extra is not None and left.numel() > max_extra:
        left = left[worst[left].topk(max_extra).indices].sort().values
    right = torch.nonzero(worst[end:] >= threshold).flatten()
    return left, (int(right[-1]) + 1 if right.numel() else 0)


@register_cache("drift")
class DriftCache(CachePolicy):
    """Dual cache that also recomputes the columns whose keys drifted in the last block."""

    Config = DriftConfig

    def sampler_refusal(self, sampler) -> Optional[str]:
        if sampler.shadow_block:
            return (f"decodes with a shadow block, which cache policy {self.name!r} cannot serve (the "
                    "recomputed columns outside the query have no place in the shadow forward); use "
                    "cache='dual' or 'none'")
        return super().sampler_refusal(sampler)

    def allocate(self, model, rows: int, length: int):
        kv = model.new_kv_cache(rows, length)
        kv.drift_probe = DriftProbe()
        return kv

    def plan(self, probe: DriftProbe, start: int, end: int, length: int) -> Query:
        """The block's cached query (``start`` already moved left by the model's logit shift)."""
        cfg = self.config
        if probe.drift is None:  # first block: nothing measured yet, a fixed vicinity (dInfer's rule)
            back = start if cfg.first_look_back is None else cfg.first_look_back
            return Query(max(0, start - back), min(length, end + cfg.first_look_ahead), length)
        extra, ahead = drifted_columns(probe.drift, start, end, cfg.threshold, cfg.max_extra)
        if cfg.max_look_ahead is not None:
            ahead = min(ahead, cfg.max_look_ahead)
        return Query(start, min(length, end + ahead), length, extra if extra.numel() else None)

    def cached_query(self, state: DecodeState, shift: int) -> Query:
        probe: DriftProbe = state.kv.drift_probe
        s, e = state.block_start, state.block_end
        key = (state.block_index, s, e)
        if probe.decision is None or probe.decision[0] != key:  # once per block: one host read
            probe.decision = (key, self.plan(probe, max(0, s - shift), e, state.x.shape[1]))
        return probe.decision[1]


__all__ = ["DriftCache", "DriftConfig", "drifted_columns"]
