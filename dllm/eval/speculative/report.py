"""The rows of ``dllm bench spec``: ``Row`` (one method at one temperature), ``summarize`` (a method's
samples into its row), ``acceptance_by_position`` and ``format_table`` (markdown)."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from functools import lru_cache
from typing import Any, Optional, Sequence

from dllm import tasks as T
from dllm.eval.speculative.runners import Sample


@dataclass
class Row:
    """One method at one temperature, over every prompt."""

    method: str
    temperature: float
    status: str = "ok"  # "ok" | "skipped"
    reason: str = ""
    prompts: int = 0
    generated_tokens: int = 0
    target_forwards: int = 0
    drafter_forwards: int = 0
    tau: Optional[float] = None
    tau_round: Optional[float] = None
    acceptance: Optional[list[float]] = None
    tokens_per_s: Optional[float] = None
    wall_s: float = 0.0
    speedup: Optional[float] = None
    accuracy: Optional[float] = None
    greedy_match: Optional[bool] = None
    outputs: list[list[int]] = field(default_factory=list, repr=False)  # generated ids per prompt (not in JSON)

    def to_json(self) -> dict[str, Any]:
        return {k: v for k, v in asdict(self).items() if k != "outputs"}


def summarize(method: str, temp: float, samples: Sequence[Sample], examples: Sequence[T.Example],
              block_size: int) -> Row:
    """One row from one method's samples at one temperature (sample i is examples[i])."""
    words = {i: w for w, i in task_vocab().items()}
    tokens = sum(len(s.generated) for s in samples)
    forwards = sum(s.target_forwards for s in samples)
    wall = sum(s.wall_s for s in samples)
    commits = None if any(s.commits is None for s in samples) else [n for s in samples for n in s.commits]
    hits = [T.score(ex, [words.get(t, "?") for t in s.generated]) for ex, s in zip(examples, samples)]
    return Row(
        method=method, temperature=temp, prompts=len(samples), generated_tokens=tokens, target_forwards=forwards,
        drafter_forwards=sum(s.drafter_forwards for s in samples),
        tau=round(tokens / forwards, 4) if forwards else None,
        tau_round=round(sum(commits) / len(commits), 4) if commits else None,
        acceptance=None if commits is None else acceptance_by_position(commits, block_size),
        tokens_per_s=round(tokens / wall, 2) if wall > 0 else None, wall_s=round(wall, 4),
        accuracy=round(sum(hits) / len(hits), 4) if hits else None, outputs=[list(s.generated) for s in samples],
    )


def acceptance_by_position(commits: Sequence[int], block_size: int) -> list[float]:
    """Entry k - 1 (k = 1..block_size - 1): the fraction of rounds that accepted >= k drafts."""
    n = max(len(commits), 1)
    return [round(sum(c > k for c in commits) / n, 4) for k in range(1, block_size)]


@lru_cache(maxsize=1)
def task_vocab() -> dict[str, int]:
    from dllm.models.text.task_tokenizer import task_tokenizer

    return task_tokenizer().get_vocab()


COLUMNS = ("method", "temperature", "tau", "tau_round", "target_forwards", "drafter_forwards", "tokens_per_s",
           "wall_s", "speedup", "accuracy", "greedy_match", "status")


def compare_to_baseline(rows: Sequence[Row], base: Optional[Row], temperature: float) -> None:
    """Fill ``speedup`` (tokens/s over the baseline's) and, greedy only, ``greedy_match`` (the same
    tokens as the baseline) of every ok row, in place; nothing without an ok baseline."""
    if base is None:
        return
    for r in rows:
        if r.status == "ok":
            r.speedup = round(r.tokens_per_s / base.tokens_per_s, 3) if r.tokens_per_s and base.tokens_per_s else None
            r.greedy_match = r.outputs == base.outputs if temperature == 0 else None


def format_table(rows: Sequence[Row], columns: Sequence[str] = COLUMNS) -> str:
    """Markdown table of the rows, then each row's acceptance by position (k = 1..B-1)."""
    def cell(r: Row, c: str) -> str:
        v = getattr(r, c)
        return f"skipped ({r.reason})" if c == "status" and r.status == "skipped" else "" if v is None else str(v)

    lines = ["| " + " | ".join(columns) + " |", "|" + "|".join("---" for _ in columns) + "|"]
    lines += ["| " + " | ".join(cell(r, c) for c in columns) + " |" for r in rows]
    lines.append("\nacceptance by position (fraction of rounds accepting >= k drafts, k = 1..B-1):")
    lines += [f"  {r.method:<14} T={r.temperature:g}  " + " ".join(f"{a:.2f}" for a in r.acceptance)
              for r in rows if r.acceptance]
    return "\n".join(lines)


__all__ = ["COLUMNS", "Row", "compare_to_baseline", "acceptance_by_position", "format_table", "summarize"]
