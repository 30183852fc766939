"""Timing and peak memory for the benchmarks (``bench.caches``, ``bench.kernels``, ``bench.throughput``).

- ``sync(device)``: wait for queued CUDA work, so that a wall clock measures it (no-op on CPU).
- ``reset_peak_memory(device)`` / ``peak_memory_mb(device)``: CUDA: ``max_memory_allocated`` since
  the reset. CPU: the process's peak resident set (``VmHWM``) since ``/proc/self/clear_refs`` reset
  it; it includes the model and the interpreter. None where Linux does not allow the reset.
- ``timed(fn, device, repeats=..., warmup=...)``: the median wall time of ``fn()`` over ``repeats``
  device-synchronised calls after ``warmup`` untimed ones, with the median call's result and the
  peak memory of the timed calls.
"""

from __future__ import annotations

import statistics
import time
from dataclasses import dataclass
from typing import Any, Callable, Optional

import torch


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def reset_peak_memory(device: torch.device) -> bool:
    """Start a new peak-memory window; False where the platform cannot reset it."""
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)
        return True
    try:
        with open("/proc/self/clear_refs", "w") as f:  # "5" resets the peak RSS (Linux >= 4.0)
            f.write("5")
        return True
    except OSError:
        return False


def peak_memory_mb(device: torch.device) -> Optional[float]:
    """Peak memory (MiB) since ``reset_peak_memory``; None where it cannot be read."""
    if device.type == "cuda":
        return torch.cuda.max_memory_allocated(device) / 2**20
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) / 1024  # kB -> MiB
    except OSError:
        pass
    return None


@dataclass
class Timing:
    seconds: float  # median wall time of the timed calls
    times: list[float]  # every timed call, in order
    result: Any  # what the median call returned
    peak_mb: Optional[float]  # the largest per-call peak; None where it cannot be measured


def timed(fn: Callable[[], Any], device: torch.device, *, repeats: int = 1, warmup: int = 0) -> Timing:
    """Call ``fn`` ``warmup`` times untimed, then ``max(1, repeats)`` times, each between two
    device syncs with the peak memory reset before it."""
    for _ in range(warmup):
        fn()
    times, results, peaks = [], [], []
    for _ in range(max(1, repeats)):
        sync(device)
        can_peak = reset_peak_memory(device)
        t0 = time.perf_counter()
        results.append(fn())
        sync(device)
        times.append(time.perf_counter() - t0)
        peaks.append(peak_memory_mb(device) if can_peak else None)
    median = statistics.median(times)
    middle = sorted(range(len(times)), key=times.__getitem__)[len(times) // 2]
    known = [p for p in peaks if p is not None]
    return Timing(median, times, results[middle], max(known) if known else None)


__all__ = ["Timing", "peak_memory_mb", "reset_peak_memory", "sync", "timed"]
