"""``gather_object`` for the data-parallel harness that leaves no tensor to a Gloo worker at exit.

torch's Gloo process group runs a collective on a worker thread, which marks the work done (the
caller's ``wait`` returns) and only then destroys the work object, releasing its tensors' Python
wrappers under the GIL. When the collective is the process's last (lm-eval gathers the metrics at
the very end), the main thread can reach interpreter finalization first; the worker's GIL
acquisition then ends the thread inside the work's C++ destructor and the process aborts with
"terminate called without an active exception" (SIGABRT, exit code 134 of ``accelerate launch``)
after its results are written. Seen in a core dump: ``~AsyncGatherWork`` ->
``TensorImpl::decref_pyobject`` -> ``PyEval_AcquireThread`` -> ``PyThread_exit_thread`` on the
worker while the main thread runs ``Py_FinalizeEx``; the same race as pytorch/pytorch#190489
(whose atexit fix, pytorch/pytorch#179291, was abandoned; ``destroy_process_group`` does not join
Gloo's workers either).

``gather_object`` here is torch's algorithm (pickle, all-gather the sizes, gather the bytes padded
to the longest) on tensors it holds, and returns once the workers have dropped every reference to
them (``Tensor._use_count``, waited for with the GIL released), so no collective's clean-up
outlives the call. Other backends (NCCL) take ``torch.distributed.gather_object`` unchanged.
"""

from __future__ import annotations

import pickle
import time
from typing import Any, Optional

import torch
import torch.distributed as dist

RELEASE_TIMEOUT_S = 10.0  # the longest wait for a worker to drop a finished collective's tensors


def gather_object(obj: Any, dst: int = 0) -> Optional[list]:
    """Every rank's picklable ``obj``, in rank order, on rank ``dst`` (None on the others), as
    ``torch.distributed.gather_object``; on a Gloo group it returns only after the group's workers
    released the collectives' tensors (module docstring)."""
    world = dist.get_world_size()
    if not 0 <= dst < world:
        raise ValueError(f"dst must be a rank in [0, {world}), got {dst}")
    if dist.get_backend() != "gloo":
        result = [None] * world if dist.get_rank() == dst else None
        dist.gather_object(obj, object_gather_list=result, dst=dst)
        return result
    payload = torch.frombuffer(bytearray(pickle.dumps(obj)), dtype=torch.uint8)  # [n]
    size = torch.tensor([payload.numel()], dtype=torch.long)  # [1]
    sizes = [torch.zeros(1, dtype=torch.long) for _ in range(world)]  # world x [1]
    dist.all_gather(sizes, size)
    longest = max(int(s.item()) for s in sizes)
    padded = torch.zeros(longest, dtype=torch.uint8)  # [longest]
    padded[:payload.numel()] = payload
    outputs = [torch.empty(longest, dtype=torch.uint8) for _ in range(world)] if dist.get_rank() == dst else None
    dist.gather(padded, gather_list=outputs, dst=dst)
    released([size, *sizes, padded, *(outputs or [])])
    if outputs is None:
        return None
    return [pickle.loads(out[:int(n.item())].numpy().tobytes()) for out, n in zip(outputs, sizes)]


def released(tensors: list[torch.Tensor], timeout: float = RELEASE_TIMEOUT_S) -> bool:
    """Wait, the GIL released, until nothing but the caller holds each of ``tensors`` (no views of
    them may be alive): True, or False after ``timeout`` seconds (never a hang; the race at worst)."""
    deadline = time.monotonic() + timeout
    while any(t._use_count() > 1 for t in tensors):
        if time.monotonic() > deadline:
            return False
        time.sleep(0.0005)
    return True


__all__ = ["RELEASE_TIMEOUT_S", "gather_object", "released"]
