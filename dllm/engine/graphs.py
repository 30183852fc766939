"""The cached forward as a static step: captured once per shape as a CUDA graph and replayed.

A cached decode step on a GPU is bound by launching its kernels from Python. ``generate(...,
cuda_graphs=True)`` runs every cached forward of a call (the query a cache policy computes against
the K/V buffers) through a ``StepGraphs``: each shape (rows, query length, attended keys, logits
rows) is captured with ``torch.cuda.CUDAGraph`` on static input buffers; every later forward of it
copies its inputs into those buffers and replays the graph (one launch). A shape is captured at its
second forward, not its first: the first runs the same static step eagerly, which is the warm-up a
capture needs (kernels chosen, ``auto`` attention probed, constants made), so no forward runs only to
warm up, and a shape that a call forwards once (the block-causal caches' last steps of a block, a
threshold step that fills a block) costs no capture at all. A block's place in
the canvas reaches the graph as data, never as a Python int: the query columns are a device tensor the
K/V write indexes with (``dllm.models.core.kv.StaticView``). With the dual cache the attended keys are the
whole canvas, so one graph serves every block of a call; the prefix cache captures once per block.

``cuda_graphs="static"`` runs the same static path eagerly (``EagerRunner``: the step function is
called again on replay), on any device: it is what the CPU tests compare with the ordinary path,
token for token. ``cuda_graphs="check"`` runs it eagerly too and traces every run
(``dllm.engine.graph_check.CheckedRunner``): each replay must issue the capture's operators on the same
external memory with the same Python scalars, and the capture must read nothing back to the host, else
``GraphReplayError`` says what a graph would have replayed wrong and where.

Verification variants of every row forwarded as one sequence per row (``StackedView``: ``lopa`` and
``fast`` with static shapes, ``compact=False``, as on CUDA; compacted, when every row is live, one
shape per variant count) are captured the same way (``variants``), with their columns as a device
tensor (``StaticStackedView``), on models without a block-causal mask and with an attention backend
that takes the stacked mask. Not captured (they run as before): every forward of a mixture-of-experts
model whose expert layers would read their counts back (``StepGraphs.refused`` says why), full forwards
(refreshes), forwards with released rows, with the policy's extra columns, with attention maps or
hidden states, other variant forwards and shadow blocks. A call captures at most ``MAX_GRAPHS``
shapes, variants included; later shapes run as before. Graphs live as long as the call (its K/V buffers
are the call's); ``state.extras[GRAPHS_KEY]`` reports the call's first runs, captures, replays and the
CUDA memory the captures reserved (``captured_bytes``: the growth of the graphs' private pool).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Optional, Union

import torch

from dllm.engine.graph_check import CheckedRunner
from dllm.models.core.kv import KVCache, StaticView
from dllm.models.core.layer.moe import experts_read_back
from dllm.models.core.views import StaticStackedView, grouped_backend

MAX_GRAPHS = 8  # captured shapes per generate call
MAX_SHAPES = 32  # shapes a call keeps static inputs for (seen once or captured); later ones run as before
GRAPHS_KEY = "step_graphs"  # DecodeState.extras: the call's StepGraphs (captures, replays), when on
GraphsOption = Union[bool, str]


def check_graphs_option(value: Any, device: torch.device) -> GraphsOption:
    """``cuda_graphs`` of ``generate``: False (eager), True (CUDA graphs; a CUDA model), "static", "check"."""
    if not (value is False or value is True or value in ("static", "check")):
        raise ValueError(f"cuda_graphs must be False, True, 'static' (the static step run eagerly) or 'check' (run "
                         f"eagerly, each replay checked against the capture), got {value!r}")
    if value is True and device.type != "cuda":
        raise ValueError(f"cuda_graphs=True captures CUDA graphs, but the model is on {device}; use "
                         f"cuda_graphs='static' for the same static step run eagerly, or False")
    return value


class EagerRunner:
    """``warm`` runs the step (its first use); ``capture`` runs it and keeps its output buffer;
    ``replay`` runs it again into that buffer."""

    def __init__(self) -> None:
        self._fn: Optional[Callable[[], torch.Tensor]] = None
        self.out: Optional[torch.Tensor] = None

    @staticmethod
    def warm(fn: Callable[[], torch.Tensor]) -> torch.Tensor:
        return fn()

    def capture(self, fn: Callable[[], torch.Tensor]) -> torch.Tensor:
        self._fn = fn
        self.out = fn()
        return self.out

    def replay(self) -> None:
        assert self._fn is not None and self.out is not None
        self.out.copy_(self._fn())


class CudaGraphRunner:
    """``warm``: a run of the step on the side stream ``stream`` (one per ``StepGraphs``: the caching
    allocator reuses a block only on the stream that freed it), the warm-up PyTorch asks for before a
    capture (kernels chosen, ``auto`` attention probed, workspaces made outside the capture); its output
    is the step's. ``capture`` records the step into a ``torch.cuda.CUDAGraph`` (after ``warmup`` warm
    runs when nothing warmed it) and runs it; ``replay`` replays it."""

    def __init__(self, pool: Any = None, stream: Optional[Any] = None, warmup: int = 2) -> None:
        self.graph = torch.cuda.CUDAGraph()
        self.pool, self.warmup = pool, warmup
        self.stream = stream if stream is not None else torch.cuda.Stream()
        self.out: Optional[torch.Tensor] = None
        self._warmed = False

    def warm(self, fn: Callable[[], torch.Tensor], runs: int = 1) -> torch.Tensor:
        """``fn()`` run ``runs`` times on the side stream; the last output, safe to read on the current one."""
        main, stream = torch.cuda.current_stream(), self.stream
        stream.wait_stream(main)
        with torch.cuda.stream(stream):
            for _ in range(runs):
                out = fn()
        main.wait_stream(stream)
        out.record_stream(main)  # made on the side stream, read on this one: not reused before that read
        self._warmed = True
        return out

    def capture(self, fn: Callable[[], torch.Tensor]) -> torch.Tensor:
        if not self._warmed:
            self.warm(fn, self.warmup)
        with torch.cuda.graph(self.graph, pool=self.pool):
            self.out = fn()
        self.graph.replay()  # capturing records the kernels without running them
        return self.out

    def replay(self) -> None:
        self.graph.replay()


@dataclass
class _Shape:
    runner: Any
    step: Callable[[], torch.Tensor]  # the static step: the model on the static inputs below
    x: torch.Tensor  # [R, T] static input ids
    positions: torch.Tensor  # [R, T]
    cols: torch.Tensor  # [T] canvas columns of the query rows
    base: torch.Tensor  # [T] arange(T): cols = base + start
    out: Optional[torch.Tensor] = None  # the logits the captured step writes; None until captured


class StepGraphs:
    """One generate call's captured cached forwards, keyed by shape (see the module docstring)."""

    def __init__(self, model: Any, kv: KVCache, mode: GraphsOption) -> None:
        self.model, self.kv, self.mode = model, kv, mode
        self._graphs: dict[tuple, _Shape] = {}  # every shape seen, captured or not
        self.refused: Optional[str] = self._refusal(model)  # why nothing of this call is captured, or None
        self.pool = torch.cuda.graph_pool_handle() if mode is True else None
        self.stream = torch.cuda.Stream() if mode is True else None  # every shape's warm runs
        self.first_runs = 0  # shapes' first forwards, run eagerly (the capture's warm-up)
        self.captures = 0
        self.replays = 0
        self.captured_bytes = 0  # CUDA memory the captures reserved (the graphs' pool grew by); 0 when eager

    def forward(self, x: torch.Tensor, positions: torch.Tensor, key_padding_mask: Optional[torch.Tensor],
                start: int, key_end: int, logits_rows: Optional[tuple[int, int]]) -> Optional[torch.Tensor]:
        """Logits of the cached forward of ``x`` [R, T] at canvas columns ``[start, start + T)`` against
        ``[0, key_end)``, or None when the shape cannot be captured (the caller runs it eagerly)."""
        key = (x.shape[0], x.shape[1], key_end, logits_rows, key_padding_mask is None)
        return self._run(key, x, positions, start, lambda cols: StaticView(self.kv, 0, key_end, None, cols),
                         key_padding_mask, logits_rows, x.shape[1])

    def variants(self, ids: torch.Tensor, positions: torch.Tensor, key_padding_mask: Optional[torch.Tensor],
                 select: torch.Tensor, group: int, start: int, key_end: int,
                 logits_rows: Optional[tuple[int, int]]) -> Optional[torch.Tensor]:
        """Logits of the stacked variant forward of ``ids`` [n, group * T] (every buffer row's ``group``
        variants, ``select`` the rows of the variants in runs) at canvas columns ``[start, start + T)``
        against ``[0, key_end)``, or None when it cannot be captured (the caller runs it eagerly)."""
        attn_fn = getattr(getattr(self.model, "transformer", None), "attn_fn", None)
        block_causal = getattr(getattr(self.model, "config", None), "block_causal", False)
        if block_causal or attn_fn is None or grouped_backend(attn_fn) is None:
            return None
        key = ("variants", ids.shape[0], ids.shape[1], group, key_end, logits_rows, key_padding_mask is None)
        return self._run(key, ids, positions, start,
                         lambda cols: StaticStackedView(self.kv, 0, key_end, None, select, group, every_row=True,
                                                        cols=cols),
                         key_padding_mask, logits_rows, ids.shape[1] // group)

    def _run(self, key: tuple, x: torch.Tensor, positions: torch.Tensor, start: int,
             make_view: Callable[[torch.Tensor], Any], key_padding_mask: Optional[torch.Tensor],
             logits_rows: Optional[tuple[int, int]], t: int) -> Optional[torch.Tensor]:
        """The logits of the static step of ``key`` on these inputs, its query columns ``[start, start +
        t)``: run eagerly at the shape's first forward, captured at its second, replayed after; None (the
        caller runs it as before) once ``MAX_GRAPHS`` shapes are captured or ``MAX_SHAPES`` seen."""
        entry = self._graphs.get(key)
        full = self.captures >= MAX_GRAPHS  # no room for another graph: new shapes run as before
        if entry is None:
            if full or len(self._graphs) >= MAX_SHAPES or self.refused is not None:
                return None
            entry = self._graphs[key] = self._static(x, positions, key_padding_mask, start, make_view, logits_rows, t)
            self.first_runs += 1
            return entry.runner.warm(entry.step)  # the step's own output: nothing static to copy
        if entry.out is None and full:
            return None
        entry.x.copy_(x)
        entry.positions.copy_(positions)
        torch.add(entry.base, start, out=entry.cols)
        if entry.out is not None:
            entry.runner.replay()
            self.replays += 1
        else:
            before = 0
            if self.mode is True:  # torch.cuda.graph empties the allocator's cache as it begins: so first here
                torch.cuda.empty_cache()
                before = torch.cuda.memory_reserved(x.device)
            entry.out = entry.runner.capture(entry.step)
            if self.mode is True:  # the private pool's new segments: what the graphs hold while the call runs
                self.captured_bytes += torch.cuda.memory_reserved(x.device) - before
            self.captures += 1
        return entry.out.clone()  # the next replay overwrites the static output; a sampler may keep this

    def _static(self, x: torch.Tensor, positions: torch.Tensor, key_padding_mask: Optional[torch.Tensor],
                start: int, make_view: Callable[[torch.Tensor], Any], logits_rows: Optional[tuple[int, int]],
                t: int) -> _Shape:
        """A shape's static inputs (copies of these) and its step function, not captured yet."""
        base = torch.arange(t, device=x.device)
        cols = base + start
        static_x, static_pos = x.clone(), positions.clone()
        kwargs: dict[str, Any] = {"positions": static_pos, "key_padding_mask": key_padding_mask}
        if logits_rows is not None:
            kwargs["logits_rows"] = logits_rows

        # key_padding_mask stays the first forward's object: a call's padding never changes (the key
        # records only whether there is one)
        def step() -> torch.Tensor:  # a view per run: it keeps what one forward derives (its masks)
            return self.model(static_x, cache=make_view(cols), **kwargs).logits

        runner: Any = (CudaGraphRunner(self.pool, self.stream) if self.mode is True else
                       CheckedRunner() if self.mode == "check" else EagerRunner())
        return _Shape(runner, step, static_x, static_pos, cols, base)

    @staticmethod
    def _refusal(model: Any) -> Optional[str]:
        """Why this model's forwards cannot be captured (they read a device value back), or None."""
        width = getattr(getattr(model, "config", None), "d_model", None)
        if width is None:
            return None
        with torch.inference_mode():  # as generate's forwards run (autograd off: the experts may stack)
            hidden = torch.empty(1, width, dtype=model.dtype, device=model.device)  # rows as the MoE layers get
            return experts_read_back(model, hidden)

    @property
    def shapes(self) -> int:
        """Shapes captured."""
        return sum(entry.out is not None for entry in self._graphs.values())


__all__ = ["GRAPHS_KEY", "CudaGraphRunner", "EagerRunner", "MAX_GRAPHS", "StepGraphs", "check_graphs_option"]
