"""Where the harness model runs (``dllm.eval.harness.model.DllmLM``): how many processes this launch
started (``accelerate launch``, ``torchrun``), the ``accelerate.Accelerator`` that shards lm-eval's
requests between them, and the device lm-eval's ``--device`` names when this machine has it."""

from __future__ import annotations

import logging

import torch

from dllm.eval.harness.config import default_device

log = logging.getLogger(__name__)


def launched_processes() -> int:
    """Processes of this launch (``WORLD_SIZE``, set by ``accelerate launch`` and ``torchrun``)."""
    import os

    return int(os.environ.get("WORLD_SIZE", "1"))


def accelerator():
    """An ``accelerate.Accelerator`` when this process is one of several (``accelerate launch``), else None."""
    if launched_processes() <= 1:
        return None
    from datetime import timedelta

    from accelerate import Accelerator, InitProcessGroupKwargs

    # cpu=True when there is no GPU: accelerate treats a multi-process CPU launch as distributed (gloo)
    # only then. A long timeout, as lm-eval's HFLM: ranks wait for each other at the end of a shard.
    acc = Accelerator(cpu=not torch.cuda.is_available(),
                      kwargs_handlers=[InitProcessGroupKwargs(timeout=timedelta(weeks=52))])
    return acc if acc.num_processes > 1 else None


def available_or_default(device: str) -> str:
    """lm-eval's ``--device`` (default ``cuda:0``) when this machine has it, else the best available."""
    from dllm.models.loading import resolve_device

    try:
        resolve_device(device)
        return device
    except ValueError as err:
        fallback = default_device()
        log.warning("%s; using %s", err, fallback)
        return fallback


__all__ = ["accelerator", "available_or_default", "launched_processes"]
