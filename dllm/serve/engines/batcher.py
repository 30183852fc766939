"""Continuous batching by forwards: many ``generate`` calls, one batched model forward per step.

Each running decode (one ``dllm.generate`` call on a group of requests that share settings and length,
often one request) runs as a greenlet on the ``StepLoop``'s one thread, with a ``BatchedModel`` as its
model: a forward hands its inputs to the loop and switches back to it. Once every running decode has
a forward pending (they all have, by construction: the loop resumes each in turn until it asks for
its next forward or ends), the loop groups the pending forwards by neighbouring lengths
(``dllm.serve.engines.packing``: padding against the cost of one more call), left-pads each group to
one length (explicit positions, key-padding mask: the engine's own batching rule), runs it as one
forward, and resumes every decode with its own rows. New decodes start between two such steps.

One thread runs the model and every decode's Python, so there is no lock handoff between a forward
and the samplers' work, and the model is only ever used from one thread. A forward with a KV-cache
view, attention maps or hidden states is not merged (its buffers belong to one call): it runs alone.
A request joins at its first forward and leaves after its last; nothing else is synchronised, so
rows at different blocks, steps, lengths and settings share forwards.

Greedy requests decode to the tokens ``dllm.generate`` gives each prompt alone: the batch only
changes which rows share a matmul (float32: equal logits up to summation order, the same tolerance
as ``generate`` on a padded batch).
"""

from __future__ import annotations

import threading
from dataclasses import dataclass
from typing import Any, Callable, Optional

import greenlet
import torch

from dllm.models.base import ModelOutput, default_positions
from dllm.serve.engines.packing import plan_merges


@dataclass(frozen=True)
class BatcherConfig:
    max_rows: int = 64  # rows in one merged forward (a request's call may bring several: CFG, variants)
    max_tokens: int = 65536  # rows x padded length of one merged forward
    call_cost_tokens: int = 128  # one call's cost beyond its tokens, in tokens (dllm.serve.engines.packing)

    def __post_init__(self) -> None:
        for name in ("max_rows", "max_tokens", "call_cost_tokens"):
            value = getattr(self, name)
            low = 0 if name == "call_cost_tokens" else 1
            if isinstance(value, bool) or not isinstance(value, int) or value < low:
                raise ValueError(f"{name} must be an integer >= {low}, got {value!r}")


@dataclass
class _Pending:
    """One caller's forward: its arguments, then its result (or error)."""

    input_ids: torch.Tensor  # [b, T]
    kwargs: dict[str, Any]
    method: str = "forward"
    result: Any = None
    error: Optional[BaseException] = None

    @property
    def mergeable(self) -> bool:
        kw = self.kwargs
        return (self.method == "forward" and kw.get("cache") is None and not kw.get("want_attn_layers")
                and not kw.get("want_hidden_layers")
                and not (kw.get("positions") is None and kw.get("key_padding_mask") is not None))

    @property
    def rows(self) -> int:
        return int(self.input_ids.shape[0])

    @property
    def length(self) -> int:
        return int(self.input_ids.shape[1])


class StepLoop:
    """Owns the model; runs the decodes that ``admit`` hands it as greenlets on its one thread.

    ``admit(wait)`` returns the next decode to start (a callable run in its own greenlet), or ``[]``
    when none can start now (``wait``: block until one can), or None when the engine is closed and has
    nothing left; the loop ends once that is so and no decode runs."""

    def __init__(self, model, config: BatcherConfig, admit: Callable[[bool], Any]) -> None:
        self.model, self.config, self._admit = model, config, admit
        self._main: Any = None  # the loop thread's own greenlet
        self.forwards = 0  # model calls run (merged ones count once)
        self.forwarded_rows = 0  # rows summed over those calls
        self.merged_calls = 0  # decode forwards served by merged calls
        self._thread = threading.Thread(target=self._run, name="dllm-step-loop", daemon=True)
        self._thread.start()

    def call(self, method: str, input_ids: torch.Tensor, kwargs: dict[str, Any]) -> Any:
        """A decode's forward: hand it to the loop, resume with its result."""
        item = _Pending(input_ids, kwargs, method)
        if self._main is None or greenlet.getcurrent().parent is not self._main:
            raise RuntimeError("a served model's forward runs only inside a decode of the engine's step loop "
                               "(submit a request to the engine; for a forward of your own use the model itself)")
        self._main.switch(item)
        if item.error is not None:
            raise item.error
        return item.result

    def join(self, timeout: Optional[float] = None) -> None:
        self._thread.join(timeout=timeout)

    # ---- the loop thread ----
    def _run(self) -> None:
        self._main = greenlet.getcurrent()
        pending: list[tuple[_Pending, Any]] = []
        live = 0
        with torch.inference_mode():  # held for the loop's life: the decodes' own guards nest inside it
            while True:
                while True:  # start what can start (block only when nothing runs)
                    start = self._admit(live == 0 and not pending)
                    if not start:
                        break
                    live += self._resume(greenlet.greenlet(start), None, pending, first=True)
                if start is None and live == 0:
                    return
                if not pending:
                    continue
                taken, pending = pending, []
                for group in plan_groups([item for item, _ in taken], self.config):
                    self._execute(group)
                for item, decode in taken:
                    live += self._resume(decode, item, pending) - 1

    @staticmethod
    def _resume(decode: Any, value: Any, pending: list, first: bool = False) -> int:
        """Run ``decode`` until its next forward (queued in ``pending``) or its end; 1 if it still runs.
        A decode ends its jobs itself (Done or Failed, ``ThreadedEngine._serve_group``); an error that
        escapes it anyway ends only that decode, never the loop."""
        try:
            item = decode.switch() if first else decode.switch(value)
        except BaseException:  # noqa: BLE001
            return 0
        if decode.dead:
            return 0
        pending.append((item, decode))
        return 1

    def _execute(self, group: list[_Pending]) -> None:
        try:
            if len(group) == 1:
                item = group[0]
                fn = self.model if item.method == "forward" else getattr(self.model, item.method)
                item.result = fn(item.input_ids, **item.kwargs)
                rows = item.rows
            else:
                outputs = merged_forward(self.model, group)
                for item, out in zip(group, outputs):
                    item.result = out
                rows = sum(item.rows for item in group)
                self.merged_calls += len(group)
            self.forwards += 1
            self.forwarded_rows += rows
        except BaseException as err:  # noqa: BLE001 - handed to the decodes, which raise it
            for item in group:
                item.error = err


