"""What a decode step would launch on a GPU, counted on any device: ATen calls, kernel-like ops and
host syncs, per transformer layer and per step, with the code line of every sync.

On a GPU a small forward is nearly free and a step is bound by what Python issues: every ATen call
costs host time, every op that is not a view launches a kernel, and every read of a device value
(``.item()``, ``.tolist()``, ``bool(t)``, ``nonzero``, boolean-mask indexing, ``torch.tensor`` of a
Python list) stalls the stream. ``torch.utils._python_dispatch.TorchDispatchMode`` sees exactly the
ATen calls an eager forward issues, on the CPU as on the GPU, so these counts are measured here and
kept in tests.

    with DispatchCounter(model) as counter:
        dllm.generate(model, prompt, callback=counter.step_done, ...)
    print(counter.summary())

Kinds of ATen call:
- ``kernel``: an op that computes (launches a kernel on a GPU);
- metadata: views (``OpOverload.is_view``), ``_unsafe_view``, allocations (``empty*``) and the
  scalar reads themselves (``item``, ``is_nonzero``, ``_local_scalar_dense``: counted as syncs);
- ``sync``: a read of device data by the host, at the dispatch level (the scalar reads, ``nonzero``,
  ``masked_select``, ``index`` with a boolean index, ``unique``, ``equal``, ...) or the Python
  level (``Tensor.tolist``, ``Tensor.numpy``, ``torch.tensor`` of Python data: an upload).

Counts are taken under ``torch.inference_mode`` as ``generate`` runs: composite ops (``linear``,
``scaled_dot_product_attention``) are then seen as one call each, as Python issues them.

A Triton launch of ``dllm.kernels`` (``dllm.kernels.triton.launch.observed_launch``) is counted as one call
and one kernel, where it was made (``triton:NAME`` in the traces), and the ATen calls made inside it
are left out: under ``TRITON_INTERPRET=1`` (a CPU) the interpreter runs torch ops that a GPU would
not, so a CPU run counts a fused path as a GPU launches it. A launch from inside a dispatched op (a
``torch.library`` operator whose CUDA kernel is Triton) is that op's own call, not counted again.
"""

from __future__ import annotations

import os
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

import torch
from torch.overrides import TorchFunctionMode
from torch.utils._python_dispatch import TorchDispatchMode

from dllm.engine.graph_check import PYTHON_READS, is_host_read, issued_at, op_name
from dllm.kernels.triton import launch

_NOT_KERNELS = frozenset({"item", "is_nonzero", "_unsafe_view", "empty", "empty_like", "empty_strided", "new_empty",
                          "new_empty_strided", "lift_fresh", "_local_scalar_dense", "sym_size", "sym_stride",
                          "sym_numel", "sym_storage_offset", "detach", "alias"})
_HERE = os.path.abspath(__file__)


def _storages(x: Any) -> set[int]:
    if isinstance(x, torch.Tensor):
        return {x.untyped_storage().data_ptr()} if x.device.type != "meta" else set()
    if isinstance(x, (tuple, list)):
        return set().union(*(_storages(i) for i in x)) if x else set()
    return set()


def is_kernel(func: Any, args: tuple = (), out: Any = None) -> bool:
    """An ATen call that computes something (a GPU launches a kernel for it): an in-place or ``out=``
    op, or one whose result is new memory. Not a kernel: views and composite calls that returned
    their input (``to`` of the same dtype, ``reshape`` or ``contiguous`` needing no copy), bare
    allocations (``empty*``) and the scalar read of a sync."""
    name = op_name(func)
    if name in _NOT_KERNELS:
        return False
    if name.endswith("_") or getattr(func, "_overloadname", "") == "out":
        return True
    if out is None:
        return not getattr(func, "is_view", False)
    produced = _storages(out)
    return bool(produced) and not produced <= _storages(args)


def caller_line() -> str:
    """``path:line`` of the innermost frame outside torch and this file (where the sync was issued)."""
    return issued_at(_HERE)


@dataclass
class StepCounts:
    """One decode step's counts (or one forward's, outside ``generate``)."""

    query_rows: int = 0  # the canvas columns the step's last forward computed per row (0: no forward)
    layer_calls: int = 0  # transformer-layer forwards in the step
    layer_aten: int = 0  # ATen calls inside layers
    layer_kernels: int = 0  # kernel-like calls inside layers
    outside_aten: int = 0  # ATen calls outside the layers (embedding, head, sampler, engine, cache)
    outside_kernels: int = 0
    syncs: list[str] = field(default_factory=list)  # one "kind @ file:line" per host sync
    syncs_in_forward: int = 0
    forward_calls: int = 0  # calls of the model's forward (a merged forward of several decodes counts once)
    forward_aten: int = 0  # ATen calls inside them (layers, embedding, head)
    layer_ops: Counter = field(default_factory=Counter)  # op name -> calls inside layers
    outside_ops: Counter = field(default_factory=Counter)  # "op @ file:line" -> calls outside layers (trace=True)

    @property
    def aten_per_layer(self) -> float:
        return self.layer_aten / self.layer_calls if self.layer_calls else 0.0

    @property
    def kernels_per_layer(self) -> float:
        return self.layer_kernels / self.layer_calls if self.layer_calls else 0.0

    @property
    def aten_outside_forwards(self) -> int:
        """ATen calls not inside a call of the model's forward (the caller's own work)."""
        return self.layer_aten + self.outside_aten - self.forward_aten

    @property
    def syncs_outside_forwards(self) -> int:
        return len(self.syncs) - self.syncs_in_forward


