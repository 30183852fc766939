"""Which pending forwards share one model call: a cost model over rows and padded length.

A merged call pads every row to its longest one, so merging a 12-column forward with a 36-column one
triples the first one's work; running them apart costs one more call. The cost of a call is modelled
as ``call_cost + rows x padded length`` (in forwarded tokens): ``call_cost`` is what one call costs
beyond its tokens (kernel launches, the Python of the layers), large on a GPU, tens of tokens of a
small model on a CPU core; ``measure_call_cost`` measures it for a model on its device (``dllm serve``
does at start, ``--call-cost-tokens auto``). Where the model forwards a padded batch's real tokens
packed (``dllm.models.core.views.packed``, ``BatcherConfig.packed``), a call costs ``call_cost + its
real tokens`` instead. The plan sorts the mergeable forwards by length and splits them into
runs of neighbouring lengths with the least total cost (a dynamic programme over the runs of equal
length), under the row and token bounds of one call. Forwards that cannot be merged run alone.

The plan changes only which rows share a matmul, never a row's result (``merged_forward`` is tested
equal to each call's own forward), so any plan gives the same tokens.
"""

from __future__ import annotations

import time
from typing import Any, Optional, Protocol, Sequence, TypeVar

import torch

from dllm.inputs import model_device


class Forward(Protocol):
    """What the plan reads of a pending forward."""

    @property
    def mergeable(self) -> bool: ...

    @property
    def rows(self) -> int: ...

    @property
    def length(self) -> int: ...


F = TypeVar("F", bound=Forward)


def call_cost(rows: int, length: int, fixed: int, real: Optional[int] = None) -> int:
    """Modelled cost of one call of ``rows`` rows padded to ``length`` columns, in forwarded tokens;
    ``real``: the call's real tokens, given where the model forwards a padded batch as its real tokens
    packed (``dllm.models.core.views.packed``: its padding costs next to nothing), which is then the cost."""
    return fixed + (rows * length if real is None else real)


def _runs(items: Sequence[F], max_rows: int, max_tokens: int) -> list[list[F]]:
    """Items sorted by length -> runs of equal length, each cut to fit one call alone."""
    runs: list[list[F]] = []
    for item in items:
        last = runs[-1] if runs else None
        if (last is not None and last[0].length == item.length
                and sum(i.rows for i in last) + item.rows <= max_rows
                and (sum(i.rows for i in last) + item.rows) * item.length <= max_tokens):
            last.append(item)
        else:
            runs.append([item])
    return runs


def plan_merges(items: Sequence[F], *, max_rows: int, max_tokens: int, fixed_cost: int,
                packed: bool = False) -> list[list[F]]:
    """The calls to run for ``items`` (pending forwards): unmergeable ones alone, in arrival order;
    the mergeable ones grouped by neighbouring lengths at the least modelled cost (``call_cost`` with
    ``fixed_cost``; ``packed``: a call costs its real tokens), each call within ``max_rows`` rows and
    ``max_tokens`` rows x padded length. A forward larger than the bounds runs alone."""
    alone = [[item] for item in items if not item.mergeable]
    merge = sorted((item for item in items if item.mergeable), key=lambda item: item.length)  # stable
    runs = _runs(merge, max_rows, max_tokens)
    n = len(runs)
    rows = [sum(i.rows for i in run) for run in runs]
    best = [0] + [None] * n  # best[k]: least cost of the first k runs
    cut = [0] * (n + 1)  # cut[k]: where the last call of that plan starts
    for k in range(1, n + 1):
        length, total, real = runs[k - 1][0].length, 0, 0  # the call's padded length: its longest run, the last
        for j in range(k - 1, -1, -1):
            total += rows[j]
            real += rows[j] * runs[j][0].length
            if j < k - 1 and (total > max_rows or total * length > max_tokens):
                break
            cost = best[j] + call_cost(total, length, fixed_cost, real if packed else None)
            if best[k] is None or cost < best[k]:
                best[k], cut[k] = cost, j
    calls: list[list[F]] = []
    k = n
    while k > 0:
        j = cut[k]
        calls.append([item for run in runs[j:k] for item in run])
        k = j
    return alone + calls[::-1]


def measure_call_cost(model: Any, shapes: tuple[tuple[int, int], tuple[int, int]] = ((1, 16), (8, 64)),
                      repeats: int = 3) -> int:
    """One call's cost beyond its tokens, in tokens, for ``model`` on its device: plain forwards of
    the two ``shapes`` (rows, columns) of mask tokens, each warmed up once and timed ``repeats``
    times (the fastest, the device synchronised: a process taking the core mid-run, as the servers
    ``dllm bench serve`` starts together do, only adds time), the line t = a + b x tokens through them, and a / b,
    rounded (0 when the fixed part measures negative; the largest forward's tokens x 64 when the
    per-token part does not, a call then costing what its tokens do not)."""
    device = model_device(model)
    mask = int(getattr(model, "mask_id", 0))

    def timed(rows: int, cols: int) -> float:
        ids = torch.full((rows, cols), mask, dtype=torch.long, device=device)
        times = []
        for i in range(repeats + 1):  # the first run warms up (allocations, kernels chosen)
            if device.type == "cuda":
                torch.cuda.synchronize(device)
            t0 = time.perf_counter()
            model(ids)
            if device.type == "cuda":
                torch.cuda.synchronize(device)
            if i:
                times.append(time.perf_counter() - t0)
        return min(times)

    (r1, c1), (r2, c2) = shapes
    n1, n2 = r1 * c1, r2 * c2
    if not 0 < n1 < n2:
        raise ValueError(f"shapes must be two (rows, columns) of growing size, got {shapes!r}")
    with torch.inference_mode():
        t1, t2 = timed(r1, c1), timed(r2, c2)
    per_token = (t2 - t1) / (n2 - n1)
    if per_token <= 0:
        return n2 * 64
    return max(0, round((t1 - per_token * n1) / per_token))


__all__ = ["call_cost", "measure_call_cost", "plan_merges"]
