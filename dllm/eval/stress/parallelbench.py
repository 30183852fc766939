"""ParallelBench's own summary numbers for ``dllm stress --metrics parallelbench`` (arXiv 2510.04767).

``dllm stress`` scores every list task as ParallelBench's scorers do, but its default summary
(``stress.metrics``, ``stress.report``) differs from the paper's in its definitions. This module
holds ParallelBench's, as read from its code and its released results:

- **TPS of a setting on a task**: top-k (a fixed-step sampler, ``Setting.k``) counts the *nominal* k
  (the leaderboard data at github.com/parallelbench/parallelbench.github.io, ``data/figures/*/``:
  top-k rows hold exactly 1, 2, 4, ...); an adaptive sampler counts the mean over samples of
  ``L_ans / forwards`` (ParallelBench's ``max_tokens / nfe``, EOS padding included).
- **Leaderboard** (``data/leaderboard/*.json`` there): per curve, accuracy and TPS are averaged over
  tasks per setting; at each level, top-k takes the largest k whose mean accuracy reaches it, an
  adaptive family the TPS *interpolated* linearly at the level along its settings ordered by
  accuracy (:func:`interpolated_tps_at`); 0.0 when no setting reaches the level.
- **Centre of mass** (App. G.1): ``sum_s tps_s * acc_s / sum_s acc_s`` with the TPS above (so the
  nominal k for top-k).
- **Per-sample oracle** (App. G.2): each sample takes the setting with the fewest forwards among
  those reaching its best score; accuracy and tokens per step are *pooled* over every sample of
  every task (``sum tokens / sum forwards``), not averaged per task.
- **Kendall tau** (furiosa-ai/ParallelBench ``model/model_utils.py``): tau-b between the commit
  steps sorted ascending and the commit steps in position order (:func:`pb_kendall_tau`); positions
  committed in one step count as in order, where ``stress.metrics.unmasking_tau`` counts them as ties.
- **Order preference** (App. G.1): the slope of a least-squares line through a setting's accuracy
  over block lengths (at one cache); positive when shorter blocks (more left-to-right) score higher.
- **Scoring rules** (options): ParallelBench decodes the answer with ``skip_special_tokens=True``,
  so an EOS inside the answer is dropped and the words around it still count (``eos=drop``;
  ``eos=cut`` keeps dllm's rule: a word after an EOS is a miss); its ``list_shuffle_score``
  (``dataset/parallel_bench/metrics.py``) rejects the input order on Shuffle (``shuffle=strict``;
  ``shuffle=any`` keeps the ``shuffle`` task's rule).

The per-sample rules (EOS, Shuffle, Kendall tau) need the generated rows and commit steps, which a
sweep keeps (``Cell.rows``, ``Cell.traces``) when run with ``--metrics parallelbench``; a cell
decoded without them (a resumed file) keeps dllm's scores and has no ParallelBench tau, and the
report says how many such cells there are.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, fields
from typing import Any, Optional, Sequence

from dllm import tasks as T
from dllm.eval.stress.grid import Setting, cell_key
from dllm.eval.stress.metrics import Cell, centre_of_mass, kendall_tau_b, mean, oracle_choice, ratio
from dllm.registry import parse_spec

Point = tuple[float, float]  # (tokens per step, accuracy), accuracy in the scale of the level
METRICS = ("dllm", "parallelbench")
_EOS_RULES = ("drop", "cut")
_SHUFFLE_RULES = ("strict", "any")
_TAU_PAD = ("keep", "drop")


@dataclass(frozen=True)
class ParallelBenchConfig:
    """The options of ``--metrics parallelbench[:OPTION=VALUE,...]``."""

    eos: str = "drop"  # drop: an EOS inside the answer is removed before scoring (ParallelBench); cut: dllm's rule
    shuffle: str = "strict"  # strict: the input order is a miss on `shuffle` (ParallelBench); any: dllm's rule
    tau_pad: str = "keep"  # keep: tau over every answer position; drop: positions that end as EOS left out
    slope_k: int = 2  # the order-preference slope of fixed-step samplers at this k (App. G.1: k = 2)
    levels: tuple[float, ...] = (0.8, 0.75, 0.7)  # leaderboard accuracy levels

    def __post_init__(self) -> None:
        for name, valid in (("eos", _EOS_RULES), ("shuffle", _SHUFFLE_RULES), ("tau_pad", _TAU_PAD)):
            if getattr(self, name) not in valid:
                raise ValueError(f"--metrics parallelbench: {name}={getattr(self, name)!r} is not valid; "
                                 f"choose one of {', '.join(valid)}")
        if not isinstance(self.slope_k, int) or isinstance(self.slope_k, bool) or self.slope_k < 1:
            raise ValueError(f"--metrics parallelbench: slope_k={self.slope_k!r} must be an integer >= 1")
        if not self.levels or any(not 0 < v <= 1 for v in self.levels):
            raise ValueError(f"--metrics parallelbench: levels {self.levels!r} must be accuracies in (0, 1]")


def parse_metrics(text: str) -> Optional[ParallelBenchConfig]:
    """``--metrics``: ``"dllm"`` -> None; ``"parallelbench[:eos=cut,...]"`` -> its config."""
    name, options = parse_spec(text.strip(), "--metrics")
    if name not in METRICS:
        raise ValueError(f"--metrics {text!r}: unknown {name!r}; choose one of {', '.join(METRICS)}")
    if name == "dllm":
        if options:
            raise ValueError(f"--metrics {text!r}: dllm takes no options")
        return None
    known = [f.name for f in fields(ParallelBenchConfig) if f.name != "levels"]
    unknown = [k for k in options if k not in known]
    if unknown:
        raise ValueError(f"--metrics {text!r}: unknown option(s) {', '.join(unknown)}; valid: {', '.join(known)}")
    return ParallelBenchConfig(**options)


# ---- math -----------------------------------------------------------------------------------------
def _reaches(acc: float, level: float) -> bool:
    return acc >= level - 1e-9 * max(1.0, abs(level))  # means of counts compared with a level


def nominal_tps_at(points: Sequence[Point], level: float) -> float:
    """Top-k's leaderboard entry: the largest nominal k among the points whose accuracy reaches
    ``level``; 0.0 when none does."""
    return max((t for t, a in points if _reaches(a, level)), default=0.0)


def interpolated_tps_at(points: Sequence[Point], level: float) -> float:
    """An adaptive family's leaderboard entry: with the points ordered by accuracy, the TPS on the
    straight line between the two points whose accuracies enclose ``level``; the TPS of the least
    accurate point when every point is above the level (no extrapolation); 0.0 when none reaches it.
    Points of equal accuracy count once, with the largest TPS among them."""
    if not points or not any(_reaches(a, level) for _, a in points):
        return 0.0
    best: dict[float, float] = {}
    for t, a in points:
        best[a] = max(t, best.get(a, -math.inf))
    accs = sorted(best)
    if level <= accs[0]:
        return best[accs[0]]
    hi = next(i for i, a in enumerate(accs) if _reaches(a, level))
    a1, a0 = accs[hi], accs[hi - 1]
    if a1 <= level:  # on the point (within rounding)
        return best[a1]
    w = (level - a0) / (a1 - a0)
    return best[a0] + w * (best[a1] - best[a0])


def pb_kendall_tau(order: Sequence[int]) -> Optional[float]:
    """ParallelBench's decoding-order tau: Kendall tau-b between the commit steps sorted ascending
    and the commit steps in position order (``order[i]``: the step that committed position i).
    Positions committed in the same step are in order; a position never committed (-1, as
    ``unmasking_tau`` reads a trace) is left out; None when every position left came in one step."""
    steps = [s for s in order if s >= 0]
    return kendall_tau_b(sorted(steps), steps)


def slope(xs: Sequence[float], ys: Sequence[float]) -> Optional[float]:
    """The slope of the least-squares line through (xs, ys); None with fewer than two distinct xs."""
    if len(xs) != len(ys):
        raise ValueError(f"slope needs sequences of one length, got {len(xs)} and {len(ys)}")
    if len(set(xs)) < 2:
        return None
    mx, my = math.fsum(xs) / len(xs), math.fsum(ys) / len(ys)
    return math.fsum((x - mx) * (y - my) for x, y in zip(xs, ys)) / math.fsum((x - mx) ** 2 for x in xs)


def order_preference(block_lengths: Sequence[int], accuracies: Sequence[float]) -> Optional[float]:
    """App. G.1's y axis: the slope of accuracy against ``-log2(block length)`` (the figures' log
    axis, negated so that a positive slope means shorter, more left-to-right blocks score higher)."""
    return slope([-math.log2(b) for b in block_lengths], list(accuracies))


def task_tps(k: Optional[int], tokens: Sequence[int], nfe: Sequence[float]) -> float:
    """One setting on one task: the nominal k for top-k, else the mean of ``L_ans / forwards``."""
    if k is not None:
        return float(k)
    return math.fsum(ratio(t, n) for t, n in zip(tokens, nfe)) / len(tokens) if tokens else math.nan


def pooled_oracle(correct: Sequence[Sequence[Sequence[bool]]], nfe: Sequence[Sequence[Sequence[float]]],
                  tokens: Sequence[Sequence[Sequence[int]]]) -> dict[str, float]:
    """The per-sample oracle pooled over tasks: ``correct[t][s][n]`` (task, setting, sample), the same
    for ``nfe`` and ``tokens``. Per task, each sample takes ``oracle_choice``; accuracy and
    ``sum tokens / sum forwards`` are then taken over every sample of every task."""
    hits = count = toks = 0
    fwd: list[float] = []
    for c, f, k in zip(correct, nfe, tokens):
        for j, s in enumerate(oracle_choice(c, f)):
            hits += bool(c[s][j])
            count += 1
            toks += k[s][j]
            fwd.append(f[s][j])
    return {"accuracy": ratio(hits, count), "tps": ratio(toks, math.fsum(fwd)), "samples": count}


# ---- per sample -----------------------------------------------------------------------------------
def rescore(ex: T.Example, row: Sequence[int], cfg: ParallelBenchConfig) -> bool:
    """One generated answer region (word ids) scored with ParallelBench's rules of ``cfg``."""
    words = T.words_of(row)
    if cfg.eos == "drop":
        words = [w for w in words if w != T.EOS] + [T.EOS]  # EOS removed wherever it is, as skip_special_tokens
    ok = T.score(ex, words)
    if ok and cfg.shuffle == "strict":
        task = T.get_task(ex.task)
        if getattr(task, "op", None) == "shuffle" and not getattr(task, "strict", True):
            ok = tuple(T.cut_answer(words) or ()) != tuple(task.reference_answer(ex.meta))  # the input order
    return ok


