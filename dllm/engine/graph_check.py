"""Whether a captured step would replay right: the checks a CUDA graph makes no room for, on any device.

A CUDA graph records a step's kernels once and replays them: every replay reads the same memory and the
same scalar arguments the capture saw, and nothing of the Python that issued them runs again. A step is
replayable when each run issues the same operators, on the same external memory (weights, K/V buffers,
the static inputs), with the same Python scalars (sizes, slice bounds, kernel arguments), and reads
nothing back to the host. ``cuda_graphs="check"`` of ``generate`` runs the static step eagerly as
``"static"`` does, and ``CheckedRunner`` traces each run under a dispatch mode: the capture's trace is
kept, and every replay's trace must equal it, else ``GraphReplayError`` names the first operator that
differs, what differs and where it was issued. The capture itself is refused if it reads a device value
back (``item``, ``nonzero``, boolean-mask indexing, ...: a sync that a capture cannot hold). So the CPU
tests show what only a GPU could otherwise: that the captured forward of every family, cache and sampler
would replay the eager tokens.

A tensor is *internal* when an operator of the same run made its storage (the graph's pool holds it, its
address may differ from run to run: only its shape, strides and dtype are compared) and *external*
otherwise (its address is compared). As ``CudaGraphRunner`` does, ``CheckedRunner`` runs the step once
before tracing it, so that constants made lazily on first use are external to every traced run. Triton
launches of ``dllm.kernels`` are traced as one entry (their grid, scalars and tensors), not as the torch
operators the interpreter runs for them.
"""

from __future__ import annotations

import os
import sys
from dataclasses import dataclass
from typing import Any, Callable, Optional

import torch
from torch.overrides import TorchFunctionMode
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_leaves

from dllm.kernels.triton import launch

# operators whose result is read back to the host or sized by the data (not capturable); bincount and histc
# read their range back on CUDA, below the dispatcher, where a mode does not see it (so does multinomial,
# below, for one sample or none replaced: its sanity checks of the probabilities)
HOST_READS = frozenset({"item", "_local_scalar_dense", "nonzero", "masked_select", "unique", "_unique", "_unique2",
                        "unique_consecutive", "unique_dim", "equal", "is_nonzero", "allclose", "masked_scatter_",
                        "argwhere", "nonzero_static_host", "bincount", "histc"})
_INDEX_PUTS = ("index_put", "index_put_", "_index_put_impl_")
PYTHON_READS = ("tolist", "numpy", "__array__")  # Tensor methods that read a device tensor back, not dispatched
_HERE = os.path.abspath(__file__)
_LAUNCH = os.path.abspath(launch.__file__)
_TORCH = os.path.dirname(os.path.abspath(torch.__file__))


def op_name(func: Any) -> str:
    """``aten.mm.default`` -> ``mm``."""
    return getattr(func, "__name__", str(func)).split(".")[0]


def is_host_read(func: Any, args: tuple, kwargs: Optional[dict] = None) -> bool:
    """An operator that reads a device value back to the host, or whose result's size depends on one."""
    name = op_name(func)
    kwargs = kwargs or {}
    if name == "index" or name in _INDEX_PUTS:  # a boolean mask: the positions are found by a nonzero,
        indices = args[1] if len(args) > 1 else ()  # whose size is read back
        if not any(isinstance(i, torch.Tensor) and i.dtype == torch.bool for i in indices or ()):
            return False
        if name in _INDEX_PUTS:  # x[mask] = one value: CUDA runs it as a masked_fill (no read)
            value = args[2] if len(args) > 2 else kwargs.get("values")
            accumulate = args[3] if len(args) > 3 else kwargs.get("accumulate", False)
            one = isinstance(value, torch.Tensor) and value.numel() == 1
            return not (len(indices) == 1 and one and not accumulate)
        return True
    if name == "multinomial":  # aten's fast path checks the probabilities on the host first
        samples = args[1] if len(args) > 1 else kwargs.get("num_samples", 1)
        replacement = args[2] if len(args) > 2 else kwargs.get("replacement", False)
        return samples == 1 or not replacement
    if name == "repeat_interleave":  # repeats as a tensor: the result's size is read back, unless given
        return (getattr(func, "_overloadname", "") in ("Tensor", "self_Tensor")
                and kwargs.get("output_size") is None)
    return name in HOST_READS


