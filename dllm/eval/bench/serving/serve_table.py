"""The table, the verdict and the plot of ``dllm bench serve`` (rows from ``dllm.eval.bench.serving.serve``).

A row is one (mode, rate, repeat) run; ``median_rows`` folds the repeats of a (mode, rate) into one
row of medians. ``verdicts`` compare continuous batching with serial and static serving at each rate:
the ratio of requests/s and of p99 end-to-end latency.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Optional, Sequence

MODES = ("continuous", "static", "serial")
COLUMNS = ("mode", "rate", "completed", "failed", "duration_s", "requests_per_s", "output_tokens_per_s",
           "ttft_p50_s", "ttft_p99_s", "e2e_p50_s", "e2e_p99_s", "mean_batch")


def percentile(values: Sequence[float], q: float) -> Optional[float]:
    """The q-th percentile (0..100) with linear interpolation between order statistics (numpy's
    default); None for no values."""
    if not values:
        return None
    xs = sorted(values)
    k = (len(xs) - 1) * q / 100
    lo, hi = math.floor(k), math.ceil(k)
    return xs[lo] + (xs[hi] - xs[lo]) * (k - lo)


def format_table(rows: Sequence[dict]) -> str:
    """A markdown table of the rows (``COLUMNS``)."""
    cell = lambda v: "-" if v is None else str(v)  # noqa: E731
    lines = ["| " + " | ".join(COLUMNS) + " |", "|" + "---|" * len(COLUMNS)]
    lines += ["| " + " | ".join(cell(row.get(c)) for c in COLUMNS) + " |" for row in rows]
    return "\n".join(lines)


def verdicts(rows: Sequence[dict]) -> list[dict]:
    """At each rate with a continuous row: requests/s of continuous over serial and over static, and
    whether continuous's p99 end-to-end latency is no worse than static's."""
    out = []
    for row in rows:
        if row["mode"] != "continuous":
            continue
        same = {r["mode"]: r for r in rows if r["rate"] == row["rate"]}
        v: dict = {"rate": row["rate"]}
        for other in ("serial", "static"):
            o = same.get(other)
            if o and o["requests_per_s"]:
                v[f"x_{other}"] = round(row["requests_per_s"] / o["requests_per_s"], 2)
                if o["e2e_p99_s"] and row["e2e_p99_s"]:
                    v[f"p99_vs_{other}"] = round(row["e2e_p99_s"] / o["e2e_p99_s"], 2)
        out.append(v)
    return out


def verdict_line(v: dict) -> str:
    parts = [f"continuous @ {v['rate']}/s:"]
    for other in ("serial", "static"):
        if f"x_{other}" in v:
            p99 = v.get(f"p99_vs_{other}")
            parts.append(f"x{v[f'x_{other}']:.2f} the requests/s of {other}"
                         + ("" if p99 is None else f" at {p99:.2f}x its p99 latency"))
    return " ".join(parts[:1]) + " " + "; ".join(parts[1:])


def plot(rows: Sequence[dict], path: Path) -> None:
    """serve.png: requests/s, p99 end-to-end latency and p50 TTFT per mode (bars) at each rate."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rates = list(dict.fromkeys(str(r["rate"]) for r in rows))
    modes = [m for m in MODES if any(r["mode"] == m for r in rows)]
    panels = (("requests_per_s", "requests / s"), ("e2e_p99_s", "p99 end-to-end latency (s)"),
              ("ttft_p50_s", "p50 time to first token (s)"))
    fig, axes = plt.subplots(1, len(panels), figsize=(4.2 * len(panels), 3.6))
    width = 0.8 / max(1, len(modes))
    for ax, (key, title) in zip(axes, panels):
        for j, mode in enumerate(modes):
            by_rate = {str(r["rate"]): r.get(key) for r in rows if r["mode"] == mode}
            xs = [i + j * width for i in range(len(rates))]
            ax.bar(xs, [by_rate.get(rate) or 0 for rate in rates], width, label=mode)
        ax.set_xticks([i + width * (len(modes) - 1) / 2 for i in range(len(rates))], [f"{x}/s" for x in rates])
        ax.set_xlabel("arrival rate (requests / s)")
        ax.set_title(title, fontsize=9)
        ax.grid(alpha=0.3, axis="y")
    axes[0].legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def median_rows(rows: Sequence[dict]) -> list[dict]:
    """One row per (mode, rate): the median of each measure over its repeats (completed and failed
    summed), in the order the pairs were first measured."""
    groups: dict[tuple, list[dict]] = {}
    for row in rows:
        groups.setdefault((row["mode"], row["rate"]), []).append(row)
    table = []
    for (mode, rate), group in groups.items():
        merged: dict = {"mode": mode, "rate": rate, "repeats": len(group)}
        for col in COLUMNS[2:]:
            values = [r[col] for r in group if r.get(col) is not None]
            if col in ("completed", "failed"):
                merged[col] = sum(values)
            else:
                merged[col] = None if not values else round(percentile(values, 50), 4)
        table.append(merged)
    return table


__all__ = ["COLUMNS", "MODES", "format_table", "median_rows", "percentile", "plot", "verdict_line",
           "verdicts"]
