"""The tables and the plot of ``dllm bench trees``: ``COLUMNS`` (of ``format_table``),
``format_diffs`` (greedy mismatches), ``format_selection`` (the chosen budgets), ``paired`` /
``format_paired`` (two builders on the same prompts: the tau difference with a bootstrap interval),
``plot_trees`` (PNG)."""

from __future__ import annotations

import random
from dataclasses import dataclass
from pathlib import Path
from typing import Optional, Sequence

from dllm.eval.speculative.tree_runs import TreeBench, TreeRow

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


# the orderings compared: (a, b) asks "is tau(a) >= tau(b) at the same budget?"
PAIRS: tuple[tuple[str, str], ...] = (("taps", "ddtree"), ("ddtree", "chain"), ("taps", "chain"))
RESAMPLES = 2000  # bootstrap draws of the prompts per pair
MIN_PROMPTS = 5  # fewer prompts: no interval (a resample of one prompt is that prompt)


@dataclass(frozen=True)
class Paired:
    """``a`` against ``b`` on the same ``n`` prompts: tau = generated tokens / target forwards over all
    of them; ``higher`` / ``equal`` / ``lower``: prompts where a's own tau is above / equal to / below
    b's (at T = 0 the tokens agree, so higher = fewer target forwards)."""

    a: str
    b: str
    n: int
    tau_a: float
    tau_b: float
    low: Optional[float]  # 95% bootstrap interval of tau_a - tau_b; None below MIN_PROMPTS prompts
    high: Optional[float]
    higher: int
    equal: int
    lower: int

    @property
    def delta(self) -> float:
        return self.tau_a - self.tau_b

    def to_json(self) -> dict:
        r = lambda v: None if v is None else round(v, 4)  # noqa: E731
        return {"a": self.a, "b": self.b, "n": self.n, "tau_a": r(self.tau_a), "tau_b": r(self.tau_b),
                "delta": r(self.delta), "low": r(self.low), "high": r(self.high), "higher": self.higher,
                "equal": self.equal, "lower": self.lower}


def _tau(tokens: Sequence[int], forwards: Sequence[int], idx: Sequence[int]) -> float:
    return sum(tokens[i] for i in idx) / sum(forwards[i] for i in idx)


def paired(a: TreeRow, b: TreeRow, resamples: int = RESAMPLES, seed: int = 0) -> Paired:
    """tau(a) - tau(b) over the same prompts, with a paired percentile bootstrap (``resamples`` draws of
    the prompts with replacement, the same draw for both rows, seeded; the 2.5 / 97.5% points) and the
    per-prompt comparison of tau. On a few dozen prompts one target forward more on one prompt moves
    tau by ~1%: the interval says what the split can resolve."""
    n = len(a.prompt_forwards)
    counts = [len(a.prompt_forwards), len(a.prompt_tokens), len(b.prompt_forwards), len(b.prompt_tokens)]
    if n == 0 or len(set(counts)) != 1:
        raise ValueError(f"paired needs per-prompt forwards and tokens of the same prompts, got {counts[0]} / "
                         f"{counts[1]} ({a.method}) and {counts[2]} / {counts[3]} ({b.method}) forwards / tokens")
    if resamples < 1:
        raise ValueError(f"resamples must be >= 1, got {resamples}")
    all_prompts = range(n)
    low = high = None
    if n >= MIN_PROMPTS:
        rng = random.Random(seed)
        draws = ([rng.randrange(n) for _ in all_prompts] for _ in range(resamples))
        deltas = sorted(_tau(a.prompt_tokens, a.prompt_forwards, idx) - _tau(b.prompt_tokens, b.prompt_forwards, idx)
                        for idx in draws)
        low, high = deltas[round(0.025 * (resamples - 1))], deltas[round(0.975 * (resamples - 1))]
    own = [ta * fb - tb * fa for ta, fa, tb, fb in zip(a.prompt_tokens, a.prompt_forwards, b.prompt_tokens,
                                                         b.prompt_forwards)]  # sign of tau_a - tau_b per prompt
    return Paired(a.method, b.method, n, _tau(a.prompt_tokens, a.prompt_forwards, all_prompts),
                  _tau(b.prompt_tokens, b.prompt_forwards, all_prompts), low, high, sum(d > 0 for d in own),
                  sum(d == 0 for d in own), sum(d < 0 for d in own))


def paired_rows(rows: Sequence[TreeRow],
                pairs: Sequence[tuple[str, str]] = PAIRS) -> list[tuple[float, int, Paired]]:
    """(temperature, budget, ``paired``) for every pair of builders present at the same budget and
    temperature among the ``ok`` rows of ONE split, in order of pair, temperature, budget."""
    ok: dict[tuple, TreeRow] = {}
    for r in rows:
        if r.status == "ok" and r.budget is not None:
            key = (r.builder, r.budget, r.temperature)
            if key in ok:
                raise ValueError(f"paired_rows takes the rows of one split, got {r.method} at T = {r.temperature:g} "
                                 f"twice (splits {ok[key].split!r} and {r.split!r})")
            ok[key] = r
    keys = sorted({(t, n) for (_, n, t) in ok})
    out = []
    for a, b in pairs:
        for t, n in keys:
            ra, rb = ok.get((a, n, t)), ok.get((b, n, t))
            if ra is not None and rb is not None:
                out.append((t, n, paired(ra, rb)))
    return out


def format_paired(found: Sequence[tuple[float, int, Paired]]) -> Optional[str]:
    """A markdown table of ``paired_rows``' result (None when it is empty)."""
    if not found:
        return None
    lines = ["| a vs b | T | prompts | tau a | tau b | tau a - tau b | 95% interval | prompts: tau a higher / "
             "equal / lower |", "|---|---|---|---|---|---|---|---|"]
    for t, _, p in found:
        interval = "n/a" if p.low is None else f"[{p.low:+.3f}, {p.high:+.3f}]"
        lines.append(f"| {p.a} vs {p.b} | {t:g} | {p.n} | {p.tau_a:.3f} | {p.tau_b:.3f} | {p.delta:+.3f} | "
                     f"{interval} | {p.higher} / {p.equal} / {p.lower} |")
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


__all__ = ["COLUMNS", "MIN_PROMPTS", "PAIRS", "Paired", "RESAMPLES", "format_diffs", "format_paired",
           "format_selection", "paired", "paired_rows", "plot_trees"]
