"""The resume file of ``dllm stress`` (``OUT/stress.json``): its header (``StressConfig.header``), one
line per finished cell, rewritten atomically after every cell, and the checks a resume makes: a file of
another sweep is refused with its differences named, a damaged cell is named, and headers from before a
field was recorded read as the value the CLI used then. Also the JSON layout helpers of the summary file.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Optional

from dllm.eval.stress.grid import DEFAULT_CACHES
from dllm.eval.stress.metrics import Cell

FORMAT = "dllm-stress/1"  # the resume file's format tag
DEFAULT_MAX_BATCH = 64  # rows per generate call (``dllm stress`` always uses it)
DEFAULT_DTYPE = "float32"  # ``dllm stress --dtype``'s default: the dtype of files from before it was recorded
WHOLE = ("caches",)  # header lists whose difference shows both sides in full (short lists)


def _differences(found: dict, want: dict) -> list[str]:
    out = []
    for key in want:
        a, b = found.get(key), want[key]
        if a == b:
            continue
        if isinstance(a, list) and isinstance(b, list) and key not in WHOLE:
            extra, missing = [x for x in a if x not in b], [x for x in b if x not in a]
            detail = "; ".join(filter(None, [f"only in the file: {extra}" if extra else "",
                                             f"only in this run: {missing}" if missing else ""]))
            out.append(f"{key} differ ({detail or 'order'})")
        else:
            out.append(f"{key}: file {a!r}, this run {b!r}")
    return out


def _read_cells(where: str, raw: Any, header: dict[str, Any],
                sizes: Optional[dict[str, list[int]]]) -> dict[str, Cell]:
    """The cells of a resume file whose header matched ``header``: every key a cell of that sweep
    (``cell_key``'s ``"<setting label> | <task>"``), every cell whole (``Cell.damage``)."""
    if not isinstance(raw, dict):
        raise ValueError(f"{where!r} is not a stress result file: its cells are a {type(raw).__name__}, not an object")
    valid = {f"{label} | {task}" for label in header["settings"] for task in header["tasks"]}
    cells = {}
    for key, value in raw.items():
        if key not in valid:
            raise ValueError(f"{where!r} holds cell {key!r}, which is no cell of this sweep (its settings x tasks); "
                             f"the file is damaged: delete it or choose another --out")
        try:
            cell = Cell.from_json(value)
            if f"{cell.setting} | {cell.task}" != key:
                wrong = f"it holds setting {cell.setting!r} and task {cell.task!r}"
            else:
                wrong = cell.damage(None if sizes is None else sizes[cell.task])
        except (TypeError, AttributeError) as err:  # not an object, fields missing or unknown
            wrong = str(err)
        if wrong:
            raise ValueError(f"{where!r}: cell {key!r} is damaged ({wrong}); delete the file or choose another --out")
        cells[key] = cell
    return cells


@dataclass
class StressStore:
    """The cells of one sweep, saved atomically to ``path`` (JSON) after every cell."""

    path: Path
    header: dict[str, Any]
    cells: dict[str, Cell] = field(default_factory=dict)
    summary: Optional[dict] = None
    _lines: dict[str, str] = field(default_factory=dict, repr=False)  # cell key -> its JSON line

    @classmethod
    def open(cls, path: Path, header: dict[str, Any], *, resume: bool,
             sizes: Optional[dict[str, list[int]]] = None) -> "StressStore":
        """A new store, or (``resume``) the finished cells of a matching file at ``path``; ``sizes``
        (``StressConfig.sample_sizes``): each cell read must hold these examples. ValueError for a file
        a sweep did not write, another sweep's, or one with a damaged cell."""
        if not path.exists():
            return cls(path, header)
        if not resume:
            raise ValueError(f"{str(path)!r} exists; pass --resume to continue that sweep (same model, tasks, "
                             f"examples, grid, caches and device) or choose another --out")
        try:
            data = json.loads(path.read_text())
        except json.JSONDecodeError as err:
            raise ValueError(f"{str(path)!r} is not a stress result file (bad JSON: {err})") from None
        if not isinstance(data, dict) or not isinstance(data.get("header"), dict) or "cells" not in data:
            raise ValueError(f"{str(path)!r} is not a stress result file (no header and cells objects); "
                             f"choose another --out or delete it")
        found = data["header"]
        if "max_batch" not in found and "max_batch" in header:
            found = {**found, "max_batch": DEFAULT_MAX_BATCH}  # files from before it was recorded: the only CLI value
        if "dtype" not in found and header.get("dtype") is not None:
            found = {**found, "dtype": DEFAULT_DTYPE}  # files from before it was recorded: the CLI's default
        if "caches" not in found and "caches" in header:
            found = {**found, "caches": list(DEFAULT_CACHES)}  # files from before --caches: no KV cache
        if "device" not in found and "device" in header:
            found = {**found, "device": "cpu"}  # files from before it was recorded: the CLI's default
        diffs = _differences(found, header)
        if diffs:
            raise ValueError(f"cannot resume from {str(path)!r}: it was made by a different sweep: "
                             f"{'; '.join(diffs)}. Rerun with the file's settings, or choose another --out")
        return cls(path, header, _read_cells(str(path), data["cells"], header, sizes))

    def add(self, key: str, cell: Cell) -> None:
        self.cells[key] = cell
        self.save()

    def _line(self, key: str) -> str:
        """One cell as one JSON line (kept: the file is rewritten after every cell)."""
        line = self._lines.get(key)
        if line is None:
            line = self._lines[key] = f"{json.dumps(key)}: {json.dumps(self.cells[key].to_json())}"
        return line

    def save(self) -> None:
        """Write to a temporary file beside ``path``, then rename it over ``path`` (atomic).
        Layout: the header, one line per cell, the summary (indented)."""
        cells = ",\n".join(map(self._line, self.cells))
        parts = ['{"header": ' + json.dumps(self.header), '"cells": {\n' + cells + "\n}"]
        if self.summary is not None:
            parts.append('"summary": ' + json.dumps(self.summary, indent=1))
        self.path.parent.mkdir(parents=True, exist_ok=True)
        tmp = self.path.with_name(self.path.name + ".tmp")
        with open(tmp, "w") as f:
            f.write(",\n".join(parts) + "}\n")
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, self.path)



def rounded(obj: Any, digits: int = 4) -> Any:
    """``obj`` with every float rounded to ``digits`` decimals (containers copied)."""
    if isinstance(obj, float):
        return round(obj, digits)
    if isinstance(obj, dict):
        return {k: rounded(v, digits) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [rounded(v, digits) for v in obj]
    return obj


def dump_two_levels(obj: dict) -> str:
    """JSON with one line per entry of each top-level member (diff-friendly, a fraction of indent=1)."""
    def member(value: Any) -> str:
        if isinstance(value, dict) and value:
            return "{\n" + ",\n".join(f"  {json.dumps(k)}: {json.dumps(v)}" for k, v in value.items()) + "\n }"
        if isinstance(value, list) and value:
            return "[\n" + ",\n".join(f"  {json.dumps(v)}" for v in value) + "\n ]"
        return json.dumps(value)

    return "{\n" + ",\n".join(f" {json.dumps(k)}: {member(v)}" for k, v in obj.items()) + "\n}\n"


__all__ = ["DEFAULT_DTYPE", "DEFAULT_MAX_BATCH", "FORMAT", "StressStore", "dump_two_levels", "rounded"]
