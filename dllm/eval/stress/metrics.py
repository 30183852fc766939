"""The numbers of ``dllm stress``: per-cell results and ParallelBench's metrics (arXiv 2510.04767).

A *cell* is one setting (sampler, options, k, block length) on one task: every test example of the
task decoded once, with per-sample outcomes:

- ``correct``: exact match of the generated answer region (``tasks.score``).
- ``nfe``: the forwards the sample needs when decoded alone: the sampler steps that changed its row
  of the canvas (samplers decide per row, so a batch does not change them) times the forwards per
  step (1; samplers that verify drafts in extra forwards are decoded one row per call).
- ``tokens``: generated positions, i.e. the task's answer region ``L_ans`` *including* the EOS
  padding (ParallelBench's ``max_tokens``); ``content``: the positions before the first EOS of
  the generated answer (the words of the answer, without padding).
- ``tau``: Kendall tau-b between the position order and the step at which each generated position
  was committed (+1: left to right, -1: right to left; None when every position came in one step).

Tokens per step of a cell (TPS, ParallelBench's x axis): ``sum(tokens) / sum(nfe)`` over its
samples; content tokens per step: ``sum(content) / sum(nfe)``. For top-k with one block this is
``L_ans / ceil(L_ans / k)``, i.e. about k; for adaptive samplers it is measured.

Metrics over a set of settings (a family, or one of its block lengths, a *curve*):

- ``centre_of_mass``: parallelizability, ``sum_s tps_s * acc_s / sum_s acc_s`` (App. G.1, with the
  measured TPS of each setting as its k).
- ``max_tps_at``: the highest TPS among settings with accuracy >= a level (the leaderboard metric at
  80 / 75 / 70 %); None when no setting reaches it.
- ``oracle_choice``: the per-sample oracle (App. G.2): for each sample, among the settings, the least
  restrictive one (fewest forwards) that still reaches the sample's best score (correct if any
  setting gets it right).
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from typing import Optional, Sequence

Point = tuple[float, float]  # (tokens per step, accuracy in [0, 1])
LEVELS = (0.8, 0.75, 0.7)  # the leaderboard's accuracy levels
_EPS = 1e-9  # accuracy comparisons: counts / n, compared with a level


# ---- math -----------------------------------------------------------------------------------------
def kendall_tau_b(x: Sequence[float], y: Sequence[float]) -> Optional[float]:
    """Kendall's tau-b of two equally long sequences (ties in either allowed; what
    ``scipy.stats.kendalltau`` computes by default); None when one of them is constant."""
    if len(x) != len(y):
        raise ValueError(f"kendall_tau_b needs sequences of one length, got {len(x)} and {len(y)}")
    conc = disc = tied_x = tied_y = 0
    for i in range(len(x)):
        for j in range(i + 1, len(x)):
            dx = (x[i] > x[j]) - (x[i] < x[j])
            dy = (y[i] > y[j]) - (y[i] < y[j])
            if dx == 0 and dy == 0:
                continue
            if dx == 0:
                tied_x += 1
            elif dy == 0:
                tied_y += 1
            elif dx == dy:
                conc += 1
            else:
                disc += 1
    denom = math.sqrt((conc + disc + tied_x) * (conc + disc + tied_y))
    return None if denom == 0 else (conc - disc) / denom


def unmasking_tau(commit_steps: Sequence[int]) -> Optional[float]:
    """Kendall tau-b of the unmasking order against left to right: ``commit_steps[i]`` is the step
    at which generated position i was committed (-1: never, left out)."""
    pairs = [(i, s) for i, s in enumerate(commit_steps) if s >= 0]
    return kendall_tau_b([i for i, _ in pairs], [s for _, s in pairs])


def centre_of_mass(points: Sequence[Point]) -> Optional[float]:
    """``sum tps * acc / sum acc`` over the points; None when every accuracy is 0."""
    weight = math.fsum(a for _, a in points)
    return None if weight <= 0 else math.fsum(t * a for t, a in points) / weight


def best_at(points: Sequence[Point], level: float) -> Optional[int]:
    """Index of the highest-TPS point with accuracy >= level (first on ties); None if none."""
    ok = [i for i, (_, a) in enumerate(points) if a >= level - _EPS]
    return max(ok, key=lambda i: (points[i][0], -i)) if ok else None


def max_tps_at(points: Sequence[Point], level: float) -> Optional[float]:
    """The highest tokens per step among the points with accuracy >= level; None if none."""
    i = best_at(points, level)
    return None if i is None else points[i][0]


def oracle_choice(correct: Sequence[Sequence[bool]], nfe: Sequence[Sequence[float]]) -> list[int]:
    """Per-sample oracle over S settings and N samples: ``correct[s][n]``, ``nfe[s][n]`` -> the chosen
    setting of each sample, [N]: the fewest forwards among the settings that reach the sample's best
    score (the first such setting on ties)."""
    if not correct or len(correct) != len(nfe):
        raise ValueError(f"oracle_choice needs one row per setting in both, got {len(correct)} and {len(nfe)}")
    n = len(correct[0])
    if any(len(r) != n for r in (*correct, *nfe)):
        raise ValueError("oracle_choice: every setting needs one entry per sample")
    out = []
    for j in range(n):
        best = max(bool(c[j]) for c in correct)
        out.append(min((s for s in range(len(correct)) if bool(correct[s][j]) == best),
                       key=lambda s: (nfe[s][j], s)))
    return out


def mean(values: Sequence[Optional[float]]) -> Optional[float]:
    """Mean of the values that are not None; None if there are none."""
    vals = [v for v in values if v is not None]
    return math.fsum(vals) / len(vals) if vals else None


def ratio(num: float, den: float) -> float:
    return num / den if den > 0 else math.nan


def _is_int(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _is_count(value: object, low: float = 0.0) -> bool:
    """A finite number (not a bool) >= ``low``."""
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value) and value >= low


# ---- one cell -------------------------------------------------------------------------------------
@dataclass
class Cell:
    """One setting on one task (see the module docstring for each field); lists are per sample."""

    setting: str  # Setting.label
    task: str
    sizes: list[int]
    correct: list[bool]
    nfe: list[float]
    tokens: list[int]
    content: list[int]
    tau: list[Optional[float]]
    forwards: int  # model forwards the batched decode ran (compute actually spent)
    seconds: float  # wall time of the cell's decode
    rows: Optional[list[list[int]]] = None  # generated answer word ids, kept for --metrics parallelbench
    traces: Optional[list[list[int]]] = None  # per position, the step that committed it (same)

    @property
    def examples(self) -> int:
        return len(self.correct)

    @property
    def accuracy(self) -> float:
        return ratio(sum(map(bool, self.correct)), len(self.correct))

    @property
    def tps(self) -> float:
        """Generated positions (EOS padding included) per forward."""
        return ratio(sum(self.tokens), math.fsum(self.nfe))

    @property
    def tps_content(self) -> float:
        """Answer words (before the first EOS) per forward."""
        return ratio(sum(self.content), math.fsum(self.nfe))

    @property
    def mean_nfe(self) -> float:
        return ratio(math.fsum(self.nfe), len(self.nfe))

    @property
    def mean_tau(self) -> Optional[float]:
        return mean(self.tau)

    def to_json(self) -> dict:
        out = {k: v for k, v in asdict(self).items() if v is not None or k not in ("rows", "traces")}
        out["summary"] = {"accuracy": self.accuracy, "tps": self.tps, "tps_content": self.tps_content,
                          "nfe": self.mean_nfe, "tau": self.mean_tau}
        return out

    @classmethod
    def from_json(cls, data: dict) -> "Cell":
        fields = {k: v for k, v in data.items() if k != "summary"}
        return cls(**fields)

    def damage(self, sizes: Optional[Sequence[int]] = None) -> Optional[str]:
        """What a cell read from a file has that ``decode_cell`` never writes (None: nothing): per-sample
        lists of another length than its samples (``sizes``: the sweep's sizes of the task's examples),
        values of the wrong type. A resume must not aggregate such a cell."""
        if sizes is not None and self.sizes != list(sizes):
            return f"sizes {self.sizes!r}, the sweep's examples have sizes {list(sizes)!r}"
        n = len(sizes) if sizes is not None else len(self.correct) if isinstance(self.correct, list) else 0
        checks = {"sizes": _is_int, "correct": lambda v: isinstance(v, bool), "nfe": _is_count,
                  "tokens": _is_int, "content": _is_int, "tau": lambda v: v is None or _is_count(v, -1.0)}
        for name, ok in checks.items():
            values = getattr(self, name)
            if not isinstance(values, list) or len(values) != n:
                return f"{name} must list {n} samples, got {values!r}"
            bad = [v for v in values if not ok(v)]
            if bad:
                return f"{name} holds {bad[0]!r}"
        for name in ("rows", "traces"):
            values = getattr(self, name)
            if values is not None and (not isinstance(values, list) or len(values) != n
                                       or not all(isinstance(r, list) and all(map(_is_int, r)) for r in values)):
                return f"{name} must be {n} lists of integers, got {values!r}"
        if not _is_int(self.forwards) or not _is_count(self.seconds):
            return f"forwards {self.forwards!r} and seconds {self.seconds!r} must be numbers"
        return None

    def same_outcome(self, other: "Cell") -> bool:
        """Equal in everything but wall time."""
        a, b = asdict(self), asdict(other)
        a.pop("seconds"), b.pop("seconds")
        return a == b


def oracle_summary(cells: Sequence[Cell]) -> dict:
    """The per-sample oracle over the settings of ``cells`` (one task, same samples in each): its
    accuracy, tokens per step and content tokens per step, and the index of each sample's choice."""
    if any(c.sizes != cells[0].sizes for c in cells):
        raise ValueError(f"oracle over task {cells[0].task!r}: the cells hold different samples")
    choice = oracle_choice([c.correct for c in cells], [c.nfe for c in cells])
    nfe = math.fsum(cells[s].nfe[j] for j, s in enumerate(choice))
    return {
        "accuracy": ratio(sum(bool(cells[s].correct[j]) for j, s in enumerate(choice)), len(choice)),
        "tps": ratio(sum(cells[s].tokens[j] for j, s in enumerate(choice)), nfe),
        "tps_content": ratio(sum(cells[s].content[j] for j, s in enumerate(choice)), nfe),
        "choice": choice,
    }


__all__ = ["Cell", "LEVELS", "Point", "best_at", "centre_of_mass", "kendall_tau_b", "max_tps_at", "mean",
           "oracle_choice", "oracle_summary", "ratio", "unmasking_tau"]
