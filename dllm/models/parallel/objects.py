"""Picklable objects over a process group, leaving no tensor to a Gloo worker at exit.

torch's Gloo process group runs a collective on a worker thread, which marks the work done (the
caller's ``wait`` returns) and only then destroys the work object, releasing its tensors' Python
wrappers under the GIL. When the collective is the process's last (lm-eval gathers the metrics at
the very end; a tensor-parallel rank's last act is a gather or the stop message), the main thread
can reach interpreter finalization first; the worker's GIL acquisition then ends the thread inside
the work's C++ destructor and the process aborts with "terminate called without an active
exception" (SIGABRT) after its results are written. Seen in a core dump: ``~AsyncGatherWork`` ->
``TensorImpl::decref_pyobject`` -> ``PyEval_AcquireThread`` -> ``PyThread_exit_thread`` on the
worker while the main thread runs ``Py_FinalizeEx``; the same race as pytorch/pytorch#190489
(whose atexit fix, pytorch/pytorch#179291, was abandoned; ``destroy_process_group`` does not join
Gloo's workers either).

``gather_object``, ``all_gather_object`` and ``broadcast_object`` here are torch's algorithms
(pickle, exchange the sizes, exchange the bytes padded to the longest) on tensors they hold, and
return once the workers have dropped every reference to them (``Tensor._use_count`` and the
Python reference a held impl keeps, both waited for with the GIL released), so no collective's
clean-up outlives the call. Other backends (NCCL) take torch's functions unchanged.
"""

from __future__ import annotations

import pickle
import sys
import time
from typing import Any, Callable, Optional

import torch
import torch.distributed as dist

RELEASE_TIMEOUT_S = 10.0  # the longest wait for a worker to drop a finished collective's tensors


def _check_rank(name: str, rank: int) -> None:
    world = dist.get_world_size()
    if not 0 <= rank < world:
        raise ValueError(f"{name} must be a rank in [0, {world}), got {rank}")


def _payload(obj: Any) -> tuple[torch.Tensor, torch.Tensor]:
    payload = torch.frombuffer(bytearray(pickle.dumps(obj)), dtype=torch.uint8)  # [n]
    return payload, torch.tensor([payload.numel()], dtype=torch.long)  # [n], [1]


def _sizes(size: torch.Tensor) -> list[torch.Tensor]:
    """Every rank's payload size (an all-gather of ``size``)."""
    sizes = [torch.zeros(1, dtype=torch.long) for _ in range(dist.get_world_size())]  # world x [1]
    settled([size, *sizes], lambda: dist.all_gather(sizes, size))
    return sizes


def _padded(payload: torch.Tensor, longest: int) -> torch.Tensor:
    padded = torch.zeros(longest, dtype=torch.uint8)  # [longest]
    padded[:payload.numel()] = payload
    return padded


def _unpickle(buffers: list[torch.Tensor], sizes: list[torch.Tensor]) -> list:
    return [pickle.loads(buf[:int(n.item())].numpy().tobytes()) for buf, n in zip(buffers, sizes)]


def gather_object(obj: Any, dst: int = 0) -> Optional[list]:
    """Every rank's picklable ``obj``, in rank order, on rank ``dst`` (None on the others), as
    ``torch.distributed.gather_object``; on a Gloo group it returns only after the group's workers
    released the collectives' tensors (module docstring)."""
    _check_rank("dst", dst)
    if dist.get_backend() != "gloo":
        result = [None] * dist.get_world_size() if dist.get_rank() == dst else None
        dist.gather_object(obj, object_gather_list=result, dst=dst)
        return result
    payload, size = _payload(obj)
    sizes = _sizes(size)
    padded = _padded(payload, max(int(s.item()) for s in sizes))
    outputs = [torch.empty_like(padded) for _ in sizes] if dist.get_rank() == dst else None
    settled([padded, *(outputs or [])], lambda: dist.gather(padded, gather_list=outputs, dst=dst))
    return None if outputs is None else _unpickle(outputs, sizes)


def all_gather_object(obj: Any) -> list:
    """Every rank's picklable ``obj``, in rank order, on every rank, as
    ``torch.distributed.all_gather_object``, with ``gather_object``'s release on Gloo."""
    if dist.get_backend() != "gloo":
        result = [None] * dist.get_world_size()
        dist.all_gather_object(result, obj)
        return result
    payload, size = _payload(obj)
    sizes = _sizes(size)
    padded = _padded(payload, max(int(s.item()) for s in sizes))
    outputs = [torch.empty_like(padded) for _ in sizes]
    settled([padded, *outputs], lambda: dist.all_gather(outputs, padded))
    return _unpickle(outputs, sizes)


def broadcast_object(obj: Any = None, src: int = 0) -> Any:
    """Rank ``src``'s picklable ``obj`` on every rank (the others' ``obj`` is ignored), as
    ``torch.distributed.broadcast_object_list``, with ``gather_object``'s release on Gloo."""
    _check_rank("src", src)
    if dist.get_backend() != "gloo":
        box = [obj]
        dist.broadcast_object_list(box, src=src)
        return box[0]
    mine = dist.get_rank() == src
    payload, size = _payload(obj) if mine else (None, torch.zeros(1, dtype=torch.long))
    settled([size], lambda: dist.broadcast(size, src=src))
    buffer = payload if mine else torch.empty(int(size.item()), dtype=torch.uint8)  # [n]
    settled([buffer], lambda: dist.broadcast(buffer, src=src))
    return obj if mine else _unpickle([buffer], [size])[0]


def _holds(t: torch.Tensor) -> tuple[int, int]:
    """(C++ references to t's TensorImpl, Python references to t). While C++ code (a Gloo work) holds
    the impl, the impl holds a Python reference too, dropped under the GIL (``decref_pyobject``) after
    the C++ count fell: both must be back before the worker is done with t."""
    return t._use_count(), sys.getrefcount(t)


def holders(tensors: list[torch.Tensor]) -> list[tuple[int, int]]:
    """Each tensor's ``(C++, Python)`` references now (before a collective): what ``released`` waits
    for them to return to. Take it and wait on the same list, so that the Python references match
    (both counted by this one function: no loop variable or iterator holds a tensor meanwhile)."""
    return [_holds(tensors[i]) for i in range(len(tensors))]


def settled(tensors: list[torch.Tensor], collective: Callable[[], Any], timeout: float = RELEASE_TIMEOUT_S) -> None:
    """Run ``collective`` (a Gloo collective on ``tensors``) and return once its worker let go of each
    of them (``released``, at most ``timeout`` seconds)."""
    before = holders(tensors)
    collective()
    released(tensors, before, timeout)


def released(tensors: list[torch.Tensor], before: list[tuple[int, int]], timeout: float = RELEASE_TIMEOUT_S) -> bool:
    """Wait, the GIL released, until each of ``tensors`` is back to its references ``before`` a
    collective (``holders``): True, or False after ``timeout`` seconds (never a hang; the race at worst)."""
    deadline = time.monotonic() + timeout
    spins = 0
    while any(now[0] > was[0] or now[1] > was[1] for now, was in zip(holders(tensors), before)):
        if time.monotonic() > deadline:
            return False
        time.sleep(0 if spins < 50 else 0.0005)  # a worker usually lets go within microseconds
        spins += 1
    return True


__all__ = ["RELEASE_TIMEOUT_S", "all_gather_object", "broadcast_object", "gather_object", "holders", "released",
           "settled"]