def issued_at(*skip: str) -> str:
    """``path:line`` of the innermost frame outside torch, contextlib, this file, the launch wrapper and
    the files ``skip`` (absolute paths): where an operator was issued. The path from ``dllm/`` for the
    package's files, else relative to the working directory (the file's name when outside it)."""
    skipped = {_HERE, _LAUNCH, *skip}
    frame = sys._getframe(1)
    while frame is not None:
        path = os.path.abspath(frame.f_code.co_filename)
        if path not in skipped and not path.startswith(_TORCH) and "/contextlib.py" not in path:
            root = path.rfind("/dllm/")
            if root >= 0:
                short = path[root + 1:]
            else:
                rel = os.path.relpath(path)
                short = os.path.basename(path) if rel.startswith("..") else rel
            return f"{short}:{frame.f_lineno}"
        frame = frame.f_back
    return "?"


class GraphReplayError(RuntimeError):
    """A replay of a captured step would not do what the eager step does (or the capture cannot hold it)."""


@dataclass(frozen=True)
class Entry:
    """One operator of a traced run: its name, the description of each argument, where it was issued."""

    op: str
    args: tuple
    where: str


class _Tracer(TorchDispatchMode):
    """Records the operators of one run (``Entry`` list); refuses host reads."""

    def __init__(self) -> None:
        super().__init__()
        self.entries: list[Entry] = []
        self._made: set[int] = set()  # storages an operator of this run allocated
        self._external: set[int] = set()  # storages read before this run made them: not internal
        self._in_launch = 0

    def describe(self, x: Any) -> Any:
        if isinstance(x, torch.Tensor):
            key = x.untyped_storage().data_ptr()
            layout = (tuple(x.shape), tuple(x.stride()), x.dtype, str(x.device))
            if key in self._made:
                return ("internal", *layout)
            self._external.add(key)
            return ("external", x.data_ptr(), *layout)
        if isinstance(x, float):
            return ("float", repr(x))  # nan == nan, -0.0 != 0.0
        if isinstance(x, (int, bool, str, type(None), torch.dtype, torch.device, torch.memory_format, torch.layout)):
            return x
        if isinstance(x, (list, tuple)):
            return tuple(self.describe(i) for i in x)
        return type(x).__name__  # another object: only its kind is compared

    def record(self, op: str, args: tuple, kwargs: dict) -> None:
        described = tuple(self.describe(a) for a in args) + tuple((k, self.describe(v)) for k, v in
                                                                   sorted(kwargs.items()))
        self.entries.append(Entry(op, described, issued_at()))

    def made(self, out: Any) -> None:
        for t in tree_leaves(out):
            if isinstance(t, torch.Tensor):
                key = t.untyped_storage().data_ptr()
                if key not in self._external:  # a view of an external tensor stays external
                    self._made.add(key)

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if self._in_launch:  # the interpreter's own operators inside a Triton launch
            return func(*args, **kwargs)
        if is_host_read(func, args, kwargs):
            raise GraphReplayError(f"the captured step reads a device value back to the host "
                                   f"({op_name(func)} at {issued_at()}): a CUDA graph cannot capture it")
        if op_name(func) == "lift_fresh" and isinstance(args[0], torch.Tensor):  # a tensor made of Python data
            if args[0].dim() != 0:
                raise GraphReplayError(f"the captured step makes a tensor of Python data (torch.tensor at "
                                       f"{issued_at()}): on CUDA an upload from host memory, which a graph "
                                       f"cannot capture; make it once outside the step")
            self.entries.append(Entry("constant", (args[0].dtype, repr(args[0].item())), issued_at()))
            out = func(*args, **kwargs)  # a Python scalar wrapped (x[i] = 0.0): a constant of the kernel
            self.made(out)
            return out
        self.record(str(func), args, kwargs)
        out = func(*args, **kwargs)
        self.made(out)
        return out

    # dllm.kernels.triton.launch observer
    def launch_begins(self, name: str) -> None:
        self._in_launch += 1

    def launch_called(self, name: str, grid: Any, args: tuple, kwargs: dict) -> None:
        if self._in_launch == 1:
            self.record(f"triton:{name}", (grid if not callable(grid) else "grid()", *args), kwargs)

    def launch_ends(self, name: str) -> None:
        self._in_launch -= 1