def sample_tau(row: Sequence[int], trace: Sequence[int], cfg: ParallelBenchConfig) -> Optional[float]:
    """``pb_kendall_tau`` of one sample (``tau_pad=drop``: positions that end as EOS left out)."""
    eos = T.word_id(T.EOS)
    keep = [s for w, s in zip(row, trace) if not (cfg.tau_pad == "drop" and w == eos)]
    return pb_kendall_tau(keep) if keep else None


def cell_outcomes(cell: Cell, examples: Sequence[T.Example], cfg: ParallelBenchConfig) -> tuple[list[bool], list]:
    """(correct, tau) per sample of a cell under ``cfg``; a cell without rows keeps its scores, no tau."""
    if cell.rows is None or cell.traces is None:
        return list(cell.correct), [None] * len(cell.correct)
    if len(examples) != len(cell.rows):
        raise ValueError(f"cell {cell.setting!r} | {cell.task!r} holds {len(cell.rows)} samples, "
                         f"the sweep {len(examples)}")
    correct = [rescore(ex, row, cfg) for ex, row in zip(examples, cell.rows)]
    return correct, [sample_tau(r, t, cfg) for r, t in zip(cell.rows, cell.traces)]


# ---- a sweep --------------------------------------------------------------------------------------
def _pct(level: float) -> str:
    return str(round(100 * level))


