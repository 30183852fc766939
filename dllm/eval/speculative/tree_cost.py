"""The cost curve of one target forward (``dllm bench trees``): batch 1, a warm cache of
``prefix`` tokens, T = 1 + N new tokens under a 4-D mask (as tree verification runs it), N in
``COST_SIZES``, the median of ``repeats`` calls; a least-squares line t(N) = a + b N, with ``b / a``
the relative cost of a node."""

from __future__ import annotations

import statistics
import time
from dataclasses import asdict, dataclass, field
from typing import Any, Sequence

import torch

from dllm.eval.bench.timing import sync

COST_SIZES: tuple[int, ...] = (0, 1, 2, 4, 8, 16, 32, 64, 128)


@dataclass
class CostCurve:
    """Median wall time (ms) of one batch-1 target forward of 1 + N tokens over a warm cache of
    ``prefix`` tokens, per N; the least-squares line ``ms = a + b * N``."""

    prefix: int
    repeats: int
    sizes: list[int]
    ms: list[float]
    a_ms: float
    b_ms: float
    b_over_a: float
    device: str = ""
    samples_ms: list[list[float]] = field(default_factory=list)  # every timed call per N

    def to_json(self) -> dict[str, Any]:
        return asdict(self)

    def format(self) -> str:
        lines = [f"target forward cost (batch 1, cache of {self.prefix} tokens, median of {self.repeats}, "
                 f"{self.device}): fit t(N) = {self.a_ms:.4f} ms + {self.b_ms:.5f} ms * N, "
                 f"b/a = {self.b_over_a:.5f} per node",
                 "| N | T = 1 + N | ms | fit ms |", "|---|---|---|---|"]
        lines += [f"| {n} | {n + 1} | {m:.4f} | {self.a_ms + self.b_ms * n:.4f} |" for n, m in zip(self.sizes, self.ms)]
        return "\n".join(lines)


def fit_line(xs: Sequence[float], ys: Sequence[float]) -> tuple[float, float]:
    """Least-squares (a, b) of y = a + b x; ValueError with fewer than two distinct x."""
    if len(xs) != len(ys) or len(set(xs)) < 2:
        raise ValueError(f"a line needs at least two distinct x values, got {list(xs)}")
    mx, my = sum(xs) / len(xs), sum(ys) / len(ys)
    b = sum((x - mx) * (y - my) for x, y in zip(xs, ys)) / sum((x - mx) ** 2 for x in xs)
    return my - b * mx, b


def forward_cost(target, sizes: Sequence[int] = COST_SIZES, *, prefix: int = 100, repeats: int = 15, warmup: int = 2,
                 taps: Sequence[int] = (), seed: int = 0) -> CostCurve:
    """Time one target forward of T = 1 + N tokens (N in ``sizes``) at batch 1, under
    ``torch.inference_mode``, appended to a DynamicCache that holds ``prefix`` random tokens; the
    cache is cropped back after every call (outside the timing). The forward is the loop's
    (``Target.forward``, a 4-D boolean mask as tree verification passes, ``taps``: the drafter's
    tapped layers). Median of ``repeats`` calls per size after ``warmup`` untimed rounds; the sizes
    take turns within each round."""
    from dllm.drafters.target import Target, crop_to

    bad = [n for n in sizes if isinstance(n, bool) or not isinstance(n, int) or n < 0]
    if bad or len(set(sizes)) < 2:
        raise ValueError(f"cost sizes must be at least two distinct integers >= 0, got {list(sizes)!r}")
    for name, value in (("prefix", prefix), ("repeats", repeats)):
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise ValueError(f"{name} must be an integer >= 1, got {value!r}")
    tgt = Target(target, taps=tuple(taps))
    tgt.check_tree("the tree forwards this times (4-D masks over the cache)")
    device, vocab = tgt.device, tgt.info.vocab_size
    gen = torch.Generator().manual_seed(seed)
    times: dict[int, list[float]] = {n: [] for n in sizes}
    with torch.inference_mode():
        cache = tgt.new_cache(1)
        ids = torch.randint(0, vocab, (1, prefix), generator=gen).to(device)
        tgt.forward(ids, torch.ones_like(ids, dtype=torch.bool), torch.arange(prefix, device=device)[None], cache,
                    last_only=True)
        inputs = {}
        for n in sizes:
            t = n + 1
            inner = torch.ones((t, t), dtype=torch.bool, device=device).tril()
            mask = torch.cat([torch.ones((t, prefix), dtype=torch.bool, device=device), inner], dim=1)[None, None]
            inputs[n] = (torch.randint(0, vocab, (1, t), generator=gen).to(device), mask,
                         prefix + torch.arange(t, device=device)[None])
        for rep in range(warmup + repeats):  # sizes interleaved: a slow spell of the machine hits them alike
            for n in sizes:
                sync(device)
                t0 = time.perf_counter()
                tgt.forward(*inputs[n], cache)
                sync(device)
                if rep >= warmup:
                    times[n].append(time.perf_counter() - t0)
                crop_to(cache, prefix)
    ms = [round(statistics.median(times[n]) * 1e3, 5) for n in sizes]
    samples = [[round(x * 1e3, 5) for x in times[n]] for n in sizes]
    a, b = fit_line([float(n) for n in sizes], ms)
    return CostCurve(prefix=prefix, repeats=repeats, sizes=list(sizes), ms=ms, a_ms=round(a, 5), b_ms=round(b, 6),
                     b_over_a=round(b / a, 6) if a > 0 else float("nan"), device=str(device), samples_ms=samples)


__all__ = ["COST_SIZES", "CostCurve", "fit_line", "forward_cost"]
