"""The tensor-parallel process group: ``torch.distributed`` started from torchrun's environment,
one ``DeviceMesh`` dimension ("tp") over every rank, and the device each rank computes on."""

from __future__ import annotations

import os
import socket
from dataclasses import dataclass
from typing import Any, Callable, Optional, Union

import torch
import torch.distributed as dist

from dllm.models.parallel.objects import settled

LAUNCH_HINT = "run the script under `torchrun --nproc-per-node {n} script.py`"


@dataclass(frozen=True)
class TPGroup:
    """This process's place in the group."""

    mesh: Any  # torch.distributed.device_mesh.DeviceMesh, 1-D ("tp",)
    group: Any  # its ProcessGroup (the all-reduces run on it)
    rank: int
    size: int
    device: torch.device


def rank_device(device: Union[str, torch.device, None]) -> torch.device:
    """The device of this rank: CUDA ranks take ``cuda:LOCAL_RANK`` (a bare "cuda" or None with CUDA
    present), anything else stays as given (CPU ranks by default)."""
    local = int(os.environ.get("LOCAL_RANK", "0"))
    if device is None:
        return torch.device("cuda", local) if torch.cuda.is_available() else torch.device("cpu")
    device = torch.device(device)
    if device.type == "cuda" and device.index is None:
        return torch.device("cuda", local)
    return device


def tensor_parallel_group(n: int, device: Union[str, torch.device, None] = None) -> TPGroup:
    """Join (or start, from torchrun's RANK / WORLD_SIZE / MASTER_ADDR environment) the default
    process group (NCCL on CUDA, gloo on CPU) and build the 1-D mesh over its ``n`` ranks.
    ValueError when there is no distributed environment or its size is not ``n``."""
    from torch.distributed.device_mesh import init_device_mesh

    dev = rank_device(device)
    if not dist.is_initialized():
        if "RANK" not in os.environ or "WORLD_SIZE" not in os.environ:
            raise ValueError(f"tensor_parallel={n} needs one process per rank: " + LAUNCH_HINT.format(n=n) +
                             " (no RANK / WORLD_SIZE in the environment)")
        if dev.type == "cuda":
            torch.cuda.set_device(dev)
        dist.init_process_group("nccl" if dev.type == "cuda" else "gloo")
    world = dist.get_world_size()
    if world != n:
        raise ValueError(f"tensor_parallel={n} but this job has {world} process(es): " + LAUNCH_HINT.format(n=n))
    mesh = init_device_mesh(dev.type, (n,), mesh_dim_names=("tp",))
    return TPGroup(mesh, mesh.get_group(), mesh.get_local_rank(), n, dev)


def free_port() -> int:
    """A TCP port of 127.0.0.1 that is free now (a group's MASTER_PORT, or a server, binds it a moment later)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def all_reduce_(tensor: torch.Tensor, group: Optional[Any]) -> torch.Tensor:
    """Sum ``tensor`` over the group in place (every rank ends with the same values) and return it;
    on gloo, once the group's worker has let go of it (``collective``)."""
    collective(group, [tensor], lambda: dist.all_reduce(tensor, group=group))
    return tensor


SETTLE_TIMEOUT_S = 1.0  # the longest wait for a worker to let go of a finished collective's tensors


def collective(group: Optional[Any], tensors: list[torch.Tensor], call: Callable[[], Any]) -> None:
    """Run ``call``, a collective on ``group`` (None: the default group) over ``tensors``. On gloo it
    returns once the group's worker let go of them (``objects.settled``, at most ``SETTLE_TIMEOUT_S``),
    so that no worker is still releasing them under the GIL when the process exits (the abort of
    ``dllm.models.parallel.objects``; a model's all-reduce is a rank's last collective whenever a
    script ends after ``generate``). Other backends: ``call`` alone."""
    if dist.get_backend(group) == "gloo":
        settled(tensors, call, SETTLE_TIMEOUT_S)
    else:
        call()


__all__ = ["SETTLE_TIMEOUT_S", "TPGroup", "all_reduce_", "collective", "free_port", "rank_device",
           "tensor_parallel_group"]
