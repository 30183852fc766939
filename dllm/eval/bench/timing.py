"""Timing and peak memory for the benchmarks (``bench.caches``, ``bench.kernels``, ``bench.throughput``).

- ``sync(device)``: wait for queued CUDA work, so that a wall clock measures it (no-op on CPU).
- ``reset_peak_memory(device)`` / ``peak_memory_mb(device)``: CUDA: ``max_memory_allocated`` since
  the reset. CPU: the process's peak resident set (``VmHWM``) since ``/proc/self/clear_refs`` reset
  it; it includes the model and the interpreter. None where Linux does not allow the reset.
- ``timed(fn, device, repeats=..., warmup=...)``: the median wall time of ``fn()`` over ``repeats``
  device-synchronised calls after ``warmup`` untimed ones, with the median call's result and the
  peak memory of the timed calls.
- ``StepClock``: wall time per component (layers, embedding, head, the sampler's statistics, the
  engine) of the timed steps of one ``generate`` call (``bench.breakdown``), which it ends by raising
  ``StepsDone`` from the step callback.
"""

from __future__ import annotations

import statistics
import time
from collections import defaultdict
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


class StepsDone(Exception):
    """Raised by the step callback once the timed steps are done."""


class StepClock:
    """Accumulates wall time per component over the timed steps of one ``generate`` call."""

    def __init__(self, model, sampler, device: torch.device, steps: int, components: bool = True) -> None:
        self.device, self.steps = device, steps
        self.total: dict[str, float] = defaultdict(float)
        self.layer_calls = 0
        self.started: Optional[float] = None  # wall clock of the current step's start
        self.step_times: list[float] = []
        self.logits_rows: list[int] = []
        self._open: dict[int, float] = {}
        self._in_stats = False
        self._forward_in_stats = 0.0
        tr = model.transformer
        self._hooks = []
        if not components:  # CUDA graphs: a replay runs no module, and no sync may sit inside a capture
            return
        for layer in tr.layers:
            self._time_module(layer, "layer")
        self._time_module(tr.embed, "embedding")
        self._time_module(tr.norm, "head")
        if tr.lm_head is not None:
            self._time_module(tr.lm_head, "head")
        self._wrap_sampler(sampler)

    def _now(self) -> float:
        sync(self.device)
        return time.perf_counter()

    def _time_module(self, module, name: str) -> None:
        def pre(mod, args):
            self._open[id(mod)] = self._now()

        def post(mod, args, out):
            spent = self._now() - self._open.pop(id(mod))
            if self.started is None:
                return
            if self._in_stats:  # a forward the sampler makes itself (verification variants)
                self._forward_in_stats += spent
            self.total[name] += spent
            if name == "layer":
                self.layer_calls += 1
            if mod is getattr(self, "_last_head", None):
                self.logits_rows.append(int(out.shape[1]))

        self._hooks += [module.register_forward_pre_hook(pre), module.register_forward_hook(post)]
        if name == "head":
            self._last_head = module

    def _wrap_sampler(self, sampler) -> None:
        inner = sampler.step

        def step(inp, state):
            if self.started is None:
                return inner(inp, state)
            self._in_stats, self._forward_in_stats = True, 0.0
            t0 = self._now()
            try:
                return inner(inp, state)
            finally:
                self.total["statistics"] += self._now() - t0 - self._forward_in_stats
                self._in_stats = False

        sampler.step = step

    def begin(self) -> None:
        self.started = self._now()

    def end_step(self, state) -> None:
        if self.started is None:
            return
        now = self._now()
        self.step_times.append(now - self.started)
        self.started = now
        if len(self.step_times) >= self.steps:
            raise StepsDone

    def close(self) -> None:
        for h in self._hooks:
            h.remove()

    def per_step(self, n_layers: int) -> dict[str, float]:
        """Mean seconds per step: one layer, embedding, head, statistics, engine, step."""
        n = max(1, len(self.step_times))
        step = sum(self.step_times) / n
        layers = self.total["layer"] / n
        out = {"layer": layers / n_layers, "embedding": self.total["embedding"] / n,
               "head": self.total["head"] / n, "statistics": self.total["statistics"] / n}
        out["engine"] = max(0.0, step - layers - out["embedding"] - out["head"] - out["statistics"])
        out["step"] = step
        return out


__all__ = ["StepClock", "StepsDone", "Timing", "peak_memory_mb", "reset_peak_memory", "sync", "timed"]
