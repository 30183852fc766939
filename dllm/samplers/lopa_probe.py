"""Whether ``stats="auto"`` may run LoPA's selection kernels on a device: a probe once per device.

``dllm.kernels.triton.lopa`` compiles two Triton kernels at their first launch. ``stats="fused"``
asks for them outright (an error is the caller's); ``stats="auto"``, the default of ``fast``, takes
them on a device only after this probe has run them there once on a small synthetic step (random
and tied statistics, a row without masks, a row the anchor fills) and found the same commits and
tokens as the torch ops on the same statistics. Otherwise ``auto`` keeps the torch ops with the
fused statistics and says why, once (a ``RuntimeWarning``): a kernel that does not compile or
decides differently on some device never changes a decode's tokens or stops it.
"""

from __future__ import annotations

import functools
import warnings
from typing import Any, Callable, Optional

import torch

from dllm.state import StepInput

_V, _MASK = 40, 39  # the probe's vocabulary and mask id


def _probe_input(device: torch.device, seed: int) -> StepInput:
    """A block of 4 rows x 8 columns whose variant forward is a fixed function of each canvas."""
    g = torch.Generator().manual_seed(seed)
    b, w = 4, 8
    logits = torch.randn(b, w, _V, generator=g) * 3  # [B, W, V]
    logits[1] = logits[1, :1]  # row 1: every column alike (ties in the ranking and the threshold's best)
    logits[3] = 0.0
    logits[3, :, 5] = 30.0  # row 3: every mask confident (the anchor fills the block)
    active = torch.rand(b, w, generator=g) < 0.7
    active[2] = False  # row 2: no mask left
    active[3] = True
    tokens = torch.randint(0, _MASK, (b, w), generator=g)
    tokens[active] = _MASK
    table = torch.randn(b, w, _V, generator=g).to(device)  # [B, W, V]
    emb = torch.randn(_V, _V, generator=g).to(device)

    def forward_variants(canvas: torch.Tensor, rows: torch.Tensor, n: int, every_row: bool = False,
                         host_rows=None) -> torch.Tensor:
        return table[rows] + emb[canvas].roll(1, dims=1)  # [R * n, W, V]

    return StepInput(logits=logits.to(device), tokens=tokens.to(device), active=active.to(device), query_start=0,
                     window=(0, w), step=0, steps=None, mask_id=_MASK, temperature=0.0, generator=None,
                     forward_variants=forward_variants)


@functools.lru_cache(maxsize=None)
def kernels_refused(device: str, lopa: Callable[..., Any]) -> Optional[str]:
    """None when LoPA's kernels ran on ``device`` and decided as the torch ops on the probe; else why
    not (the exception, or the first differing case). ``lopa``: the sampler class (``LoPA``; passed
    in, so this module imports no sampler). Cached per device for the process."""
    dev = torch.device(device)
    try:
        for seed in range(2):
            inp = _probe_input(dev, seed)
            for options in ({}, {"confidence": "max_prob", "reuse": True}):
                kernels = lopa(stats="fused", compact=False, **options).step(inp, None)
                ops = lopa(stats="fused", compact=True, **options).step(inp, None)
                if not (torch.equal(kernels.commit, ops.commit)
                        and torch.equal(kernels.tokens[kernels.commit], ops.tokens[ops.commit])):
                    return f"the kernels' commits differ from the torch ops' on the probe (seed {seed}, {options})"
    except Exception as exc:  # a kernel that does not compile or launch here: auto keeps the torch ops
        return f"{type(exc).__name__}: {str(exc)[:200]}"
    return None


def use_kernels(device: torch.device, lopa: Callable[..., Any]) -> bool:
    """Whether ``stats="auto"`` runs LoPA's kernels on ``device`` (warns once per device when not)."""
    reason = kernels_refused(str(device), lopa)
    if reason is not None:
        _warn_once(str(device), reason)
    return reason is None


@functools.lru_cache(maxsize=None)
def _warn_once(device: str, reason: str) -> None:
    warnings.warn(f"LoPA's selection kernels are not used on {device} (stats='auto' keeps the torch ops): "
                  f"{reason}", RuntimeWarning, stacklevel=3)


__all__ = ["kernels_refused", "use_kernels"]
