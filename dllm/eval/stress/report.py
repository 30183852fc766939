"""The summary and text tables of ``dllm stress`` (definitions: ``dllm.eval.stress.metrics``).

Means over tasks weigh every task the same (ParallelBench averages per-task scores, arXiv
2510.04767). ``summarize`` returns plain JSON-ready data:

- ``settings``: per setting (its cache policy included), mean accuracy / TPS / content TPS / NFE /
  Kendall tau over tasks, and the same per task (every cell's numbers, with its wall seconds);
- ``leaderboard``: per family, the max mean TPS over its settings (all block lengths and caches) whose
  mean accuracy is >= 80 / 75 / 70 %, and which setting gives it;
- ``max_tps_by_task``: per family and task, the max TPS of a setting with >= 80 % on that task;
- ``curves``: per family, block length and cache, the centre of mass per task and its mean, and the
  per-sample oracle (accuracy, TPS, content TPS per task and their means; how often each setting
  was the oracle's choice).
"""

from __future__ import annotations

from collections import Counter
from typing import Any, Optional

from dllm.scoring.exact_match import c0_of
from dllm.eval.stress.grid import Setting, cell_key
from dllm.eval.stress.metrics import (
    LEVELS, Cell, best_at, centre_of_mass, max_tps_at, mean, oracle_summary,
)  # fmt: skip

HEATMAP_LEVEL = 0.8


def _pct(level: float) -> str:
    return str(round(100 * level))


def _setting_row(setting: Setting, cells: list[Cell]) -> dict[str, Any]:
    return {
        "label": setting.label, "family": setting.family, "curve": setting.curve, "point": setting.point,
        "block_length": setting.block_length, "cache": setting.cache,
        "accuracy": mean([c.accuracy for c in cells]), "tps": mean([c.tps for c in cells]),
        "tps_content": mean([c.tps_content for c in cells]), "nfe": mean([c.mean_nfe for c in cells]),
        "tau": mean([c.mean_tau for c in cells]), "seconds": sum(c.seconds for c in cells),
        "forwards": sum(c.forwards for c in cells),
        "per_task": {c.task: {"accuracy": c.accuracy, "tps": c.tps, "tps_content": c.tps_content,
                              "nfe": c.mean_nfe, "tau": c.mean_tau, "seconds": c.seconds} for c in cells},
    }


def _groups(settings: list[Setting], attr: str) -> dict[str, list[Setting]]:
    out: dict[str, list[Setting]] = {}
    for s in settings:
        out.setdefault(getattr(s, attr), []).append(s)
    return out


def summarize(config, cells: dict[str, Cell]) -> dict[str, Any]:
    """The summary of a finished sweep (``config``: a ``StressConfig``; ``cells`` keyed by ``cell_key``)."""
    tasks = list(config.tasks)
    grid = {s.label: [cells[cell_key(s, t)] for t in tasks] for s in config.settings}
    rows = {s.label: _setting_row(s, grid[s.label]) for s in config.settings}

    leaderboard, by_task = [], {}
    for family, members in _groups(config.settings, "family").items():
        points = [(rows[s.label]["tps"], rows[s.label]["accuracy"]) for s in members]
        entry: dict[str, Any] = {"family": family, "max_tps": {}, "setting": {}}
        for level in LEVELS:
            i = best_at(points, level)
            entry["max_tps"][_pct(level)] = None if i is None else points[i][0]
            entry["setting"][_pct(level)] = None if i is None else members[i].label
        leaderboard.append(entry)
        by_task[family] = {t: max_tps_at([(grid[s.label][j].tps, grid[s.label][j].accuracy) for s in members],
                                         HEATMAP_LEVEL) for j, t in enumerate(tasks)}

    curves = []
    for curve, members in _groups(config.settings, "curve").items():
        com, oracle, chosen = {}, {}, Counter()
        for j, t in enumerate(tasks):
            task_cells = [grid[s.label][j] for s in members]
            com[t] = centre_of_mass([(c.tps, c.accuracy) for c in task_cells])
            o = oracle_summary(task_cells)
            chosen.update(members[i].point or members[i].label for i in o.pop("choice"))
            oracle[t] = o
        curves.append({
            "curve": curve, "family": members[0].family, "block_length": members[0].block_length,
            "cache": members[0].cache, "settings": [s.label for s in members], "com": mean(list(com.values())),
            "com_by_task": com,
            "oracle": {k: mean([oracle[t][k] for t in tasks]) for k in ("accuracy", "tps", "tps_content")},
            "oracle_by_task": oracle, "oracle_choices": dict(chosen),
            "tau": mean([rows[s.label]["tau"] for s in members]),
        })
    c0 = set(c0_of(tasks))  # once, not per task
    return {"levels": [_pct(v) for v in LEVELS], "tasks": tasks, "c0": [t for t in tasks if t in c0],
            "settings": list(rows.values()), "leaderboard": leaderboard, "max_tps_by_task": by_task,
            "curves": curves}