def _by(settings: Sequence[Setting], key) -> dict[Any, list[Setting]]:
    out: dict[Any, list[Setting]] = {}
    for s in settings:
        out.setdefault(key(s), []).append(s)
    return out


def summarize_parallelbench(config, cells: dict[str, Cell], cfg: ParallelBenchConfig) -> dict[str, Any]:
    """ParallelBench's numbers of a finished sweep (``config``: a ``StressConfig``; ``cells`` keyed by
    ``cell_key``): per setting, per curve (leaderboard, centre of mass, pooled oracle, tau) and the
    order-preference slopes. Accuracies are fractions; tau None where no cell kept its rows."""
    tasks = list(config.tasks)
    per: dict[str, dict[str, dict[str, Any]]] = {}  # setting label -> task -> outcomes
    missing = 0
    for s in config.settings:
        per[s.label] = {}
        for t in tasks:
            cell = cells[cell_key(s, t)]
            missing += cell.rows is None
            correct, tau = cell_outcomes(cell, config.examples[t], cfg)
            per[s.label][t] = {"correct": correct, "nfe": cell.nfe, "tokens": cell.tokens,
                               "accuracy": ratio(sum(correct), len(correct)),
                               "tps": task_tps(s.k, cell.tokens, cell.nfe), "tau": mean(tau)}
    settings = [{"label": s.label, "family": s.family, "curve": s.curve, "point": s.point,
                 "block_length": s.block_length, "cache": s.cache, "k": s.k,
                 **{m: mean([per[s.label][t][m] for t in tasks]) for m in ("accuracy", "tps", "tau")},
                 "per_task": {t: {m: per[s.label][t][m] for m in ("accuracy", "tps", "tau")} for t in tasks}}
                for s in config.settings]
    row = {r["label"]: r for r in settings}

    curves = []
    for curve, members in _by(config.settings, lambda s: s.curve).items():
        points = [(row[s.label]["tps"], row[s.label]["accuracy"]) for s in members]
        fixed = all(s.k is not None for s in members)
        rule = nominal_tps_at if fixed else interpolated_tps_at
        com = {t: centre_of_mass([(per[s.label][t]["tps"], per[s.label][t]["accuracy"]) for s in members])
               for t in tasks}
        oracle = pooled_oracle([[per[s.label][t]["correct"] for s in members] for t in tasks],
                               [[per[s.label][t]["nfe"] for s in members] for t in tasks],
                               [[per[s.label][t]["tokens"] for s in members] for t in tasks])
        curves.append({"curve": curve, "family": members[0].family, "block_length": members[0].block_length,
                       "cache": members[0].cache, "rule": "nominal k" if fixed else "interpolated",
                       "leaderboard": {_pct(v): rule(points, v) for v in cfg.levels},
                       "com": mean(list(com.values())), "com_by_task": com, "oracle": oracle,
                       "tau": mean([row[s.label]["tau"] for s in members])})

    slopes = []
    for (family, point, k, cache), members in _by(config.settings, lambda s: (s.family, s.point, s.k, s.cache)).items():
        if len({s.block_length for s in members}) < 2 or (k is not None and k != cfg.slope_k):
            continue
        by_task = {}
        for t in tasks:
            # block length 0 (one block) and blocks past the answer count as the task's longest answer region
            la = max(T.answer_length(t, ex.size) for ex in config.examples[t])
            by_task[t] = order_preference([min(s.block_length or la, la) for s in members],
                                          [100 * per[s.label][t]["accuracy"] for s in members])
        slopes.append({"family": family, "point": point, "k": k, "cache": cache,
                       "block_lengths": [s.block_length for s in members],
                       "slope": mean(list(by_task.values())), "slope_by_task": by_task})
    return {"options": {"eos": cfg.eos, "shuffle": cfg.shuffle, "tau_pad": cfg.tau_pad, "slope_k": cfg.slope_k},
            "levels": [_pct(v) for v in cfg.levels], "tasks": tasks, "cells_without_rows": missing,
            "settings": settings, "curves": curves, "order_preference": slopes}


__all__ = ["METRICS", "ParallelBenchConfig", "cell_outcomes", "interpolated_tps_at", "nominal_tps_at",
           "order_preference", "parse_metrics", "pb_kendall_tau", "pooled_oracle", "rescore", "sample_tau",
           "slope", "summarize_parallelbench", "task_tps"]
