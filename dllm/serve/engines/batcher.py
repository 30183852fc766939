"""Continuous batching by forwards: many ``generate`` calls, one batched model forward per step.

Each running request decodes in its own thread with the real ``dllm.generate`` on its prompt alone;
the model it is given is a ``BatchedModel``, whose forwards go to one ``ForwardBatcher``. The
batcher's thread waits until every running request has a forward pending (or ``max_wait_s``
passed), left-pads the pending forwards to one length (explicit positions, key-padding mask: the
engine's own batching rule) and runs them as one forward, then hands each caller its rows.

A forward with a KV-cache view, attention maps or hidden states is not merged (its buffers belong to
one call): it runs alone, on the same thread, so the model is only ever used from one thread. A
request joins at its first forward and leaves after its last; nothing else is synchronised, so rows
at different blocks, steps, lengths and settings share forwards.

Greedy requests decode to the tokens ``dllm.generate`` gives each prompt alone: the batch only
changes which rows share a matmul (float32: equal logits up to summation order, the same tolerance
as ``generate`` on a padded batch).
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass, field
from typing import Any, Callable, Optional

import torch

from dllm.models.base import ModelOutput, default_positions


@dataclass(frozen=True)
class BatcherConfig:
    max_rows: int = 64  # rows in one merged forward (a request's call may bring several: CFG, variants)
    max_tokens: int = 65536  # rows x padded length of one merged forward
    max_wait_s: float = 0.05  # the longest the first pending forward waits for the other running rows


@dataclass
class _Pending:
    """One caller's forward: its arguments, then its result (or error)."""

    input_ids: torch.Tensor  # [b, T]
    kwargs: dict[str, Any]
    method: str = "forward"
    done: threading.Event = field(default_factory=threading.Event)
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


class ForwardBatcher:
    """Owns the model; runs every forward of the registered callers on its one thread."""

    def __init__(self, model, config: BatcherConfig = BatcherConfig()) -> None:
        self.model, self.config = model, config
        self._cond = threading.Condition()
        self._pending: list[_Pending] = []
        self._callers = 0  # requests inside generate (registered), each waiting or about to forward
        self._closed = False
        self.forwards = 0  # model calls run (merged ones count once)
        self.forwarded_rows = 0  # rows summed over those calls
        self.merged_calls = 0  # caller forwards served by merged calls
        self._thread = threading.Thread(target=self._run, name="dllm-forward-batcher", daemon=True)
        self._thread.start()

    # ---- callers ----
    def register(self) -> None:
        with self._cond:
            self._callers += 1

    def unregister(self) -> None:
        with self._cond:
            self._callers -= 1
            self._cond.notify_all()  # the others may now be all there is

    def call(self, method: str, input_ids: torch.Tensor, kwargs: dict[str, Any]) -> Any:
        item = _Pending(input_ids, kwargs, method)
        with self._cond:
            if self._closed:
                raise RuntimeError("the forward batcher is closed")
            self._pending.append(item)
            self._cond.notify_all()
        item.done.wait()
        if item.error is not None:
            raise item.error
        return item.result

    def close(self) -> None:
        with self._cond:
            self._closed = True
            self._cond.notify_all()
        self._thread.join(timeout=5)

    # ---- the batcher thread ----
    def _take(self) -> Optional[list[_Pending]]:
        """Wait for work; return the forwards to run now (None: closed and idle)."""
        with self._cond:
            while not self._pending:
                if self._closed:
                    return None
                self._cond.wait()
            deadline = time.monotonic() + self.config.max_wait_s
            while len(self._pending) < self._callers and not self._closed:
                left = deadline - time.monotonic()
                if left <= 0:
                    break
                self._cond.wait(timeout=left)
            taken, self._pending = self._pending, []
            return taken

    def _run(self) -> None:
        with torch.inference_mode():
            while True:
                taken = self._take()
                if taken is None:
                    return
                for group in plan_groups(taken, self.config):
                    self._execute(group)

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
        except BaseException as err:  # noqa: BLE001 - handed to the callers, who raise it
            for item in group:
                item.error = err
        for item in group:
            item.done.set()


def plan_groups(items: list[_Pending], config: BatcherConfig) -> list[list[_Pending]]:
    """Pending forwards -> the calls to run: mergeable ones packed greedily, in arrival order, under
    the row and token bounds; the others one by one."""
    groups: list[list[_Pending]] = []
    current: list[_Pending] = []
    rows = longest = 0
    for item in items:
        if not item.mergeable:
            groups.append([item])
            continue
        r, t = rows + item.rows, max(longest, item.length)
        if current and (r > config.max_rows or r * t > config.max_tokens):
            groups.append(current)
            current, r, t = [], item.rows, item.length
        current.append(item)
        rows, longest = r, t
    if current:
        groups.append(current)
    return groups


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
    out = model(torch.cat(ids), positions=torch.cat(pos), key_padding_mask=torch.cat(kpm), logits_rows=(lo, hi))
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
    """What a request's ``generate`` sees as the model: every attribute is the real model's, and every
    forward (``__call__``, ``forward``, ``shadow_forward``) runs on the batcher's thread."""

    _forwarding = ("shadow_forward",)

    def __init__(self, model, batcher: ForwardBatcher) -> None:
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


def run_registered(batcher: ForwardBatcher, fn: Callable[[], Any]) -> Any:
    """Run ``fn`` (one request's decode) as a registered caller of ``batcher``."""
    batcher.register()
    try:
        return fn()
    finally:
        batcher.unregister()


__all__ = ["BatcherConfig", "BatchedModel", "ForwardBatcher", "merged_forward", "plan_groups", "run_registered"]
