"""The Triton kernels compiled ahead of time for an NVIDIA GPU that is not here.

Under ``TRITON_INTERPRET=1`` (how a CPU runs and tests the kernels) nothing is compiled, so a kernel
that the interpreter runs may still fail to compile for a GPU, or compile to a program that does not
fit one (too many registers or too much shared memory per block: a launch error there). Triton's
compiler does not need the GPU: ``triton.compile`` with a ``GPUTarget`` lowers a kernel to PTX and,
with the ``ptxas`` that the triton wheel bundles, to a cubin, whose resources ``cuobjdump
-res-usage`` (bundled as well) reads back.

``compile_launch`` compiles one launch a wrapper asked for (``dllm.kernels.triton.launch.record_launches``
records them, with the wrappers planning for the target's SM count), specialised as Triton's JIT
specialises a first launch on a GPU (``specialize``: its argument types, integers equal to 1 as
constants, 16-byte alignment hints, the launch options), and reports registers per thread, local
memory, shared memory, and the blocks per SM that these allow (``occupancy``: an estimate from the
target's limits). ``benchmarks/compile_kernels.py`` compiles every kernel at LLaDA-8B's, Dream-7B's
and SDAR-8B's shapes.

The kernels must be decorated without the interpreter: run this in a process where
``TRITON_INTERPRET`` is unset when triton is imported (``unavailable_reason`` says why not).
"""

from __future__ import annotations

import math
import os
import subprocess
import tempfile
import time
from dataclasses import dataclass
from typing import Any, Optional

from dllm.kernels.triton.launch import Launch


@dataclass(frozen=True)
class Target:
    """An NVIDIA GPU's compile target and the per-SM limits that bound how many blocks run at once."""

    name: str
    arch: int  # compute capability x 10: 90 = sm_90
    sms: int  # streaming multiprocessors (the launch plans' grid sizes)
    smem_per_block: int  # bytes of shared memory one block may use
    smem_per_sm: int  # bytes per SM
    regs_per_sm: int = 65536
    threads_per_sm: int = 2048
    blocks_per_sm: int = 32


TARGETS = {
    "sm90": Target("H100 / H200 (sm_90)", 90, 132, 232448, 233472),
    "sm80": Target("A100 (sm_80)", 80, 108, 166912, 167936),
}


@dataclass(frozen=True)
class CompiledLaunch:
    """What one launch compiled to on a target."""

    name: str  # the wrapper's launch name
    config: str  # its constexprs and launch options
    regs: int  # registers per thread
    local: int  # bytes of local memory per thread (spills, or arrays that did not fit registers)
    shared: int  # bytes of shared memory per block
    num_warps: int
    seconds: float  # compile time here
    blocks_per_sm: int  # how many blocks of it an SM holds at once (0: it cannot launch)
    limited_by: str  # what bounds blocks_per_sm: registers | shared | threads | blocks

    @property
    def launches(self) -> bool:
        return self.blocks_per_sm > 0


def unavailable_reason() -> Optional[str]:
    """None when kernels can be compiled here for an NVIDIA target, else why not."""
    if os.environ.get("TRITON_INTERPRET", "0") not in ("", "0"):
        return "TRITON_INTERPRET is set: the kernels are interpreted, not compiled; run without it"
    try:
        import triton
        import triton.backends.compiler  # GPUTarget's home: the compiler backends
    except ImportError as exc:
        return f"triton with its NVIDIA backend is not installed ({exc})"
    if _tool("cuobjdump") is None:
        return f"the triton wheel has no bundled cuobjdump ({triton.__version__})"
    try:  # what ``specialize`` follows: Triton 3.x's JIT binder
        from triton.runtime import jit
    except ImportError as exc:
        return f"triton {triton.__version__}'s JIT internals differ from 3.x ({exc})"
    if not (hasattr(jit, "create_function_from_signature") and hasattr(jit.JITFunction, "_pack_args")):
        return f"triton {triton.__version__}'s JIT internals differ from 3.x (its binder or _pack_args)"
    return None


def _tool(name: str) -> Optional[str]:
    import triton

    path = os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "bin", name)
    return path if os.path.exists(path) else None


def specialize(launch: Launch, target: Target) -> tuple[Any, dict, dict, dict]:
    """(options, signature, constexprs, attrs) of ``launch`` compiled for ``target``, as
    ``JITFunction.run`` computes them on a GPU (Triton's own binder and ``_pack_args``): integers equal
    to 1 become constexprs, pointers and integers divisible by 16 carry ``tt.divisibility`` (the
    alignment that lets loads vectorise and pipeline), keywords become the backend's options. These are
    Triton's internals (3.x); a Triton without them raises RuntimeError saying so."""
    from triton.backends.compiler import GPUTarget
    from triton.compiler import make_backend

    try:
        from triton.runtime.jit import create_function_from_signature
        pack = launch.kernel._pack_args
    except (ImportError, AttributeError) as exc:
        raise RuntimeError(f"this Triton's JIT internals differ from 3.x ({exc}): cannot specialise a launch "
                           f"as a GPU would") from exc
    backend = make_backend(GPUTarget("cuda", target.arch, 32))
    kwargs = dict(launch.kwargs, debug=bool(launch.kwargs.get("debug", False)))
    try:
        from triton import knobs  # what JITFunction.run adds to every launch's keywords

        kwargs.setdefault("instrumentation_mode", knobs.compilation.instrumentation_mode)
        kwargs.setdefault("fpsan_homomorphic_casts", knobs.compilation.fpsan_homomorphic_casts)
    except (ImportError, AttributeError):
        pass
    binder = create_function_from_signature(launch.kernel.signature, launch.kernel.params, backend)
    bound, specialization, options = binder(*launch.args, **kwargs)
    return pack(backend, kwargs, bound, specialization, options)