# ---- text ---------------------------------------------------------------------------------------------
def _num(value: Optional[float], width: int, digits: int = 2, scale: float = 1.0) -> str:
    return f"{'-':>{width}}" if value is None else f"{scale * value:{width}.{digits}f}"


def _table(head: list[str], rows: list[list[str]], first: int) -> list[str]:
    widths = [max(first, *(len(r[0]) for r in rows), len(head[0]))] + [
        max(len(h), *(len(r[i]) for r in rows)) for i, h in enumerate(head) if i]

    def fmt(cells: list[str]) -> str:
        return "  ".join(c.ljust(widths[0]) if i == 0 else c.rjust(widths[i]) for i, c in enumerate(cells))

    line = fmt(head)
    return [line, "-" * len(line), *map(fmt, rows)]


def format_report(config, summary: dict[str, Any]) -> str:
    n_ex = sum(len(v) for v in config.examples.values())
    out = [f"dllm stress: model {config.model}, {len(config.tasks)} tasks, {n_ex} examples per setting "
           f"({config.per_size} per task size), {len(config.settings)} settings{_caches(config)}, greedy",
           "TPS: generated positions (EOS padding included) per forward; TPS(content): answer words before "
           "the first EOS per forward; forwards per sample as if decoded alone", ""]
    levels = summary["levels"]
    out.append(f"Leaderboard: max tokens per step (TPS, EOS padding included) at >= {'/'.join(levels)} % "
               f"mean accuracy over tasks (- : never)")
    rows = [[e["family"], *(_num(e["max_tps"][lv], 6) for lv in levels), e["setting"][levels[0]] or "-"]
            for e in summary["leaderboard"]]
    out += _table(["family", *(f"TPS@{lv}" for lv in levels), f"setting at {levels[0]} %"], rows, 16)

    out += ["", "Curves: parallelizability centre of mass (TPS), per-sample oracle, Kendall tau vs left to right"]
    rows = [[c["curve"], _num(c["com"], 5), _num(c["oracle"]["accuracy"], 6, 1, 100), _num(c["oracle"]["tps"], 6),
             _num(c["oracle"]["tps_content"], 6), _num(c["tau"], 5)] for c in summary["curves"]]
    out += _table(["curve", "CoM", "oracle acc %", "oracle TPS", "oracle TPS(content)", "tau"], rows, 16)

    out += ["", "Settings: means over tasks"]
    rows = [[s["label"], _num(s["accuracy"], 6, 1, 100), _num(s["tps"], 5), _num(s["tps_content"], 5),
             _num(s["nfe"], 6), _num(s["tau"], 5), f"{s['seconds']:.1f}"] for s in summary["settings"]]
    out += _table(["setting", "acc %", "TPS", "TPS(content)", "NFE/ex", "tau", "wall s"], rows, 16)

    c0 = set(summary["c0"])
    by_curve = {}
    for s in summary["settings"]:
        by_curve.setdefault(s["curve"], []).append(s)
    for curve in summary["curves"]:
        members = by_curve[curve["curve"]]
        heads = [s["point"] or s["label"] for s in members]
        out += ["", f"Accuracy % per task vs parallelism: {curve['curve']}"]
        rows = [[t, "yes" if t in c0 else "", *(_num(s["per_task"][t]["accuracy"], 5, 1, 100) for s in members),
                 _num(curve["com_by_task"][t], 5), _num(curve["oracle_by_task"][t]["tps"], 5)]
                for t in summary["tasks"]]
        rows.append(["TPS (mean)", "", *(_num(s["tps"], 5) for s in members), "", ""])
        out += _table(["task", "C=0", *heads, "CoM", "oracle TPS"], rows, 16)

    families = list(summary["max_tps_by_task"])
    out += ["", f"Max TPS at >= {round(100 * HEATMAP_LEVEL)} % accuracy per task (- : never)"]
    rows = [[t, *(_num(summary["max_tps_by_task"][f][t], 5) for f in families)] for t in summary["tasks"]]
    out += _table(["task", *families], rows, 16)
    return "\n".join(out)


