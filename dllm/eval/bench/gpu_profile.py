"""The GPU's view of decode steps: the share of wall time it is busy and kernel launches per step.

``profile_generate`` runs one ``generate`` call, starts ``torch.profiler`` (CPU and CUDA activities)
after ``warmup`` steps and stops it after ``steps`` more; from the trace it sums the device time of
every kernel (busy time, overlaps counted once per kernel) and counts the runtime's launch calls
(``cudaLaunchKernel``, ``cuLaunchKernel``, ``cudaLaunchKernelExC`` and graph launches). On a CPU-only
machine there is nothing to profile: ``profile_generate`` refuses.
"""

from __future__ import annotations

import time
from typing import Any

import torch

LAUNCHES = ("cudaLaunchKernel", "cuLaunchKernel", "cudaLaunchKernelExC", "cuLaunchKernelEx", "cudaGraphLaunch")


class _Done(Exception):
    """Raised by the step callback once the profiled steps are done."""


def kernel_busy_seconds(events: Any) -> float:
    """Sum of the device time of the kernels in a profiler's ``events()``."""
    total_us = 0.0
    for e in events:
        if getattr(e, "device_type", None) == torch.autograd.DeviceType.CUDA:
            total_us += e.device_time if hasattr(e, "device_time") else e.cuda_time
    return total_us / 1e6


def launch_count(events: Any) -> int:
    return sum(1 for e in events if e.name in LAUNCHES)


def decode_block(model, prompt: torch.Tensor, *, sampler: Any, cache: str, block_length: int, callback: Any,
                 cuda_graphs: Any, stop: type[Exception]) -> None:
    """``generate`` one block of ``block_length`` after ``prompt`` under inference mode, until the
    block ends or ``callback`` raises ``stop``."""
    from dllm.engine import generate

    try:
        with torch.inference_mode():
            generate(model, prompt, sampler=sampler, gen_length=block_length, block_length=block_length,
                     cache=cache, callback=callback, cuda_graphs=cuda_graphs)
    except stop:
        pass


def profile_generate(model, prompt: torch.Tensor, *, sampler: str, cache: str, block_length: int,
                     warmup: int, steps: int, cuda_graphs: Any = False) -> dict[str, float]:
    """{"gpu_busy": busy share of the profiled steps' wall time, "launches_per_step": ...}."""
    from torch.profiler import ProfilerActivity, profile

    if not torch.cuda.is_available() or prompt.device.type != "cuda":
        raise ValueError("profile_generate profiles CUDA work: the model and prompt must be on a CUDA device")
    prof = profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA])
    seen = {"n": 0, "t0": 0.0, "t1": 0.0}

    def callback(state) -> None:
        seen["n"] += 1
        if seen["n"] == warmup:
            torch.cuda.synchronize()
            prof.start()
            seen["t0"] = time.perf_counter()
        elif seen["n"] == warmup + steps:
            torch.cuda.synchronize()
            seen["t1"] = time.perf_counter()
            prof.stop()
            raise _Done

    decode_block(model, prompt, sampler=sampler, cache=cache, block_length=block_length, callback=callback,
                 cuda_graphs=cuda_graphs, stop=_Done)
    if not seen["t1"]:
        if seen["n"] >= warmup:
            prof.stop()
        return {"gpu_busy": None, "launches_per_step": None}
    events = prof.events()
    wall = seen["t1"] - seen["t0"]
    return {"gpu_busy": kernel_busy_seconds(events) / wall if wall > 0 else None,
            "launches_per_step": launch_count(events) / steps}


__all__ = ["LAUNCHES", "decode_block", "kernel_busy_seconds", "launch_count", "profile_generate"]
