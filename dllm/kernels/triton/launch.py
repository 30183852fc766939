"""Launching the Triton kernels: who watches a launch, the output tensors a caller hands a kernel
(``checked_out``), and the attention kernel's launch geometry.

``observed_launch`` runs ``kernel[grid](...)`` and tells the launch observers (``LAUNCH_OBSERVERS``;
``dllm.eval.bench.counters.DispatchCounter`` is one) that it happened: a dispatch mode sees ATen
calls only, and a Triton launch costs the host as much as one. With no observer it is the launch
and one list test.

The geometry: pure functions of the shapes (no triton, no device): ``plan_attention`` returns the ``AttnPlan``
that ``dllm.kernels.triton.attention.flash_attention`` launches, ``plan_splits`` the key split
alone. The kernel's grid is ``(query_tiles, B * H, splits)``: one program per query tile, head and
key range, each reading keys ``[s * split_len, (s + 1) * split_len)``.

The split exists for the cached step of a dLLM decode: a short query block (8-64 rows: one
query tile) against thousands of cached keys. There ``B * H * query_tiles`` programs (32 for
LLaDA-8B at batch 1) cannot fill a GPU of ~132 SMs, so the keys are cut into ranges run by
separate programs and merged by their log-sum-exp. The rule (``SplitConfig``):

- no split once ``B * H * query_tiles >= waves * SMs`` (the grid already fills the device);
- otherwise ``ceil(waves * SMs / programs)`` ranges, each of at least ``min_tiles`` key tiles
  (a range shorter than a few tiles pays the merge for little work), at most ``max_splits``;
- ranges are whole key tiles and none is empty: ``splits = ceil(key_tiles / tiles_per_split)``.
"""

from __future__ import annotations

import contextlib
import math
from dataclasses import dataclass, field
from typing import Any, Iterator, Optional, Protocol

import torch


class LaunchObserver(Protocol):
    """Told of each launch; an observer may also define ``launch_called(name, grid, args, kwargs)``, called
    after ``launch_begins`` with the launch's arguments (``dllm.engine.graph_check`` traces them)."""

    def launch_begins(self, name: str) -> None: ...

    def launch_ends(self, name: str) -> None: ...


LAUNCH_OBSERVERS: list[LaunchObserver] = []  # told of every Triton launch of dllm.kernels


@dataclass(frozen=True)
class Launch:
    """One launch a kernel wrapper asked for: ``kernel[grid](*args, **kwargs)``."""

    name: str
    kernel: Any
    grid: Any
    args: tuple
    kwargs: dict


@dataclass
class Recording:
    """Launches recorded instead of run (``record_launches``), for a GPU of ``sms`` SMs that is not
    here: the wrappers plan their launches for it and accept tensors of any device."""

    sms: int
    launches: list[Launch] = field(default_factory=list)


_RECORDING: list[Recording] = []


def recording() -> Optional[Recording]:
    """The recording in progress (``record_launches``), or None."""
    return _RECORDING[-1] if _RECORDING else None


@contextlib.contextmanager
def record_launches(sms: int) -> Iterator[Recording]:
    """Within the block, ``observed_launch`` records each launch and runs nothing (the outputs stay
    unwritten), the wrappers' device check passes any tensor and their launch plans take ``sms`` SMs:
    what ``dllm.kernels.triton.ahead`` compiles for a GPU target from a machine without one."""
    if sms < 1:
        raise ValueError(f"sms must be >= 1, got {sms}")
    rec = Recording(sms)
    _RECORDING.append(rec)
    try:
        yield rec
    finally:
        _RECORDING.remove(rec)


def observed_launch(name: str, kernel: Any, grid: Any, *args: Any, **kwargs: Any) -> Any:
    """``kernel[grid](*args, **kwargs)``, between ``launch_begins(name)`` and ``launch_ends(name)`` of
    every observer (under ``TRITON_INTERPRET=1`` the launch itself runs torch ops, which an observer
    that counts ATen calls leaves out); recorded and not run inside ``record_launches``."""
    if _RECORDING:
        _RECORDING[-1].launches.append(Launch(name, kernel, grid, args, kwargs))
        return None
    if not LAUNCH_OBSERVERS:
        return kernel[grid](*args, **kwargs)
    begun = []  # each observer that began hears the end, whatever raises
    try:
        for obs in list(LAUNCH_OBSERVERS):
            obs.launch_begins(name)
            begun.append(obs)
            called = getattr(obs, "launch_called", None)
            if called is not None:
                called(name, grid, args, kwargs)
        return kernel[grid](*args, **kwargs)
    finally:
        for obs in begun:
            obs.launch_ends(name)


def checked_out(name: str, out: tuple[torch.Tensor, ...], shapes: tuple[tuple[int, ...], ...],
                dtypes: tuple[torch.dtype, ...], device: torch.device) -> tuple[torch.Tensor, ...]:
    """A kernel's ``out`` tensors given by its caller, when they are contiguous, of ``shapes`` and
    ``dtypes``, on ``device`` (the kernels write them row-major); raises ValueError naming the kernel,
    what was given and what is needed otherwise."""
    if len(out) != len(shapes) or any(
            tuple(t.shape) != tuple(shape) or t.dtype != dtype or t.device != device or not t.is_contiguous()
            for t, shape, dtype in zip(out, shapes, dtypes)):
        got = [(str(t.dtype), tuple(t.shape), str(t.device), t.is_contiguous()) for t in out]
        want = [(str(dtype), tuple(shape)) for dtype, shape in zip(dtypes, shapes)]
        raise ValueError(f"{name}: out must be contiguous tensors {want} on {device}, got (dtype, shape, "
                         f"device, contiguous) {got}")
    return tuple(out)


