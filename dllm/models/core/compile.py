"""``torch.compile`` of a model's transformer layers, with the eager path kept beside it.

>>> from dllm.models import load, compile_model, uncompile_model
>>> model = compile_model(load("tiny-llada"))              # inductor, dynamic shapes
>>> out = dllm.generate(model, prompt, sampler="fast")    # same tokens, compiled layers
>>> uncompile_model(model)                                 # back to eager

What is compiled: the two pure halves of every ``TransformerBlock``, ``qkv_rows`` (norm, q/k/v
projections, RoPE) and ``residual_out`` (o_proj, residual, norm, SwiGLU MLP, residual). The K/V
cache write and the attention backend (already one fused kernel) run eagerly between them, and so
do the embedding, the final norm, the LM head (one matmul, on the block's rows only for
block-reading samplers) and the engine. The layers share their code, so dynamo traces each half once
and reuses the graph for every layer (parameters are graph inputs). ``dynamic=True`` by default: a
decode alternates full forwards (the whole canvas) with cached steps (the block), and the canvas
width changes between calls, so static shapes would recompile for every width.

Checks before anything is compiled (``ValueError`` / ``RuntimeError`` naming the problem):

- the model has transformer layers (the ``oracle`` has none);
- ``backend`` is one of ``torch._dynamo.list_backends()`` (plus the debugging backends);
- ``inductor`` on CPU needs a C++ compiler on ``PATH``; on CUDA it needs ``triton``;
- a first forward on a few tokens compiles the layers; if the backend fails there the compile is
  undone, so the model keeps working eagerly, and the backend's error is raised with that said.

Whether compiling pays depends on the device, the dtype and the shapes: ``dllm bench breakdown
--compile`` measures it against the eager path in the same run.
"""

from __future__ import annotations

import importlib.util
import shutil
from typing import Any, Optional

import torch

DEBUG_BACKENDS = ("eager", "aot_eager")  # real dynamo paths without code generation
HALVES = ("qkv_rows", "residual_out")  # TransformerBlock's pure halves


def _blocks(model) -> list[torch.nn.Module]:
    transformer = getattr(model, "transformer", None)
    layers = getattr(transformer, "layers", None)
    if not layers:
        raise ValueError(f"{type(model).__name__} has no transformer layers to compile (the oracle "
                         "computes its logits without a network); use it eagerly")
    return list(layers)


def valid_backends() -> tuple[str, ...]:
    """Backends ``compile_model`` accepts: dynamo's registered ones and the debugging ones."""
    import torch._dynamo

    return tuple(sorted(set(torch._dynamo.list_backends()) | set(DEBUG_BACKENDS)))


def check_backend(backend: str, device: torch.device) -> None:
    """ValueError / RuntimeError when ``backend`` cannot compile for ``device``."""
    valid = valid_backends()
    if backend not in valid:
        raise ValueError(f"unknown torch.compile backend {backend!r}; valid backends: {list(valid)}")
    if backend != "inductor":
        return
    if device.type == "cpu" and not any(shutil.which(c) for c in ("g++", "c++", "clang++")):
        raise RuntimeError("backend 'inductor' on CPU needs a C++ compiler (g++, c++ or clang++) on PATH; "
                           "install one, or use backend='aot_eager', or run eagerly")
    if device.type == "cuda" and importlib.util.find_spec("triton") is None:
        raise RuntimeError("backend 'inductor' on CUDA needs triton (pip install triton); or run eagerly")


def is_compiled(model) -> bool:
    """True when ``compile_model`` compiled the model's layers (and they were not uncompiled)."""
    return bool(getattr(model, "_dllm_compiled", None))


def uncompile_model(model):
    """Undo ``compile_model``: every layer runs its eager ``forward`` again. Returns the model."""
    for block in _blocks(model):
        for name in HALVES:
            block.__dict__.pop(name, None)  # the compiled bound method shadowing the class's
    model._dllm_compiled = None
    return model


def compile_model(model, backend: str = "inductor", *, mode: Optional[str] = None, dynamic: Optional[bool] = True,
                  probe: bool = True, **options: Any):
    """Compile ``model``'s transformer layers in place with ``torch.compile``; returns the model.

    backend / mode / dynamic / options: passed to ``torch.compile`` (``options``: its ``options``
    mapping, e.g. ``{"max_autotune": True}``).
    probe: run one 8-token forward now, so a backend that cannot compile fails here (the compile is
        then undone and the error re-raised) instead of in the middle of a decode.
    """
    blocks = _blocks(model)
    device = next(model.parameters()).device
    check_backend(backend, device)
    if mode is not None and options:
        raise ValueError("pass either mode or options to torch.compile, not both")
    kwargs: dict[str, Any] = {"backend": backend, "dynamic": dynamic}
    if mode is not None:
        kwargs["mode"] = mode
    if options:
        kwargs["options"] = dict(options)
    if is_compiled(model):
        uncompile_model(model)
    for block in blocks:
        for name in HALVES:
            setattr(block, name, torch.compile(getattr(type(block), name).__get__(block), **kwargs))
    model._dllm_compiled = dict(kwargs)
    if probe:
        ids = torch.full((1, 8), int(model.mask_id), dtype=torch.long, device=device)
        try:
            with torch.no_grad():
                model(ids)
        except Exception as e:  # the backend's own failure, whatever its type
            uncompile_model(model)
            raise RuntimeError(f"torch.compile(backend={backend!r}) failed on the first forward; the compile "
                               f"was undone and the model runs eagerly. The backend said: "
                               f"{type(e).__name__}: {' '.join(str(e).split())[:400]}") from e
    return model


__all__ = ["check_backend", "compile_model", "is_compiled", "uncompile_model", "valid_backends"]