class _Dispatch(TorchDispatchMode):
    def __init__(self, owner: "DispatchCounter") -> None:
        super().__init__()
        self.owner = owner

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        owner = self.owner
        owner._in_op += 1
        try:
            out = func(*args, **(kwargs or {}))
        finally:
            owner._in_op -= 1
        if not owner._in_launch:  # a Triton launch's own torch ops (the interpreter's) are not a GPU's
            owner._record(func, args, out, kwargs)
        return out


class _Function(TorchFunctionMode):
    def __init__(self, owner: "DispatchCounter") -> None:
        super().__init__()
        self.owner = owner

    def __torch_function__(self, func, types, args=(), kwargs=None):
        name = getattr(func, "__name__", "")
        if self.owner._in_launch:  # the interpreter's reads inside a Triton launch
            pass
        elif name in PYTHON_READS and args and isinstance(args[0], torch.Tensor):
            self.owner._sync(f"Tensor.{name}")
        elif func in (torch.tensor, torch.as_tensor) and args and not isinstance(args[0], torch.Tensor):
            self.owner._sync("upload torch.tensor(python data)")
        return func(*args, **(kwargs or {}))


class DispatchCounter:
    """Counts ATen calls, kernel-like ops and host syncs, split into transformer layers and the rest,
    per step (``step_done`` is a ``generate`` callback that closes a step). ``model``: a dllm model
    whose ``transformer.layers`` (or ``layers``) are the layers to attribute; None counts everything
    as "outside". ``trace``: also record where each call outside the layers came from."""

    def __init__(self, model: Any = None, trace: bool = False) -> None:
        self.trace = trace  # record the code line of every call outside the layers (slower)
        self.steps: list[StepCounts] = []
        self.current = StepCounts()
        self._depth_layer = 0
        self._depth_forward = 0
        self._hooks: list[Any] = []
        self._modes: list[Any] = []
        self._in_op = 0  # depth of dispatched ATen calls running now
        self._in_launch = 0  # depth of Triton launches running now
        core = getattr(model, "transformer", model)
        layers = getattr(core, "layers", None)
        if layers is not None:
            for layer in layers:
                self._hooks.append(layer.register_forward_pre_hook(self._enter_layer))
                self._hooks.append(layer.register_forward_hook(self._leave_layer))
        if isinstance(core, torch.nn.Module):
            self._hooks.append(core.register_forward_pre_hook(self._enter_forward, with_kwargs=True))
            self._hooks.append(core.register_forward_hook(self._leave_forward))

    # ---- hooks -----------------------------------------------------------------------------------
    def _enter_layer(self, module, args) -> None:
        self._depth_layer += 1
        self.current.layer_calls += 1

    def _leave_layer(self, module, args, out) -> None:
        self._depth_layer -= 1

    def _enter_forward(self, module, args, kwargs) -> None:
        self._depth_forward += 1
        self.current.forward_calls += self._depth_forward == 1
        ids = args[0] if args else kwargs.get("input_ids")
        if isinstance(ids, torch.Tensor) and ids.dim() == 2:
            self.current.query_rows = ids.shape[1]

    def _leave_forward(self, module, args, out) -> None:
        self._depth_forward -= 1

    # ---- recording ---------------------------------------------------------------------------------
    def _record(self, func: Any, args: tuple, out: Any, kwargs: Any = None) -> None:
        c = self.current
        kernel = is_kernel(func, args, out)
        if self._depth_layer:
            c.layer_aten += 1
            c.layer_kernels += kernel
            c.layer_ops[op_name(func) + ("" if kernel else " (no kernel)")] += 1
        else:
            c.outside_aten += 1
            c.outside_kernels += kernel
            if self.trace:
                c.outside_ops[f"{op_name(func)} @ {caller_line()}"] += 1
        c.forward_aten += self._depth_forward > 0
        if is_host_read(func, args, kwargs):
            self._sync(op_name(func))

    def launch_begins(self, name: str) -> None:
        """A Triton launch (``dllm.kernels.triton.launch`` observer): one call and one kernel, unless it runs
        inside a dispatched op (counted as that op) or inside another launch."""
        self._in_launch += 1
        if self._in_op or self._in_launch > 1:
            return
        c = self.current
        if self._depth_layer:
            c.layer_aten += 1
            c.layer_kernels += 1
            c.layer_ops[f"triton:{name}"] += 1
        else:
            c.outside_aten += 1
            c.outside_kernels += 1
            if self.trace:
                c.outside_ops[f"triton:{name} @ {caller_line()}"] += 1
        c.forward_aten += self._depth_forward > 0

    def launch_ends(self, name: str) -> None:
        self._in_launch -= 1

    def _sync(self, what: str) -> None:
        self.current.syncs.append(f"{what} @ {caller_line()}")
        if self._depth_forward:
            self.current.syncs_in_forward += 1

    def step_done(self, state: Any = None) -> None:
        """Close the current step (usable as ``generate``'s ``callback``)."""
        self.steps.append(self.current)
        self.current = StepCounts()

    # ---- context -----------------------------------------------------------------------------------
    def __enter__(self) -> "DispatchCounter":
        self._modes = [_Function(self), _Dispatch(self)]
        for m in self._modes:
            m.__enter__()
        launch.LAUNCH_OBSERVERS.append(self)
        return self

    def __exit__(self, *exc) -> None:
        if self in launch.LAUNCH_OBSERVERS:
            launch.LAUNCH_OBSERVERS.remove(self)
        for m in reversed(self._modes):
            m.__exit__(*exc)
        for h in self._hooks:
            h.remove()
        self._hooks = []

    # ---- summaries ---------------------------------------------------------------------------------
    def cached_steps(self, canvas: int) -> list[StepCounts]:
        """The cached steps of one ``generate`` call: steps whose forward computed fewer than ``canvas``
        columns per row, except the call's first step, which is never a cached one: it forwards the
        whole prompt (with ``cache="block"`` the prompt and the first block, fewer than ``canvas``
        columns) and carries the call's setup (prompt encoding, buffer allocation, weights fused on
        first use)."""
        return [s for s in self.steps[1:] if 0 < s.query_rows < canvas]

    @staticmethod
    def mean(steps: list[StepCounts]) -> dict[str, float]:
        """Averages over ``steps``: per-layer calls and kernels, outside calls, syncs per step."""
        n = max(len(steps), 1)
        layer_calls = sum(s.layer_calls for s in steps)
        return {
            "steps": len(steps),
            "aten_per_layer": sum(s.layer_aten for s in steps) / max(layer_calls, 1),
            "kernels_per_layer": sum(s.layer_kernels for s in steps) / max(layer_calls, 1),
            "aten_outside": sum(s.outside_aten for s in steps) / n,
            "kernels_outside": sum(s.outside_kernels for s in steps) / n,
            "syncs": sum(len(s.syncs) for s in steps) / n,
            "syncs_in_forward": sum(s.syncs_in_forward for s in steps) / n,
        }

    @staticmethod
    def sync_sites(steps: list[StepCounts]) -> Counter:
        """``kind @ file:line`` -> how many times it synced over ``steps``."""
        out: Counter = Counter()
        for s in steps:
            out.update(s.syncs)
        return out


