"""Argument types of the training commands' parsers (``dllm train``, ``dllm train path-head``, ``dllm
train block-head``).

A bad value is an argparse error (``argument --steps: must be an integer >= 1, got 0``, exit status 2),
raised while the flags are parsed: before a model is loaded or anything is written. The integer type is
the package's shared one (``dllm.flags.at_least``).
"""

from __future__ import annotations

import argparse
import math

from dllm.flags import at_least  # noqa: F401 (re-exported: the shared integer type)


def seconds(text: str) -> float:
    """An argparse type: a finite number of seconds > 0."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"must be a number of seconds > 0, got {text!r}") from None
    if not (value > 0 and math.isfinite(value)):
        raise argparse.ArgumentTypeError(f"must be a number of seconds > 0, got {text!r}")
    return value


def device(text: str) -> str:
    """An argparse type: a device this machine has (``dllm.models.loading.resolve_device``), returned as
    given; the error names the devices that exist."""
    from dllm.models.loading import resolve_device

    try:
        resolve_device(text)
    except ValueError as err:
        raise argparse.ArgumentTypeError(str(err)) from None
    return text


__all__ = ["at_least", "device", "seconds"]
