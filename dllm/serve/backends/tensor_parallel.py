"""Serving a model split over N ranks (``dllm.load(..., tensor_parallel=N)``): rank 0 runs the server,
ranks 1..N-1 follow it.

Every rank must run the same forwards in the same order (each one's all-reduces meet the others').
Rank 0's backend runs one ``generate`` call at a time (``static`` or ``serial`` admission: the
continuous mode merges several calls' forwards, which the followers could not replay), and its
``Mirror`` broadcasts each call (prompts and ``generate`` arguments, seeds included) and, after every
step, the rows that left it (a final answer, a stop string, a cancel) and whether the call ends. A
follower (``follow``) runs the same call with a step callback that applies the same releases, so
its forwards have the same shapes as rank 0's; every rank samples from the same logits, so no token
is sent. ``Mirror.close`` sends the stop that ends the followers.

``spawn_followers`` starts ranks 1..N-1 as child processes of the server (``python -m
dllm.serve.backends.tensor_parallel``): they ignore Ctrl-C (the server drains, then stops them)
and die with the server (``PR_SET_PDEATHSIG`` on Linux), so no rank outlives it.
"""

from __future__ import annotations

import argparse
import datetime
import os
import signal
import subprocess
import sys
from dataclasses import dataclass, field
from typing import Any, Optional, Sequence

from dllm.models.parallel.group import free_port

STOP = "stop"  # the message that ends a follower
IDLE_TIMEOUT = datetime.timedelta(days=7)  # a follower waits this long for the next call (gloo's default: 30 min)


@dataclass(frozen=True)
class Call:
    """One ``generate`` call, as rank 0 runs it."""

    prompts: list[list[int]]
    kwargs: dict[str, Any] = field(default_factory=dict)  # generate's keywords (callback aside)


def _broadcast(obj: Any = None) -> Any:
    """Rank 0 sends ``obj``; every other rank returns what rank 0 sent (the stop message last: by
    ``broadcast_object``, whose Gloo tensors are released before a rank exits)."""
    from dllm.models.parallel.objects import broadcast_object

    return broadcast_object(obj, src=0)


class Mirror:
    """Rank 0's side: what the followers must replay."""

    def __init__(self, processes: Sequence[subprocess.Popen] = ()) -> None:
        self.processes = list(processes)
        self.closed = False

    def begin(self, call: Call) -> None:
        _broadcast(call)

    def step(self, left: list[int], leave: bool) -> None:
        """After every step of the call: the rows released now, and whether the call ends here."""
        _broadcast((left, leave))

    def close(self, timeout: float = 10.0) -> None:
        """End the followers (they exit 0) and wait for them; kill one that does not end in time."""
        if self.closed:
            return
        self.closed = True
        _broadcast(STOP)
        for proc in self.processes:
            try:
                proc.wait(timeout=timeout)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        import torch.distributed as dist

        if dist.is_initialized():
            dist.destroy_process_group()


class _Stopped(Exception):
    """A follower got the stop message inside a call."""


class _Leave(Exception):
    """The call ends early (every row left)."""


def follow(model: Any) -> None:
    """Ranks 1..N-1: replay rank 0's calls until the stop message."""
    from dllm.engine import generate
    from dllm.rows import release_rows

    while True:
        call = _broadcast()
        if call == STOP:
            return

        def on_step(state) -> None:
            msg = _broadcast()
            if msg == STOP:
                raise _Stopped
            left, leave = msg
            if leave:
                raise _Leave
            if left:
                release_rows(state, left)

        try:
            generate(model, call.prompts, callback=on_step, **call.kwargs)
        except _Leave:
            pass
        except _Stopped:
            return


def rank_env(rank: int, size: int, port: int) -> dict[str, str]:
    return {"RANK": str(rank), "LOCAL_RANK": str(rank), "WORLD_SIZE": str(size), "MASTER_ADDR": "127.0.0.1",
            "MASTER_PORT": str(port)}


def _die_with_parent() -> None:  # in the child, before exec: SIGTERM when the server process ends
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    try:
        import ctypes

        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG
    except OSError:
        pass