def count_generate(model: Any, prompts: Any, *, trace: bool = False, **generate_kwargs: Any) -> DispatchCounter:
    """Run ``dllm.generate`` under a ``DispatchCounter`` (one ``StepCounts`` per step)."""
    from dllm.engine import generate

    if "callback" in generate_kwargs:
        raise ValueError("count_generate sets the step callback itself; do not pass callback")
    with DispatchCounter(model, trace=trace) as counter:
        generate(model, prompts, callback=counter.step_done, **generate_kwargs)
    return counter


def count_backend(model: Any, mode: str, requests: Any, *, stream: bool = True, max_running: int = 32,
                  join: bool = True) -> DispatchCounter:
    """Serve ``requests`` (``BenchRequest``s of ``dllm bench serve``, all queued at once) on a
    ``DiffusionBackend`` of ``mode`` (``join``: its option), counted on the scheduler's loop thread, which runs every decode
    and forward; the whole run is ``counter.current``. RuntimeError when a request does not finish."""
    from dllm.serve.backends.diffusion import DiffusionBackend
    from dllm.serve.backends.jobs import Done, JobRequest
    from dllm.serve.backends.scheduling.scheduler import Scheduler
    from dllm.settings import DecodeSettings

    counter = DispatchCounter(model)
    loop = Scheduler._loop

    def counted(backend) -> None:
        with counter:  # the modes are the loop thread's own
            loop(backend)

    Scheduler._loop = counted
    try:
        backend = DiffusionBackend(model, name="counted", mode=mode, max_running=max_running, join=join)
        with backend._cond:  # all queued before the loop takes any
            jobs = [backend.submit(JobRequest(backend.encode_prompt(r.prompt), r.max_tokens,
                                              DecodeSettings(sampler=r.sampler, cache=r.cache), stream=stream))
                    for r in requests]
        for job in jobs:
            result = job.result(600)
            if not isinstance(result, Done):
                raise RuntimeError(f"a counted request did not finish: {result}")
        backend.close()
    finally:
        Scheduler._loop = loop
    return counter


__all__ = ["DispatchCounter", "StepCounts", "caller_line", "count_backend", "count_generate", "is_kernel", "op_name"]
