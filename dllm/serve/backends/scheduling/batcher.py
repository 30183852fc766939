"""The running batch's forwards: many ``generate`` calls, one batched model forward per step.

Each running decode (one ``dllm.generate`` call on a group of requests that share settings and length,
often one request) runs as a greenlet on the scheduler's one thread (``dllm.serve.backends.scheduling.scheduler``),
with a ``BatchedModel`` as its model: a forward hands its inputs (a ``Pending``) to the loop and
switches back to it. Once every running decode has a forward pending, the loop groups the pending
forwards by neighbouring lengths (``plan_groups``; ``dllm.serve.backends.scheduling.packing``: padding against the
cost of one more call), left-pads each group to one length (explicit positions, key-padding mask: the
backend's own batching rule), runs it as one forward (``merged_forward``), and resumes every decode
with its own rows. A forward with a KV-cache
view, attention maps, hidden states or soft inputs (any keyword ``merged_forward`` does not read) is not
merged (its buffers belong to one call): it runs alone.
A request joins at its first forward and leaves after its last; nothing else is synchronised, so
rows at different blocks, steps, lengths and settings share forwards. The host reads the decodes
ask for in one round (streamed canvases) are likewise one copy (``read_together``).

Greedy requests decode to the tokens ``dllm.generate`` gives each prompt alone: the batch only
changes which rows share a matmul (float32: equal logits up to summation order, the same tolerance
as ``generate`` on a padded batch).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any, Optional, Union

import torch

from dllm.engine.forwards import takes_padded
from dllm.inputs import model_device
from dllm.models.inputs import ModelOutput, default_positions
from dllm.models.core.packed_rows import packs_tokens
from dllm.serve.backends.scheduling.packing import call_cost, measure_call_cost, plan_merges


@dataclass(frozen=True)
class BatcherConfig:
    max_rows: int = 64  # rows in one merged forward (a request's call may bring several: CFG, variants)
    max_tokens: int = 65536  # rows x padded length of one merged forward
    call_cost_tokens: Union[int, str] = 128  # one call's cost beyond its tokens, in tokens
    #   (dllm.serve.backends.scheduling.packing); "auto": measured for the served model when its loop starts
    packed: Optional[bool] = None  # whether a merged call costs its real tokens, not rows x padded length
    #   (the model forwards a padded batch's tokens packed: dllm.models.core.packed_rows.packs_tokens);
    #   None: asked of the served model when its loop starts

    def resolved(self, model) -> "BatcherConfig":
        """This config with ``call_cost_tokens="auto"`` measured for ``model`` (``measure_call_cost``)
        and ``packed=None`` asked of it."""
        out = self
        if self.call_cost_tokens == "auto":
            out = dataclasses.replace(out, call_cost_tokens=measure_call_cost(model))
        if self.packed is None:
            out = dataclasses.replace(out, packed=packs_tokens(model, model_device(model)))
        return out

    def __post_init__(self) -> None:
        for name in ("max_rows", "max_tokens", "call_cost_tokens"):
            if name == "call_cost_tokens" and self.call_cost_tokens == "auto":
                continue
            value = getattr(self, name)
            low = 0 if name == "call_cost_tokens" else 1
            if isinstance(value, bool) or not isinstance(value, int) or value < low:
                what = ' or "auto" (measured for the model)' if name == "call_cost_tokens" else ""
                raise ValueError(f"{name} must be an integer >= {low}{what}, got {value!r}")


MERGED_KWARGS = frozenset({"positions", "key_padding_mask", "logits_rows", "padded"})  # what merged_forward reads


@dataclass
class Pending:
    """One caller's forward: its arguments, then its result (or error). ``method`` "yield": no forward,
    a turn handed back to the loop (``Scheduler.yield_turn``)."""

    input_ids: Optional[torch.Tensor]  # [b, T] (None for a yield)
    kwargs: dict[str, Any]
    method: str = "forward"
    result: Any = None
    error: Optional[BaseException] = None

    @property
    def mergeable(self) -> bool:
        """A plain forward ``merged_forward`` can serve: every keyword it is given is one that
        ``merged_forward`` reads (``MERGED_KWARGS``) or unset (None, empty, False). Any other (a KV-cache
        view, attention maps or hidden states, soft inputs) belongs to this call alone: it runs alone."""
        kw = self.kwargs
        return (self.method == "forward"
                and all(name in MERGED_KWARGS or value is None or value is False or
                        (isinstance(value, (tuple, list)) and not value) for name, value in kw.items())
                and not (kw.get("positions") is None and kw.get("key_padding_mask") is not None))

    @property
    def rows(self) -> int:
        return int(self.input_ids.shape[0])

    @property
    def length(self) -> int:
        return int(self.input_ids.shape[1])


def plan_groups(items: list[Pending], config: BatcherConfig) -> list[list[Pending]]:
    """Pending forwards -> the calls to run (``dllm.serve.backends.scheduling.packing.plan_merges``): mergeable
    ones grouped by neighbouring lengths at the least modelled cost, under the row and token bounds;
    the others one by one."""
    return plan_merges(items, max_rows=config.max_rows, max_tokens=config.max_tokens,
                       fixed_cost=config.call_cost_tokens, packed=bool(config.packed))


def split_rows(lengths: list[int], config: BatcherConfig) -> list[list[int]]:
    """A running decode's rows (``dllm.engine.running``; their forward lengths, in row order) -> the
    calls its step makes: runs of consecutive rows at the least cost of the loop's own model
    (``packing.call_cost``: the call cost plus rows x the run's longest length), each within the row
    and token bounds of one call (a row alone may exceed them)."""
    n = len(lengths)
    best: list[Optional[int]] = [0] + [None] * n  # best[k]: least cost of the first k rows
    cut = [0] * (n + 1)  # cut[k]: where the last run of that plan starts
    for k in range(1, n + 1):
        longest = real = 0
        for j in range(k - 1, -1, -1):
            longest, rows = max(longest, lengths[j]), k - j
            if j < k - 1 and (rows > config.max_rows or rows * longest > config.max_tokens):
                break
            real += lengths[j]
            cost = best[j] + call_cost(rows, longest, config.call_cost_tokens, real if config.packed else None)
            if best[k] is None or cost <= best[k]:  # equal costs: the longer run, fewer calls
                best[k], cut[k] = cost, j
    runs, k = [], n
    while k > 0:
        runs.append(list(range(cut[k], k)))
        k = cut[k]
    return runs[::-1]


def merged_forward(model, items: list[Pending]) -> list[ModelOutput]:
    """One forward for several callers' plain forwards (no cache): each left-padded to the longest,
    with explicit positions and a key-padding mask; each gets its own logits back, sliced to the
    rows it asked for (``logits_rows``)."""
    t_max = max(item.length for item in items)
    shift = int(getattr(model, "logit_shift", 0))
    ragged = any(item.length != t_max for item in items)  # left-padded here: the mask has padding
    padded = ragged or any(item.kwargs.get("key_padding_mask") is not None for item in items)
    pad = torch.nn.functional.pad
    ids, pos, kpm, spans = [], [], [], []
    for item in items:
        x = item.input_ids  # [b, T]
        b, t = x.shape
        o = t_max - t  # left padding (none: the inputs as they are)
        p = item.kwargs.get("positions")
        p = default_positions(x, None) if p is None else p.expand(b, t)
        ids.append(pad(x, (o, 0), value=int(getattr(model, "mask_id", 0))) if o else x)
        pos.append(pad(p, (o, 0), value=0) if o else p)
        if padded:  # the mask only when some row has padding
            m = item.kwargs.get("key_padding_mask")
            m = torch.ones_like(x, dtype=torch.bool) if m is None else m
            kpm.append(pad(m, (o, 0), value=False) if o else m)
        asked = item.kwargs.get("logits_rows")
        a, e = (shift, t) if asked is None else (int(asked[0]), int(asked[1]))
        spans.append((a + o, e + o, asked is None))
    lo = min(s[0] for s in spans)
    hi = max(s[1] for s in spans)
    out = model(torch.cat(ids), positions=torch.cat(pos), key_padding_mask=torch.cat(kpm) if padded else None,
                logits_rows=(lo, hi), **({"padded": True} if ragged and takes_padded(model) else {}))  # known here
    logits = out.logits  # [R, hi - lo, V]
    results, r0 = [], 0
    for item, (a, e, whole) in zip(items, spans):
        rows = logits[r0:r0 + item.rows, a - lo:e - lo]
        if whole and shift:  # a full forward of a shifted family: row 0 predicts nothing; keep [b, T, V]
            rows = torch.cat([rows[:, :1], rows], dim=1)
        results.append(ModelOutput(rows))
        r0 += item.rows
    return results


def read_together(items: list[Pending]) -> None:
    """Every ``read`` item's tensors in one device-to-host copy (cast to long, flattened, joined):
    each item's ``result`` is its tensors as nested lists, in order."""
    try:
        tensors = [t for item in items for t in item.kwargs["tensors"]]
        host = torch.cat([t.reshape(-1).long() for t in tensors]).tolist()  # the round's one read
        at = 0
        for item in items:
            item.result = []
            for t in item.kwargs["tensors"]:
                n = t.numel()
                flat = host[at:at + n]
                at += n
                width = t.shape[-1] if t.dim() == 2 else n
                item.result.append(flat if t.dim() == 1 else [flat[r:r + width] for r in range(0, n, width)])
    except BaseException as err:  # noqa: BLE001 - handed to the groups, which raise it
        for item in items:
            item.error = err


class BatchedModel:
    """What a decode's ``generate`` sees as the model: every attribute is the real model's, and every
    forward (``__call__``, ``forward``, ``shadow_forward``) goes through the step loop."""

    _forwarding = ("shadow_forward",)

    def __init__(self, model, scheduler) -> None:
        object.__setattr__(self, "_model", model)
        object.__setattr__(self, "_scheduler", scheduler)  # dllm.serve.backends.scheduling.scheduler.Scheduler

    def __call__(self, input_ids: torch.Tensor, **kwargs: Any) -> ModelOutput:
        return self._scheduler.call("forward", input_ids, kwargs)

    forward = __call__

    def __getattr__(self, name: str) -> Any:
        if name in self._forwarding:
            scheduler = self._scheduler
            return lambda input_ids, **kw: scheduler.call(name, input_ids, kw)
        return getattr(self._model, name)

    def __setattr__(self, name: str, value: Any) -> None:
        raise AttributeError(f"a served model is shared; set {name!r} on the backend's model before serving")


__all__ = ["BatcherConfig", "BatchedModel", "Pending", "merged_forward", "plan_groups", "read_together", "split_rows"]
