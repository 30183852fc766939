"""PNGs of ``dllm stress`` (from ``stress.report.summarize``'s data; matplotlib, Agg backend).

- ``plot_curves``: one panel per task, accuracy (%) vs tokens per step (log2 axis), one line per
  curve (sampler family at a block length), points in TPS order: ParallelBench's per-task plots
  (arXiv 2510.04767, Fig. 5).
- ``plot_heatmap``: max TPS at >= 80 % accuracy, families x tasks (blank: never reached).
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

from dllm.eval.stress.report import HEATMAP_LEVEL


def _pyplot():
    try:
        import matplotlib
    except ImportError as err:
        raise ImportError("the stress plots need matplotlib: pip install dllm[eval]") from err
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def plot_curves(summary: dict[str, Any], path: Path, title: str = "") -> Path:
    """Accuracy vs tokens per step, one panel per task, one line per curve."""
    plt = _pyplot()
    tasks = summary["tasks"]
    cols = min(6, len(tasks))
    nrows = math.ceil(len(tasks) / cols)
    legend_rows = math.ceil(len({s["curve"] for s in summary["settings"]}) / 5)
    top = 0.45 + 0.25 * legend_rows  # inches above the panels: the title and the legend
    height = 2.3 * nrows + 0.4 + top
    fig, axes = plt.subplots(nrows, cols, figsize=(2.8 * cols, height), squeeze=False, sharey=True)
    by_curve: dict[str, list[dict]] = {}
    for s in summary["settings"]:
        by_curve.setdefault(s["curve"], []).append(s)
    colors = plt.get_cmap("tab10")
    c0 = set(summary["c0"])
    for j, task in enumerate(tasks):
        ax = axes[j // cols][j % cols]
        for i, (curve, members) in enumerate(by_curve.items()):
            pts = sorted((s["per_task"][task]["tps"], 100 * s["per_task"][task]["accuracy"]) for s in members)
            ax.plot([p[0] for p in pts], [p[1] for p in pts], "o-", ms=3, lw=1.2, color=colors(i % 10),
                    label=curve if j == 0 else None)
        ax.set_xscale("log", base=2)
        ax.axhline(100 * HEATMAP_LEVEL, color="grey", lw=0.6, ls=":")
        ax.set_title(task + (" (C=0)" if task in c0 else ""), fontsize=8)
        ax.tick_params(labelsize=7)
        ax.set_ylim(-3, 103)
        ax.grid(alpha=0.3)
    for j in range(len(tasks), nrows * cols):
        axes[j // cols][j % cols].axis("off")
    for c in range(cols):  # the lowest panel of each column
        row = nrows - 1 if c <= (len(tasks) - 1) % cols else nrows - 2
        axes[row][c].set_xlabel("tokens per step", fontsize=7)
    for row in axes:
        row[0].set_ylabel("accuracy %", fontsize=7)
    fig.suptitle(f"{title}: accuracy vs tokens per step" if title else "accuracy vs tokens per step",
                 fontsize=10, y=1 - 0.12 / height, va="top")
    fig.legend(loc="upper center", bbox_to_anchor=(0.5, 1 - 0.4 / height), ncol=min(len(by_curve), 5),
               fontsize=8, frameon=False)
    fig.tight_layout(rect=(0, 0, 1, 1 - top / height))
    fig.savefig(path, dpi=90)
    plt.close(fig)
    return path


def plot_heatmap(summary: dict[str, Any], path: Path, title: str = "") -> Path:
    """Max TPS at >= 80 % accuracy per family (rows) and task (columns)."""
    plt = _pyplot()
    import numpy as np

    families = list(summary["max_tps_by_task"])
    tasks = summary["tasks"]
    values = np.array([[summary["max_tps_by_task"][f][t] if summary["max_tps_by_task"][f][t] is not None
                        else np.nan for t in tasks] for f in families], dtype=float)  # [F, T]
    fig, ax = plt.subplots(figsize=(max(6.0, 0.42 * len(tasks) + 2.5), 0.45 * len(families) + 2.2))
    cmap = plt.get_cmap("viridis").with_extremes(bad="#eeeeee")
    top = np.nanmax(values) if np.isfinite(values).any() else 1.0
    image = ax.imshow(np.ma.masked_invalid(values), cmap=cmap, vmin=0, vmax=top, aspect="auto")
    fig.colorbar(image, ax=ax, label=f"max TPS at >= {round(100 * HEATMAP_LEVEL)} %")
    ax.set_xticks(range(len(tasks)), tasks, rotation=70, ha="right", fontsize=7)
    ax.set_yticks(range(len(families)), families, fontsize=8)
    for r in range(len(families)):
        for c in range(len(tasks)):
            v = values[r, c]
            text = "-" if np.isnan(v) else f"{v:.1f}"
            light = np.isnan(v) or v > 0.6 * top
            ax.text(c, r, text, ha="center", va="center", fontsize=6, color="black" if light else "white")
    ax.set_title(f"{title}: max tokens per step at >= {round(100 * HEATMAP_LEVEL)} % accuracy"
                 if title else f"max tokens per step at >= {round(100 * HEATMAP_LEVEL)} % accuracy", fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def plot_all(summary: dict[str, Any], out: Path, title: str = "") -> list[Path]:
    """``out/stress-curves.png`` and ``out/stress-heatmap.png``."""
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    return [plot_curves(summary, out / "stress-curves.png", title),
            plot_heatmap(summary, out / "stress-heatmap.png", title)]


__all__ = ["plot_all", "plot_curves", "plot_heatmap"]