def _caches(config) -> str:
    """`` (caches none, dual)`` after the settings count when the labels name the cache, else ``""``."""
    return f" (caches {', '.join(config.caches)})" if config.cache_shown else ""


def _slope_name(entry: dict[str, Any], cache_shown: bool) -> str:
    """An order-preference row's name: the family, its point and (when the labels name it) the cache."""
    point = f" {entry['point']}" if entry["point"] else ""
    return entry["family"] + point + (f" cache={entry['cache']}" if cache_shown else "")


# ---- --metrics parallelbench --------------------------------------------------------------------------
def format_parallelbench(config, pb: dict[str, Any]) -> str:
    """The text of ``dllm stress --metrics parallelbench`` (``stress.parallelbench.summarize_parallelbench``)."""
    n_ex = sum(len(v) for v in config.examples.values())
    opt = pb["options"]
    out = [f"dllm stress (ParallelBench's metrics, arXiv 2510.04767): model {config.model}, {len(config.tasks)} "
           f"tasks, {n_ex} examples per setting, {len(config.settings)} settings{_caches(config)}, greedy",
           f"TPS: nominal k for top-k, mean of L_ans / forwards per sample otherwise; scoring: eos={opt['eos']}, "
           f"shuffle={opt['shuffle']}; tau: sorted commit steps vs commit steps (tau_pad={opt['tau_pad']})"]
    if pb["cells_without_rows"]:
        out.append(f"note: {pb['cells_without_rows']} cells were decoded without --metrics parallelbench (resumed): "
                   f"they keep dllm's scores and have no ParallelBench tau")
    levels = pb["levels"]
    out += ["", f"Leaderboard: max TPS at >= {'/'.join(levels)} % mean accuracy over tasks (0: never; top-k: "
                "largest k reaching the level; adaptive: interpolated at the level)"]
    rows = [[c["curve"], *(_num(c["leaderboard"][lv], 6) for lv in levels), c["rule"]] for c in pb["curves"]]
    out += _table(["curve", *(f"TPS@{lv}" for lv in levels), "rule"], rows, 16)

    out += ["", "Curves: centre of mass (TPS), per-sample oracle pooled over every sample of every task, Kendall tau"]
    rows = [[c["curve"], _num(c["com"], 5), _num(c["oracle"]["accuracy"], 6, 1, 100), _num(c["oracle"]["tps"], 6),
             _num(c["tau"], 5)] for c in pb["curves"]]
    out += _table(["curve", "CoM", "oracle acc %", "oracle TPS", "tau"], rows, 16)

    out += ["", "Settings: means over tasks"]
    rows = [[s["label"], _num(s["accuracy"], 6, 1, 100), _num(s["tps"], 5), _num(s["tau"], 5)] for s in pb["settings"]]
    out += _table(["setting", "acc %", "TPS", "tau"], rows, 16)

    out += ["", f"Order preference: slope of accuracy (points) per halving of the block length, mean over tasks "
                f"(> 0: shorter blocks score higher; top-k at k={opt['slope_k']})"]
    if pb["order_preference"]:
        rows = [[_slope_name(o, config.cache_shown), _num(o["slope"], 6),
                 ",".join(map(str, o["block_lengths"]))] for o in pb["order_preference"]]
        out += _table(["setting", "slope", "block lengths"], rows, 16)
    elif len(config.block_lengths) < 2:
        out.append("(needs two or more --block-lengths)")
    else:  # two block lengths, but top-k only at other k (and no adaptive family)
        out.append(f"(no setting to compare: top-k is compared at k={opt['slope_k']} only; add it to the grid "
                   f"or set --metrics parallelbench:slope_k=K)")
    return "\n".join(out)


__all__ = ["HEATMAP_LEVEL", "format_parallelbench", "format_report", "summarize"]