def resource_usage(cubin: bytes) -> dict[str, int]:
    """``cuobjdump -res-usage`` of a one-function cubin: {"REG": .., "STACK": .., "SHARED": .., "LOCAL": ..}."""
    tool = _tool("cuobjdump")
    if tool is None:
        raise RuntimeError(unavailable_reason() or "no cuobjdump")
    with tempfile.NamedTemporaryFile(suffix=".cubin") as f:
        f.write(cubin)
        f.flush()
        text = subprocess.run([tool, "-res-usage", f.name], capture_output=True, text=True, check=True).stdout
    for line in text.splitlines():
        if "REG:" in line:
            return {k: int(v) for k, v in (item.split(":") for item in line.split()
                                             if ":" in item and item.split(":")[1].isdigit())}
    raise RuntimeError(f"cuobjdump reported no resource usage:\n{text}")


def occupancy(target: Target, regs: int, shared: int, num_warps: int) -> tuple[int, str]:
    """(blocks per SM, the limit that bounds it) for a kernel of ``regs`` registers per thread,
    ``shared`` bytes of shared memory per block and ``num_warps`` warps: registers are allocated per
    warp in units of 256, each block reserves 1 KiB of shared memory. 0 blocks: it cannot launch
    (more shared memory than a block may have, or more registers than an SM has)."""
    threads = num_warps * 32
    if shared > target.smem_per_block or threads > 1024:
        return 0, "shared" if shared > target.smem_per_block else "threads"
    per_warp = math.ceil(max(regs, 1) * 32 / 256) * 256
    limits = {
        "registers": target.regs_per_sm // (per_warp * num_warps),
        "shared": target.smem_per_sm // (shared + 1024),
        "threads": target.threads_per_sm // threads,
        "blocks": target.blocks_per_sm,
    }
    name = min(limits, key=lambda k: limits[k])
    return limits[name], name


def _config(launch: Launch, options: Any) -> str:
    """The launch's constexpr keywords and its launch options, as the wrapper passed them."""
    params = {p.name for p in launch.kernel.params if p.is_constexpr}
    parts = [f"{k}={v}" for k, v in launch.kwargs.items() if k in params and v is not None]
    return ", ".join(parts + [f"{k}={getattr(options, k)}" for k in ("num_warps", "num_stages")])


def pointer_types(launch: Launch, target: Target) -> str:
    """The element types of the launch's pointer arguments, in order (``bf16 bf16 fp32 ...``)."""
    signature = specialize(launch, target)[1]
    return " ".join(t[1:] for t in signature.values() if t.startswith("*"))


def compile_launch(launch: Launch, target: Target) -> CompiledLaunch:
    """Compile ``launch`` for ``target`` as a GPU's first launch would (``specialize``; PTX, then a
    cubin by the bundled ptxas) and read its resources. Raises what the compiler raises when the kernel
    does not compile."""
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    reason = unavailable_reason()
    if reason is not None:
        raise RuntimeError(reason)
    options, signature, constexprs, attrs = specialize(launch, target)
    source = ASTSource(launch.kernel, signature, constexprs, attrs)
    start = time.perf_counter()
    compiled = triton.compile(source, target=GPUTarget("cuda", target.arch, 32), options=options.__dict__)
    seconds = time.perf_counter() - start
    usage = resource_usage(compiled.asm["cubin"])
    shared = int(compiled.metadata.shared)
    warps = int(compiled.metadata.num_warps)
    blocks, limit = occupancy(target, usage["REG"], shared, warps)
    return CompiledLaunch(launch.name, _config(launch, options), usage["REG"], usage.get("LOCAL", 0), shared, warps,
                          seconds, blocks, limit)


def distinct(launches: list[Launch], target: Target) -> list[Launch]:
    """The launches that compile to different programs on ``target`` (kernel, specialised signature,
    constexprs, alignment attributes, options), first of each, in order."""
    seen, out = set(), []
    for launch in launches:
        options, signature, constexprs, attrs = specialize(launch, target)
        key = (id(launch.kernel), repr(signature), repr(sorted(constexprs.items())), repr(sorted(attrs.items())),
               repr(sorted(options.__dict__.items())))
        if key not in seen:
            seen.add(key)
            out.append(launch)
    return out


__all__ = ["CompiledLaunch", "TARGETS", "Target", "compile_launch", "distinct", "occupancy", "pointer_types",
           "resource_usage", "specialize", "unavailable_reason"]
