"""Exact-match evaluation of a model on a slice of the PB-mini test split during training.

Decoding is one token per step with the ``low_confidence`` sampler (steps = gen_length =
block_length = the task's answer length ``L_ans``), greedy. Examples from all tasks that share an
answer length are decoded in one ``dllm.generate`` call (prompts left-padded; exact in float32), so
an evaluation costs about ``sum over distinct L_ans of L_ans`` forwards.
"""

from __future__ import annotations

import math
import time
from collections import defaultdict
from dataclasses import dataclass, field
from functools import lru_cache
from typing import Optional, Sequence

import torch

from dllm import tasks as T


@lru_cache(maxsize=None)
def zero_tc_tasks(per_size: int = 2) -> tuple[str, ...]:
    """Tasks whose test examples all have C(Y|X) = 0 (a unique answer): the first ``per_size``
    test instances of every default size are checked with ``T.total_correlation``."""
    out = []
    for entry in T.tasks:
        exs = T.test_split(entry.name, None, n=per_size)
        tcs = [T.total_correlation(ex) for ex in exs]
        if all(tc is not None and tc <= 1e-9 for tc in tcs):
            out.append(entry.name)
    return tuple(out)


@dataclass
class EvalResult:
    accuracy: dict[str, float]  # task -> exact-match accuracy on its slice
    counts: dict[str, int]  # task -> evaluated examples
    zero_tc: tuple[str, ...]  # the C(Y|X) = 0 tasks among those evaluated
    forwards: int = 0
    seconds: float = 0.0
    extra: dict[str, float] = field(default_factory=dict)

    @property
    def mean(self) -> float:
        """Mean accuracy over the evaluated tasks (each task weighs the same)."""
        return sum(self.accuracy.values()) / max(len(self.accuracy), 1)

    @property
    def mean_zero_tc(self) -> float:
        """Mean accuracy over the C(Y|X) = 0 tasks (the best-checkpoint metric); NaN if none."""
        vals = [self.accuracy[t] for t in self.zero_tc]
        return sum(vals) / len(vals) if vals else math.nan

    def to_log(self) -> dict[str, object]:
        return {
            "eval_mean_c0": round(self.mean_zero_tc, 4),
            "eval_mean": round(self.mean, 4),
            "eval_examples": sum(self.counts.values()),
            "eval_forwards": self.forwards,
            "eval_seconds": round(self.seconds, 2),
            "eval": {t: round(a, 4) for t, a in sorted(self.accuracy.items())},
        }


def eval_examples(tasks: Optional[Sequence[str]] = None, per_size: int = 4) -> list[T.Example]:
    """The first ``per_size`` test instances of every default size of each task."""
    names = [T.get_task(n).name for n in tasks] if tasks else [e.name for e in T.tasks]
    return [ex for n in names for ex in T.test_split(n, None, n=per_size)]


@torch.no_grad()
def evaluate(
    model,
    examples: Sequence[T.Example],
    *,
    max_batch: int = 256,
    autocast_bf16: bool = False,
    tokens_per_step: int = 1,
    sampler: str = "low_confidence",
) -> EvalResult:
    """Decode every example (one block of the answer length) and score it with ``T.score``.

    ``tokens_per_step`` = k: ``steps = ceil(L_ans / k)``, so the fixed-step sampler commits k per
    step (LLaDA's schedule spreads a remainder over the first steps).
    """
    if not isinstance(tokens_per_step, int) or tokens_per_step < 1:
        raise ValueError(f"tokens_per_step must be an integer >= 1, got {tokens_per_step!r}")
    from dllm.engine import generate

    t0 = time.perf_counter()
    words = T.vocabulary()
    groups: dict[int, list[T.Example]] = defaultdict(list)
    for ex in examples:
        groups[T.answer_length(ex.task, ex.size)].append(ex)
    correct: dict[str, int] = defaultdict(int)
    counts: dict[str, int] = defaultdict(int)
    forwards = 0
    device_type = torch.device(model.device).type
    was_training = model.training
    model.eval()
    try:
        for la, group in sorted(groups.items()):
            for i in range(0, len(group), max_batch):
                chunk = group[i:i + max_batch]
                prompts = [T.prompt_ids(ex) for ex in chunk]
                with torch.autocast(device_type, dtype=torch.bfloat16, enabled=autocast_bf16):
                    out = generate(model, prompts, sampler, gen_length=la, block_length=la,
                                   steps=-(-la // tokens_per_step))
                forwards += out.nfe
                for ex, row in zip(chunk, out.generated.tolist()):
                    region = [words[t] if 0 <= t < len(words) else T.PAD for t in row]
                    correct[ex.task] += bool(T.score(ex, region))
                    counts[ex.task] += 1
    finally:
        model.train(was_training)
    accuracy = {t: correct[t] / counts[t] for t in counts}
    zero = tuple(t for t in zero_tc_tasks() if t in counts)
    return EvalResult(accuracy, dict(counts), zero, forwards, time.perf_counter() - t0)


__all__ = ["EvalResult", "eval_examples", "evaluate", "zero_tc_tasks"]
