"""argparse types shared by every command-line parser of the package (``dllm.cli``, the benchmarks'
and trainers' own parsers): integer ranges, output paths checked before a run, JSON inputs. A bad value
is an argparse error (``argument --n: must be an integer >= 1, got 0``, exit status 2), found before a
command loads anything. Plain Python: no torch, no other ``dllm`` module.
"""

from __future__ import annotations

import argparse
import math
from pathlib import Path
from typing import Any, Callable


def at_least(low: int) -> Callable[[str], int]:
    """An argparse type: an integer >= ``low``."""

    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"must be an integer >= {low}, got {text!r}") from None
        if value < low:
            raise argparse.ArgumentTypeError(f"must be an integer >= {low}, got {value}")
        return value

    return parse


POSITIVE = at_least(1)


def above_zero(what: str) -> Callable[[str], float]:
    """An argparse type: a finite number > 0, refused as ``must be <what> > 0, got '<text>'``."""

    def parse(text: str) -> float:
        try:
            value = float(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"must be {what} > 0, got {text!r}") from None
        if not (value > 0 and math.isfinite(value)):
            raise argparse.ArgumentTypeError(f"must be {what} > 0, got {text!r}")
        return value

    return parse


seconds = above_zero("a number of seconds")  # a finite number of seconds > 0


def output_file(text: str) -> str:
    """An argparse type: a file the command writes after its run, refused before the run when it cannot be
    (a directory, a path under an existing file, or under a directory where no file can be made: probed
    with a temporary file, removed at once); missing parent directories are made by the command."""
    path = Path(text)
    if path.is_dir():
        raise argparse.ArgumentTypeError(f"{text!r} is a directory; give a file path ({path / 'results.json'})")
    _check_writable(text, path)
    return text


def output_dir(text: str) -> str:
    """An argparse type: a directory the command writes its results into after its run, refused before the
    run when it cannot be (an existing file, a path under one, or where no file can be made)."""
    path = Path(text)
    if path.exists() and not path.is_dir():
        raise argparse.ArgumentTypeError(f"{text!r} is a file; give a directory for the results")
    _check_writable(text, path / "results")
    return text


def output_png(text: str) -> str:
    """``output_file`` for a PNG plot (the suffix says the format)."""
    if Path(text).suffix.lower() != ".png":
        raise argparse.ArgumentTypeError(f"{text!r}: the plot is written as PNG; give a path ending in .png")
    return output_file(text)


def _check_writable(text: str, path: Path) -> None:
    """``path``'s nearest existing parent is a directory a file can be made in."""
    import tempfile

    parent = next((q for q in path.parents if q.exists()), Path("."))
    if not parent.is_dir():
        raise argparse.ArgumentTypeError(f"{text!r}: {str(parent)!r} is a file, not a directory")
    try:
        with tempfile.TemporaryFile(dir=parent):
            pass
    except OSError as err:
        raise argparse.ArgumentTypeError(f"{text!r}: no file can be written under {str(parent)!r} "
                                         f"({err.strerror or err})") from None


def read_json_object(path: str, flag: str, required: tuple[str, ...], made_by: str) -> dict[str, Any]:
    """The JSON object in ``path`` given with ``flag``, holding every key of ``required``; ValueError
    naming the flag, the file and what it lacks (``made_by``: the command whose output it should be)."""
    import json

    try:
        payload = json.loads(Path(path).read_text())
    except OSError as err:
        raise ValueError(f"{flag} {path}: cannot read it ({err.strerror or err})") from None
    except ValueError as err:
        raise ValueError(f"{flag} {path}: not JSON ({err}); give the JSON that {made_by} wrote") from None
    missing = [k for k in required if not isinstance(payload, dict) or k not in payload]
    if missing:
        raise ValueError(f"{flag} {path}: expected the JSON object {made_by} writes, with "
                         f"{', '.join(map(repr, required))}; it lacks {', '.join(map(repr, missing))}")
    return payload



class Distinct(argparse.Action):
    """A list flag (``nargs``) whose values must differ: a repeated task or k would be measured twice."""

    def __call__(self, parser: argparse.ArgumentParser, namespace: argparse.Namespace, values: Any,
                 option_string: Any = None) -> None:
        values = list(values or [])
        again = [v for i, v in enumerate(values) if v in values[:i]]
        if again:
            parser.error(f"argument {option_string}: {again[0]!r} is given twice")
        setattr(namespace, self.dest, values)


__all__ = ["Distinct", "POSITIVE", "at_least", "output_dir", "output_file", "output_png", "read_json_object", "seconds"]
