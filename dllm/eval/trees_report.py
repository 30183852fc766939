"""The tables and the plot of ``dllm bench spec --trees``: ``COLUMNS`` (of ``format_table``),
``format_diffs`` (greedy mismatches), ``format_selection`` (the chosen budgets), ``plot_trees`` (PNG)."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Sequence

from dllm.eval.tree_runs import TreeRow

if TYPE_CHECKING:
    from dllm.eval.bench_trees import TreeBench

COLUMNS = ("builder", "budget", "temperature", "tau", "tau_round", "width", "target_forwards", "tokens_per_s",
           "speedup", "accuracy", "greedy_match", "chosen", "status")


def format_diffs(rows: Sequence[TreeRow]) -> str:
    """One line per greedy mismatch (empty when every T = 0 row matched ``generate``)."""
    lines = []
    for r in rows:
        for d in r.greedy_diffs:
            m = d["logit_margin"]
            kind = "" if m is None else " (a float near-tie)" if abs(m) < 1e-3 else " (NOT a near-tie)"
            lines.append(f"  greedy mismatch {r.method}: prompt {d['prompt']}, generated position {d['position']}: "
                         f"token {d['ours']} vs generate's {d['generate']}, target logit margin "
                         f"{'?' if m is None else f'{m:.3g}'}{kind}")
    return "\n".join(lines)


def format_selection(bench: TreeBench, temperatures: Sequence[float]) -> str:
    """Per builder: the chosen budget and what the reported split says about every budget."""
    lines = ["| builder | chosen budget (held-out) | held-out tokens/s | " +
             " | ".join(f"reported T={t:g}: chosen tokens/s, best budget" for t in temperatures) + " |",
             "|" + "|".join("---" for _ in range(3 + len(temperatures))) + "|"]
    for b, row in bench.chosen.items():
        cells = []
        for t in temperatures:
            mine = [r for r in bench.reported if r.builder == b and r.temperature == t and r.status == "ok"]
            best = max(mine, key=lambda r: (r.tokens_per_s or 0, -(r.budget or 0)), default=None)
            pick = next((r for r in mine if r.chosen), None)
            cells.append(f"{pick.tokens_per_s if pick else ''}, {best.budget if best else ''}")
        lines.append(f"| {b} | {row.budget} | {row.tokens_per_s} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def plot_trees(rows: Sequence[TreeRow], path: Path, title: str, temperature: float = 0.0) -> None:
    """Two panels over budget (log2 x) per builder, reported rows at ``temperature``: tau (the no-tree
    chain's as a line) and tokens/s (no-tree and generate as lines); chosen budgets starred."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = [r for r in rows if r.split == "reported" and r.temperature == temperature and r.status == "ok"]
    builders = list(dict.fromkeys(r.builder for r in rows if r.budget is not None))
    lines = {r.builder: r for r in rows if r.budget is None}
    fig, axes = plt.subplots(1, 2, figsize=(12, 4.8))
    for ax, key, label in ((axes[0], "tau", "tau (tokens / target forward)"), (axes[1], "tokens_per_s", "tokens/s")):
        for i, b in enumerate(builders):
            mine = sorted((r for r in rows if r.builder == b), key=lambda r: r.budget)
            color = f"C{i}"
            ax.plot([r.budget for r in mine], [getattr(r, key) for r in mine], "o-", color=color, label=b)
            ax.scatter([r.budget for r in mine if r.chosen], [getattr(r, key) for r in mine if r.chosen], marker="*",
                       s=220, color=color, edgecolor="black", zorder=3)
        for name, style in (("no-tree", "--"), ("generate", ":")):
            if name in lines and (key == "tokens_per_s" or name == "no-tree"):
                ax.axhline(getattr(lines[name], key), linestyle=style, color="gray",
                           label=f"{'chain, no tree' if name == 'no-tree' else 'target.generate'}")
        ax.set_xscale("log", base=2)
        ticks = sorted({r.budget for r in rows if r.budget is not None})
        ax.set_xticks(ticks, [str(t) for t in ticks])
        ax.minorticks_off()
        ax.set_xlabel("tree budget (draft nodes)")
        ax.set_ylabel(label)
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
    axes[0].set_title("tau vs budget (* = chosen on held-out)", fontsize=10)
    axes[1].set_title("tokens/s vs budget", fontsize=10)
    fig.suptitle(title)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


__all__ = ["COLUMNS", "format_diffs", "format_selection", "plot_trees"]