def plan_groups(items: list[_Pending], config: BatcherConfig) -> list[list[_Pending]]:
    """Pending forwards -> the calls to run (``dllm.serve.engines.packing.plan_merges``): mergeable
    ones grouped by neighbouring lengths at the least modelled cost, under the row and token bounds;
    the others one by one."""
    return plan_merges(items, max_rows=config.max_rows, max_tokens=config.max_tokens,
                       fixed_cost=config.call_cost_tokens)


def merged_forward(model, items: list[_Pending]) -> list[ModelOutput]:
    """One forward for several callers' plain forwards (no cache): each left-padded to the longest,
    with explicit positions and a key-padding mask; each gets its own logits back, sliced to the
    rows it asked for (``logits_rows``)."""
    t_max = max(item.length for item in items)
    shift = int(getattr(model, "logit_shift", 0))
    ids, pos, kpm, spans = [], [], [], []
    for item in items:
        x = item.input_ids  # [b, T]
        b, t = x.shape
        o = t_max - t  # left padding
        p = item.kwargs.get("positions")
        m = item.kwargs.get("key_padding_mask")
        p = default_positions(x, None) if p is None else p.expand(b, t)
        m = torch.ones_like(x, dtype=torch.bool) if m is None else m
        ids.append(torch.nn.functional.pad(x, (o, 0), value=int(getattr(model, "mask_id", 0))))
        pos.append(torch.nn.functional.pad(p, (o, 0), value=0))
        kpm.append(torch.nn.functional.pad(m, (o, 0), value=False))
        asked = item.kwargs.get("logits_rows")
        a, e = (shift, t) if asked is None else (int(asked[0]), int(asked[1]))
        spans.append((a + o, e + o, asked is None))
    lo = min(s[0] for s in spans)
    hi = max(s[1] for s in spans)
    padded = any(item.length != t_max or item.kwargs.get("key_padding_mask") is not None for item in items)
    out = model(torch.cat(ids), positions=torch.cat(pos), key_padding_mask=torch.cat(kpm) if padded else None,
                logits_rows=(lo, hi))  # None: no padding, known here without reading the mask back
    logits = out.logits  # [R, hi - lo, V]
    results, r0 = [], 0
    for item, (a, e, whole) in zip(items, spans):
        rows = logits[r0:r0 + item.rows, a - lo:e - lo]
        if whole and shift:  # a full forward of a shifted family: row 0 predicts nothing; keep [b, T, V]
            rows = torch.cat([rows[:, :1], rows], dim=1)
        results.append(ModelOutput(rows))
        r0 += item.rows
    return results


class BatchedModel:
    """What a decode's ``generate`` sees as the model: every attribute is the real model's, and every
    forward (``__call__``, ``forward``, ``shadow_forward``) goes through the step loop."""

    _forwarding = ("shadow_forward",)

    def __init__(self, model, batcher: StepLoop) -> None:
        self.__dict__["_model"] = model
        self.__dict__["_batcher"] = batcher

    def __call__(self, input_ids: torch.Tensor, **kwargs: Any) -> ModelOutput:
        return self._batcher.call("forward", input_ids, kwargs)

    forward = __call__

    def __getattr__(self, name: str) -> Any:
        if name in self._forwarding:
            batcher = self._batcher
            return lambda input_ids, **kw: batcher.call(name, input_ids, kw)
        return getattr(self._model, name)

    def __setattr__(self, name: str, value: Any) -> None:
        raise AttributeError(f"a served model is shared; set {name!r} on the engine's model before serving")


__all__ = ["BatcherConfig", "BatchedModel", "StepLoop", "merged_forward", "plan_groups"]
