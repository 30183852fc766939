"""Small learned heads saved beside a checkpoint (a drafter's block or path head, ``learn2pd``'s
filter): a JSON config and a safetensors file, read and built with errors that name the file."""

from __future__ import annotations

import json
from typing import Any


def read_head_files(directory: Any, config_name: str, weights_name: str, what: str) -> tuple[dict, dict]:
    """(config dict, tensors) of a small head saved beside a drafter checkpoint (a block or path
    head): a missing, unreadable, non-JSON-object or truncated file is a ValueError naming it."""
    from pathlib import Path

    from safetensors.torch import load_file

    directory = Path(directory)
    for name in (config_name, weights_name):
        if not (directory / name).is_file():
            raise FileNotFoundError(f"no {what} in {str(directory)!r}: {name} is missing")
    config_path, weights_path = directory / config_name, directory / weights_name
    try:
        cfg = json.loads(config_path.read_text())
    except (ValueError, UnicodeDecodeError) as e:
        raise ValueError(f"the {what} config {str(config_path)!r} is not valid JSON ({e}); re-save the head "
                         f"or remove {config_name} and {weights_name}") from None
    if not isinstance(cfg, dict):
        raise ValueError(f"the {what} config {str(config_path)!r} must be a JSON object, got {type(cfg).__name__}")
    try:
        tensors = load_file(str(weights_path))
    except Exception as e:  # safetensors raises its own error types for truncated / random bytes
        raise ValueError(f"cannot read the {what} weights {str(weights_path)!r} ({type(e).__name__}: {e}); "
                         f"the file is truncated or not safetensors") from None
    return cfg, tensors


def build_head(make: Any, cfg: dict, tensors: dict, directory: Any, config_name: str, weights_name: str,
               what: str) -> Any:
    """``make(cfg)`` with ``tensors`` loaded into it; a missing config field or a tensor that does not
    fit is a ValueError naming the file."""
    from pathlib import Path

    directory = Path(directory)
    try:
        head = make(cfg)
    except (KeyError, TypeError, ValueError) as e:
        raise ValueError(f"the {what} config {str(directory / config_name)!r} is incomplete or wrong "
                         f"({type(e).__name__}: {e})") from None
    try:
        head.load_state_dict(tensors)
    except RuntimeError as e:
        raise ValueError(f"the {what} weights {str(directory / weights_name)!r} do not fit its config "
                         f"{config_name}: {str(e).splitlines()[0]} ...") from None
    return head.eval()


__all__ = ["build_head", "read_head_files"]