def next_pow2(n: int) -> int:
    """Smallest power of two >= n (1 for n <= 1)."""
    return 1 << max(0, (n - 1).bit_length())


@dataclass(frozen=True)
class SplitConfig:
    """waves: target programs per SM; min_tiles: key tiles per range at least; max_splits: cap."""

    waves: float = 2.0
    min_tiles: int = 4
    max_splits: int = 64

    def __post_init__(self) -> None:
        if not self.waves > 0 or self.min_tiles < 1 or self.max_splits < 1:
            raise ValueError(f"SplitConfig needs waves > 0, min_tiles >= 1, max_splits >= 1, got {self}")


@dataclass(frozen=True)
class AttnPlan:
    block_m: int  # query rows per program (power of two >= 16: tl.dot's minimum)
    block_n: int  # keys per loop iteration
    block_d: int  # head dim padded to a power of two >= 16
    query_tiles: int
    splits: int  # key ranges (grid axis 2); 1 = no merge
    split_len: int  # keys per range, a multiple of block_n

    @property
    def programs(self) -> int:
        """Programs per (batch row, head): query_tiles * splits."""
        return self.query_tiles * self.splits


def plan_splits(programs: int, n_keys: int, block_n: int, sms: int,
                config: SplitConfig = SplitConfig()) -> tuple[int, int]:
    """(splits, split_len) for ``programs`` programs before splitting over ``n_keys`` keys in
    tiles of ``block_n`` on a device with ``sms`` SMs (see the module docstring).

    Guarantees: split_len % block_n == 0; splits * split_len >= n_keys; every range holds at least
    one key ((splits - 1) * split_len < n_keys); splits == 1 when n_keys <= block_n.
    """
    if programs < 1 or block_n < 1 or sms < 1 or n_keys < 0:
        raise ValueError(f"plan_splits needs programs, block_n, sms >= 1 and n_keys >= 0, got programs={programs}, "
                         f"n_keys={n_keys}, block_n={block_n}, sms={sms}")
    tiles = max(1, math.ceil(n_keys / block_n))
    target = config.waves * sms
    if programs >= target or tiles < 2 * config.min_tiles:
        return 1, tiles * block_n
    want = min(math.ceil(target / programs), config.max_splits)
    per_split = max(config.min_tiles, tiles // want)
    splits = math.ceil(tiles / per_split)
    if splits > config.max_splits:
        per_split = math.ceil(tiles / config.max_splits)
        splits = math.ceil(tiles / per_split)
    return splits, per_split * block_n


def fixed_splits(num_splits: int, n_keys: int, block_n: int) -> tuple[int, int]:
    """(splits, split_len) for a requested ``num_splits``: whole tiles per range, no empty range
    (so possibly fewer ranges than requested)."""
    if num_splits < 1:
        raise ValueError(f"num_splits must be >= 1, got {num_splits}")
    tiles = max(1, math.ceil(n_keys / block_n))
    per_split = math.ceil(tiles / min(num_splits, tiles))
    return math.ceil(tiles / per_split), per_split * block_n


def plan_attention(batch: int, heads: int, q_len: int, n_keys: int, head_dim: int, *, sms: Optional[int],
                   block_m: Optional[int] = None, block_n: Optional[int] = None, num_splits: Optional[int] = None,
                   config: SplitConfig = SplitConfig()) -> AttnPlan:
    """The launch plan of one attention call.

    block_m: default the query length rounded up to a power of two in [16, 64] (a decode block is
        one tile). block_n: default 64 keys (32 for head dims above 128). num_splits: as given
        (``fixed_splits``), else ``plan_splits`` with ``sms`` SMs; ``sms=None`` (the interpreter,
        where the grid runs serially) means no split.
    """
    if q_len < 1 or head_dim < 1 or batch < 1 or heads < 1:
        raise ValueError(f"plan_attention needs batch, heads, q_len, head_dim >= 1, got batch={batch}, "
                         f"heads={heads}, q_len={q_len}, head_dim={head_dim}")
    for name, value in (("block_m", block_m), ("block_n", block_n)):  # tl.arange and tl.dot need these
        if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value < 16
                                  or value & (value - 1)):
            raise ValueError(f"{name} must be a power of two >= 16, got {value!r}")
    block_d = max(16, next_pow2(head_dim))
    block_m = block_m or max(16, min(64, next_pow2(q_len)))
    block_n = block_n or (64 if block_d <= 128 else 32)
    query_tiles = math.ceil(q_len / block_m)
    if num_splits is not None:
        splits, split_len = fixed_splits(num_splits, n_keys, block_n)
    elif sms is None:
        splits, split_len = fixed_splits(1, n_keys, block_n)
    else:
        splits, split_len = plan_splits(batch * heads * query_tiles, n_keys, block_n, sms, config)
    return AttnPlan(block_m, block_n, block_d, query_tiles, splits, split_len)


__all__ = ["AttnPlan", "LAUNCH_OBSERVERS", "Launch", "LaunchObserver", "Recording", "SplitConfig", "checked_out",
           "fixed_splits", "next_pow2", "observed_launch", "plan_attention", "plan_splits", "record_launches",
           "recording"]
