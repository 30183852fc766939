"""``drift``: a dual cache whose recomputed window is set, block by block, from measured key drift.

Fast-dLLM's ``dual`` cache (arXiv 2505.22618) recomputes only the block between full forwards;
dInfer's vicinity refresh (arXiv 2510.08666) also recomputes fixed margins around it
(``dual:look_back=16,look_ahead=16``). Which margin a model needs depends on how far the block's
commits move the other columns' keys, and that changes with the prompt length, the task and the
model: a 40-token prompt next to a 4-token block drifts a lot, the far end of a 2,000-token table
hardly at all. In the spirit of Elastic-Cache (arXiv 2510.14973: refresh where and when attention
drift says so) and d2Cache (arXiv 2509.23094: recompute the tokens whose states move), this policy
measures the drift instead of fixing the margin:

- every block starts with a full forward (as ``dual``); just before it overwrites the buffers,
  ``dllm.models.kv.DriftProbe`` compares its fresh keys with the cached ones, the keys the previous
  block's steps attended to: per column, the mean over layers of ``||k_new - k_old||^2 /
  ||k_new||^2`` (the relative squared error the cache carried);
- the block's cached steps recompute ``[s - b, e + a)``: ``b`` reaches the leftmost column left of
  the block whose drift was >= ``threshold``, ``a`` the rightmost one right of it (the maximum
  over the batch rows); every other column reuses its cached keys/values;
- the first block has no measurement yet: its cached steps recompute ``[0, e + first_look_ahead)``
  (prefix-like: the whole prompt, which for a long prompt costs one block of uncached steps).

So the columns that drifted in the last block are recomputed in this one; a column whose drift
stays under ``threshold`` is served from the cache. The window is fixed for the whole block (chosen
at its first cached step), so verification samplers (``fast``) can use the policy: a variant's
forward reproduces the later step it stands for. The choice reads the drift on the host once per
block (one sync per block, not per step).

Options: ``threshold`` (relative squared key error, default 0.01 = 10% relative error),
``max_look_back`` / ``max_look_ahead`` (caps; None = no cap), ``first_look_ahead`` (the first
block's right margin, default 0).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

import torch

from dllm.cache.base import CachePolicy, Query, register_cache
from dllm.models.kv import DriftProbe
from dllm.options import check_int, check_optional_int
from dllm.state import DecodeState


@dataclass(frozen=True)
class DriftConfig:
    threshold: float = 0.01  # recompute the columns whose relative squared key drift was >= this
    max_look_back: Optional[int] = None  # cap on the left margin (None: up to the whole prefix)
    max_look_ahead: Optional[int] = None  # cap on the right margin (None: up to the canvas end)
    first_look_ahead: int = 0  # the first block's right margin (its left one is the whole prefix)

    def __post_init__(self) -> None:
        if isinstance(self.threshold, bool) or not isinstance(self.threshold, (int, float)) or not self.threshold > 0:
            raise ValueError(f"drift threshold must be a number > 0 (a relative squared key error, e.g. 0.01), "
                             f"got {self.threshold!r}")
        check_optional_int("max_look_back", self.max_look_back, 0)
        check_optional_int("max_look_ahead", self.max_look_ahead, 0)
        check_int("first_look_ahead", self.first_look_ahead, 0)


def drift_margins(drift: torch.Tensor, start: int, end: int, threshold: float) -> tuple[int, int]:
    """(look_back, look_ahead) covering every column left / right of ``[start, end)`` whose
    ``drift`` [R, L] is >= ``threshold`` in some row."""
    hot = (drift >= threshold).any(dim=0)  # [L]
    left = torch.nonzero(hot[:start]).flatten()
    right = torch.nonzero(hot[end:]).flatten()
    back = start - int(left[0]) if left.numel() else 0
    ahead = int(right[-1]) + 1 if right.numel() else 0
    return back, ahead


@register_cache("drift")
class DriftCache(CachePolicy):
    """Dual cache whose recomputed window covers the columns whose keys drifted in the last block."""

    Config = DriftConfig

    def allocate(self, model, rows: int, length: int):
        kv = model.new_kv_cache(rows, length)
        kv.drift_probe = DriftProbe()
        return kv

    def margins(self, probe: DriftProbe, start: int, end: int, length: int) -> tuple[int, int]:
        """The block's (look_back, look_ahead), capped."""
        cfg = self.config
        if probe.drift is None:  # first block: nothing measured yet
            back, ahead = start, cfg.first_look_ahead
        else:
            back, ahead = drift_margins(probe.drift, start, end, cfg.threshold)
        if cfg.max_look_back is not None:
            back = min(back, cfg.max_look_back)
        if cfg.max_look_ahead is not None:
            ahead = min(ahead, cfg.max_look_ahead)
        return back, min(ahead, length - end)

    def cached_query(self, state: DecodeState, shift: int) -> Query:
        probe: DriftProbe = state.kv.drift_probe
        s, e, length = state.block_start, state.block_end, state.x.shape[1]
        key = (state.block_index, s, e)
        if probe.decision is None or probe.decision[0] != key:  # once per block: one host read
            probe.decision = (key, self.margins(probe, s, e, length))
        back, ahead = probe.decision[1]
        return Query(max(0, s - max(shift, back)), min(length, e + ahead), length)


__all__ = ["DriftCache", "DriftConfig", "drift_margins"]