class _PythonReads(TorchFunctionMode):
    """Refuses the reads of a device tensor that bypass the dispatcher (``Tensor.tolist``, ``.numpy``,
    ``numpy.asarray``'s ``__array__``)."""

    def __torch_function__(self, func, types, args=(), kwargs=None):
        if getattr(func, "__name__", "") in PYTHON_READS and args and isinstance(args[0], torch.Tensor):
            raise GraphReplayError(f"the captured step reads a device value back to the host (Tensor."
                                   f"{func.__name__} at {issued_at()}): a CUDA graph cannot capture it")
        return func(*args, **(kwargs or {}))


def traced(fn: Callable[[], Any]) -> tuple[Any, list[Entry]]:
    """``fn()`` and the entries of its operators (``_Tracer``)."""
    tracer = _Tracer()
    launch.LAUNCH_OBSERVERS.append(tracer)
    try:
        with _PythonReads(), tracer:
            out = fn()
    finally:
        launch.LAUNCH_OBSERVERS.remove(tracer)
    return out, tracer.entries


def first_difference(captured: list[Entry], replayed: list[Entry]) -> Optional[str]:
    """None when the replay issued what the capture did, else what differs first."""
    for i, (a, b) in enumerate(zip(captured, replayed)):
        if a.op != b.op:
            return (f"operator {i}: the capture issued {a.op} at {a.where}, the replay {b.op} at {b.where} "
                    f"(the step's Python took another path)")
        if a.args != b.args:
            j = next((j for j, (x, y) in enumerate(zip(a.args, b.args)) if x != y), min(len(a.args), len(b.args)))
            x = a.args[j] if j < len(a.args) else "-"
            y = b.args[j] if j < len(b.args) else "-"
            return (f"operator {i} ({a.op} at {b.where}), argument {j}: captured {x!r}, replayed {y!r} "
                    f"(a graph replays the capture's memory and scalars)")
    if len(captured) != len(replayed):
        return (f"the capture issued {len(captured)} operators, the replay {len(replayed)} "
                f"(the step's Python took another path)")
    return None


class CheckedRunner:
    """``cuda_graphs="check"``: runs the step untraced at ``warm`` (its first use, the warm-up of
    ``CudaGraphRunner``: lazily made constants exist before the traced runs; ``capture`` runs it so first
    when nothing warmed it), traced at ``capture``, then at each ``replay`` traced again against the
    capture's trace."""

    def __init__(self) -> None:
        self._fn: Optional[Callable[[], torch.Tensor]] = None
        self.out: Optional[torch.Tensor] = None
        self.trace: list[Entry] = []
        self.replays = 0
        self._warmed = False

    def warm(self, fn: Callable[[], torch.Tensor]) -> torch.Tensor:
        self._warmed = True
        return fn()

    def capture(self, fn: Callable[[], torch.Tensor]) -> torch.Tensor:
        self._fn = fn
        if not self._warmed:
            self.warm(fn)
        self.out, self.trace = traced(fn)
        return self.out

    def replay(self) -> None:
        assert self._fn is not None and self.out is not None
        out, trace = traced(self._fn)
        wrong = first_difference(self.trace, trace)
        if wrong is not None:
            raise GraphReplayError(f"a CUDA graph of this step would not replay it: {wrong}")
        self.out.copy_(out)
        self.replays += 1


__all__ = ["CheckedRunner", "Entry", "GraphReplayError", "HOST_READS", "PYTHON_READS", "first_difference",
           "is_host_read", "issued_at", "op_name", "traced"]