def spawn_followers(size: int, load_args: Sequence[str]) -> tuple[list[subprocess.Popen], int]:
    """Start ranks 1..size-1 (``load_args``: this module's flags, how each loads the model); returns
    them and the rendezvous port; this process becomes rank 0 (its environment is set)."""
    port = free_port()
    procs = [subprocess.Popen([sys.executable, "-m", "dllm.serve.backends.tensor_parallel", *load_args],
                              env={**os.environ, **rank_env(r, size, port)}, preexec_fn=_die_with_parent)
             for r in range(1, size)]
    os.environ.update(rank_env(0, size, port))
    return procs, port


def init_group(device: Optional[str]) -> None:
    """Start the process group with a long timeout (a follower waits for the next request)."""
    import torch
    import torch.distributed as dist

    if not dist.is_initialized():
        cuda = (device or "").startswith("cuda") or (device is None and torch.cuda.is_available())
        dist.init_process_group("nccl" if cuda else "gloo", timeout=IDLE_TIMEOUT)


def load_split(model: str, size: int, *, dtype: Optional[str], device: Optional[str], expert_parallel: bool) -> Any:
    from dllm.models.loading import load

    init_group(device)
    return load(model, dtype=dtype, device=device, tensor_parallel=size, expert_parallel=expert_parallel)


def split_model(model: str, size: int, *, dtype: Optional[str] = None, device: Optional[str] = None,
                expert_parallel: bool = False, threads: Optional[int] = None) -> tuple[Any, Mirror]:
    """``model`` split over ``size`` ranks for a server: the split checked with the numbers first (no
    process started for one that cannot be made), then ranks 1..size-1 started and every rank loading
    its part. Returns this process's (rank 0's) model and the ``Mirror`` its backend drives."""
    from dllm.models.families.llada2 import LLaDA2, moe_from_hf
    from dllm.models.families.registry import class_for_model_type
    from dllm.models.loading import locate, read_config
    from dllm.models.parallel.plan import check_plan

    hf = read_config(locate(model))
    cls = class_for_model_type(hf.get("model_type"))
    config, _ = cls.from_hf_config(hf, None)
    check_plan(config, size, moe=moe_from_hf(hf) if issubclass(cls, LLaDA2) else None, expert_parallel=expert_parallel)
    procs, _ = spawn_followers(size, follower_args(model, dtype, device, expert_parallel, threads))
    try:
        split = load_split(model, size, dtype=dtype, device=device, expert_parallel=expert_parallel)
    except BaseException:
        for proc in procs:
            proc.kill()
        raise
    return split, Mirror(procs)


def follower_args(model: str, dtype: Optional[str], device: Optional[str], expert_parallel: bool,
                  threads: Optional[int]) -> list[str]:
    out = ["--model", model]
    out += ["--dtype", dtype] if dtype else []
    out += ["--device", device] if device else []
    out += ["--threads", str(threads)] if threads else []
    return out + (["--expert-parallel"] if expert_parallel else [])


def run_follower(argv: Optional[Sequence[str]] = None) -> int:
    """A follower rank: started by ``dllm serve --tensor-parallel N``, never by hand (so not a command)."""
    ap = argparse.ArgumentParser(prog="python -m dllm.serve.backends.tensor_parallel")
    ap.add_argument("--model", required=True)
    ap.add_argument("--dtype", default=None)
    ap.add_argument("--device", default=None)
    ap.add_argument("--threads", type=int, default=None)
    ap.add_argument("--expert-parallel", action="store_true")
    args = ap.parse_args(argv)
    if "RANK" not in os.environ:
        ap.error("a follower rank is started by `dllm serve --tensor-parallel N`")
    import torch

    if args.threads:
        torch.set_num_threads(args.threads)
    model = load_split(args.model, int(os.environ["WORLD_SIZE"]), dtype=args.dtype, device=args.device,
                       expert_parallel=args.expert_parallel)
    with torch.inference_mode():
        follow(model)
    import torch.distributed as dist

    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(run_follower())
