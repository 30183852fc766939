"""Tensor and expert parallelism through ``torch.distributed``: one model's layers split across ranks.

>>> # torchrun --nproc-per-node 2 my_script.py
>>> model = dllm.load("tiny-llada", tensor_parallel=2)          # heads and MLP columns split
>>> model = dllm.load("some-llada2-moe", tensor_parallel=2, expert_parallel=True)  # + whole experts per rank

Layout: ``plan.py`` (the numbers a split needs, checked before any weight is read), ``group.py``
(the process group and its ``DeviceMesh``), ``shard.py`` (which slice of each tensor a rank keeps,
and the local-width modules), ``layers.py`` (the row-parallel projection and the MoE whose outputs
are summed across ranks), ``objects.py`` (picklable objects gathered or broadcast so that no Gloo
worker still holds a collective's tensors when a rank exits).
"""

from __future__ import annotations

from dllm.lazy import lazy_exports

_LAZY = {
    "ParallelPlan": ("dllm.models.parallel.plan", "ParallelPlan"),
    "check_plan": ("dllm.models.parallel.plan", "check_plan"),
    "TensorParallel": ("dllm.models.parallel.shard", "TensorParallel"),
    "tensor_parallel_group": ("dllm.models.parallel.group", "tensor_parallel_group"),
    "RowParallelLinear": ("dllm.models.parallel.layers", "RowParallelLinear"),
    "ParallelMoE": ("dllm.models.parallel.layers", "ParallelMoE"),
    "gather_object": ("dllm.models.parallel.objects", "gather_object"),
    "all_gather_object": ("dllm.models.parallel.objects", "all_gather_object"),
    "broadcast_object": ("dllm.models.parallel.objects", "broadcast_object"),
}

__getattr__, __dir__ = lazy_exports(__name__, _LAZY)

__all__ = sorted(_LAZY)
