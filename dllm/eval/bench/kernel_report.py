"""The kernel benchmark's report: ``run_kernel_bench`` rows (``dllm.eval.bench.kernels``) as Markdown.

``format_table(rows)`` renders one line per (shape, backend); ``sdpa_ratios(rows)`` gives one line per
attention shape with the Triton kernel's and ``auto``'s time over sdpa's (below 1: faster than sdpa)
and what ``auto`` chose, which ``format_table(sdpa_ratios(rows), RATIO_COLUMNS)`` renders;
``format_report(rows)`` is both, as ``dllm bench kernels`` prints them.
"""

from __future__ import annotations

from typing import Any, Sequence

from dllm.eval.bench.kernel_tiles import Tile, best_triton

COLUMNS = ("kind", "shape", "backend", "ms", "speedup", "vs_sdpa", "max_abs_err", "interpreted", "note")
RATIO_COLUMNS = ("shape", "sdpa_ms", "triton/sdpa", "auto/sdpa", "auto_chose")
TILE_COLUMNS = RATIO_COLUMNS + ("best_triton", "best/sdpa")  # sdpa_ratios' lines with --tiles


def sdpa_ratios(rows: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    """One dict per attention shape of ``run_kernel_bench`` rows: ``sdpa_ms``, ``triton/sdpa`` and
    ``auto/sdpa`` (time over sdpa's time: below 1 is faster; None when either did not run; a
    Triton time from the interpreter is marked " (interpreted)"), ``auto_chose``."""
    by_shape: dict[str, dict[str, dict[str, Any]]] = {}
    for r in rows:
        if r["kind"] == "attention":
            by_shape.setdefault(r["shape"], {})[r["backend"]] = r
    out = []
    for shape, rs in by_shape.items():
        line: dict[str, Any] = {"shape": shape, "sdpa_ms": (rs.get("sdpa") or {}).get("ms")}
        for name in ("triton", "auto"):
            ratio = (rs.get(name) or {}).get("vs_sdpa")
            if ratio is not None and rs[name].get("interpreted"):
                ratio = f"{ratio} (interpreted)"
            line[f"{name}/sdpa"] = ratio
        note = (rs.get("auto") or {}).get("note", "")
        line["auto_chose"] = note.split(" ", 2)[1].split(";")[0] if note.startswith("chose ") else None
        if any(Tile.parse(name) for name in rs):  # --tiles: the fastest of the kernel's launch settings
            best = best_triton(list(rs.values()))
            line["best_triton"] = None if best is None else best["backend"]
            ratio = None if best is None else best.get("vs_sdpa")
            line["best/sdpa"] = f"{ratio} (interpreted)" if ratio is not None and best.get("interpreted") else ratio
        out.append(line)
    return out


def format_table(rows: Sequence[dict[str, Any]], columns: Sequence[str] = COLUMNS) -> str:
    """Markdown table of ``run_kernel_bench`` rows."""

    def cell(v: Any) -> str:
        if v is None:
            return ""
        if isinstance(v, float) and v and abs(v) < 1e-3:
            return f"{v:.2e}"
        return str(v)

    head = "| " + " | ".join(columns) + " |"
    rule = "|" + "|".join("---" for _ in columns) + "|"
    body = ["| " + " | ".join(cell(r.get(c)) for c in columns) + " |" for r in rows]
    return "\n".join([head, rule, *body])


def format_report(rows: Sequence[dict[str, Any]]) -> str:
    """The table of every (shape, backend), then the per-shape ratios to sdpa and ``auto``'s choice."""
    text = format_table(rows)
    ratios = sdpa_ratios(rows)
    if ratios:
        tiles = any("best_triton" in line for line in ratios)
        text += ("\n\nAttention time over sdpa's (below 1: faster than sdpa), and what auto chose"
                 + (" (best_triton: the kernel's fastest launch setting)" if tiles else "") + ":\n\n"
                 + format_table(ratios, TILE_COLUMNS if tiles else RATIO_COLUMNS))
    return text


__all__ = ["format_report", "format_table", "sdpa_ratios", "COLUMNS", "RATIO_COLUMNS", "TILE_COLUMNS"]
