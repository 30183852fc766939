"""RMSNorm, the per-head q/k RMSNorm and the RoPE of q and k as single operators, ``dllm::rms_norm``,
``dllm::rms_norm_qk`` and ``dllm::rope_rows``: one call each for the dispatcher (a
``TorchDispatchMode`` sees one op), one launch each on CUDA.

    from dllm.kernels.fused_ops import rms_norm, rms_norm_qk, rope_rows

    y = rms_norm(x, weight, eps, round_once=False)   # x [..., D], weight [D]
    qk = rms_norm_qk(qk, q_w, k_w, h, eps, round_once=True)  # [B, T, H + Hkv, hd]; q_w, k_w [hd]
    qk = rope_rows(qk, cos_sin, fp32=True)          # [B, T, H', hd], cos_sin [B, T, 2, 1, hd]

Dispatch (a ``torch.library.Library``: each implementation registered directly):
- CUDA: the Triton kernels of ``dllm.kernels.triton.fused`` (imported on the first CUDA call), for
  float32 / float16 / bfloat16 tensors. Without triton, or for other dtypes, the references below.
- Any other device: the references themselves, ``dllm.kernels.layer_ops.rms_norm_one_op``,
  ``dllm.kernels.layer_ops.rms_norm_qk`` and ``dllm.kernels.layer_ops.rope_rows`` (so a CPU run is
  bit for bit the ATen one).
- Meta / fake tensors: shape and dtype only, so ``torch.compile`` traces through both ops.

Contracts shared by every device: the result is a new contiguous tensor with x's shape; its dtype is
the reference's (``rms_norm_dtype``, ``rope_rows_dtype``); shapes are checked the same way. The ops
have no backward: they are for inference (``torch.no_grad`` / ``torch.inference_mode``).

This module imports torch and the references when it loads, triton on the first CUDA call.
"""

from __future__ import annotations

import functools
from types import ModuleType
from typing import Optional

import torch

from dllm.kernels.layer_ops import (KERNEL_DTYPES, check_norm_shapes, check_qk_norm_shapes,  # noqa: F401
                                    check_rope_shapes, rms_norm_dtype, rms_norm_one_op, rms_norm_supported,
                                    rope_rows_dtype, rope_rows_supported)
from dllm.kernels.layer_ops import rms_norm_qk as rms_norm_qk_reference
from dllm.kernels.layer_ops import rope_rows as rope_rows_reference


# ----------------------------------------------------------------------------------------------
# The Triton module, imported on the first CUDA call

_TRITON: Optional[ModuleType] = None
_TRITON_MISSING: Optional[str] = None  # why the kernels cannot be imported, once known


def triton_kernels() -> Optional[ModuleType]:
    """``dllm.kernels.triton.fused``, or None when triton is not installed (the reason is then in
    ``triton_unavailable()``)."""
    global _TRITON, _TRITON_MISSING
    if _TRITON is None and _TRITON_MISSING is None:
        try:
            from dllm.kernels.triton import fused as triton_fused
        except ImportError as exc:
            _TRITON_MISSING = f"{type(exc).__name__}: {exc}"
        else:
            _TRITON = triton_fused
    return _TRITON


def triton_unavailable() -> Optional[str]:
    """None when the CUDA implementations run the Triton kernels, else why they cannot."""
    triton_kernels()
    return _TRITON_MISSING


# ----------------------------------------------------------------------------------------------
# dllm::rms_norm


def _rms_norm_op(x: torch.Tensor, weight: torch.Tensor, eps: float, round_once: bool) -> torch.Tensor:
    """Every device but CUDA: ``rms_norm_one_op``, contiguous."""
    check_norm_shapes(x, weight)
    return rms_norm_one_op(x, weight, eps, round_once=round_once).contiguous()


def _rms_norm_cuda(x: torch.Tensor, weight: torch.Tensor, eps: float, round_once: bool) -> torch.Tensor:
    """CUDA: one Triton launch (``dllm.kernels.triton.fused.rms_norm_triton``); the reference without triton."""
    check_norm_shapes(x, weight)
    kernels = triton_kernels()
    if kernels is None or not rms_norm_supported(x, weight, round_once) or weight.device != x.device:
        return rms_norm_one_op(x, weight, eps, round_once=round_once).contiguous()
    return kernels.rms_norm_triton(x, weight, eps, round_once=round_once)


def _rms_norm_fake(x: torch.Tensor, weight: torch.Tensor, eps: float, round_once: bool) -> torch.Tensor:
    check_norm_shapes(x, weight)
    return x.new_empty(x.shape, dtype=rms_norm_dtype(x, weight, round_once))


# ----------------------------------------------------------------------------------------------
# dllm::rms_norm_qk


def _rms_norm_qk_op(x: torch.Tensor, q_weight: torch.Tensor, k_weight: torch.Tensor, n_q: int, eps: float,
                    round_once: bool) -> torch.Tensor:
    """Every device but CUDA: ``dllm.kernels.layer_ops.rms_norm_qk`` (contiguous)."""
    check_qk_norm_shapes(x, q_weight, k_weight, n_q)
    return rms_norm_qk_reference(x, q_weight, k_weight, n_q, eps, round_once=round_once)


def _rms_norm_qk_cuda(x: torch.Tensor, q_weight: torch.Tensor, k_weight: torch.Tensor, n_q: int, eps: float,
                      round_once: bool) -> torch.Tensor:
    """CUDA: one Triton launch (``dllm.kernels.triton.fused.rms_norm_triton`` with a second weight from head
    ``n_q`` on); the reference without triton."""
    check_qk_norm_shapes(x, q_weight, k_weight, n_q)
    kernels = triton_kernels()
    if (kernels is None or not rms_norm_supported(x, q_weight, round_once)
            or q_weight.device != x.device or k_weight.device != x.device):
        return rms_norm_qk_reference(x, q_weight, k_weight, n_q, eps, round_once=round_once)
    return kernels.rms_norm_triton(x, q_weight, eps, round_once=round_once, second=(k_weight, n_q))


def _rms_norm_qk_fake(x: torch.Tensor, q_weight: torch.Tensor, k_weight: torch.Tensor, n_q: int, eps: float,
                      round_once: bool) -> torch.Tensor:
    check_qk_norm_shapes(x, q_weight, k_weight, n_q)
    return x.new_empty(x.shape, dtype=rms_norm_dtype(x, q_weight, round_once))


# ----------------------------------------------------------------------------------------------
# dllm::rope_rows


def _rope_rows_op(x: torch.Tensor, cos_sin: torch.Tensor, fp32: bool) -> torch.Tensor:
    """Every device but CUDA: ``dllm.kernels.layer_ops.rope_rows``, contiguous."""
    check_rope_shapes(x, cos_sin)
    return rope_rows_reference(x, cos_sin, fp32=fp32).contiguous()


def _rope_rows_cuda(x: torch.Tensor, cos_sin: torch.Tensor, fp32: bool) -> torch.Tensor:
    """CUDA: one Triton launch (``dllm.kernels.triton.fused.rope_rows_triton``); the reference without triton."""
    check_rope_shapes(x, cos_sin)
    kernels = triton_kernels()
    if kernels is None or not rope_rows_supported(x, cos_sin, fp32) or cos_sin.device != x.device:
        return rope_rows_reference(x, cos_sin, fp32=fp32).contiguous()
    return kernels.rope_rows_triton(x, cos_sin, fp32=fp32)


def _rope_rows_fake(x: torch.Tensor, cos_sin: torch.Tensor, fp32: bool) -> torch.Tensor:
    check_rope_shapes(x, cos_sin)
    return x.new_empty(x.shape, dtype=rope_rows_dtype(x, cos_sin, fp32))


# ----------------------------------------------------------------------------------------------
# Registration: a ``torch.library.Library`` with each implementation registered directly (the
# reference for every device, the Triton one for CUDA, a fake for meta tensors and tracing), not
# ``torch.library.custom_op``, whose kernels run inside a wrapper that checks the outputs for
# aliasing at every call: host time a cached step pays per launch, three or four times per layer on CUDA.

def _no_backward(name: str, ctx, grad):
    raise RuntimeError(f"dllm::{name} has no backward: the one-launch operators are for inference (the fused "
                       "layer runs only without autograd); differentiate the reference in dllm.kernels.layer_ops")


_LIB = torch.library.Library("dllm", "DEF")
for _name, _schema, _reference, _cuda, _fake in (
        ("rms_norm", "(Tensor x, Tensor weight, float eps, bool round_once) -> Tensor",
         _rms_norm_op, _rms_norm_cuda, _rms_norm_fake),
        ("rms_norm_qk", "(Tensor x, Tensor q_weight, Tensor k_weight, int n_q, float eps, bool round_once) -> Tensor",
         _rms_norm_qk_op, _rms_norm_qk_cuda, _rms_norm_qk_fake),
        ("rope_rows", "(Tensor x, Tensor cos_sin, bool fp32) -> Tensor", _rope_rows_op, _rope_rows_cuda,
         _rope_rows_fake)):
    _LIB.define(_name + _schema)
    _LIB.impl(_name, _reference, "CompositeExplicitAutograd")
    _LIB.impl(_name, _cuda, "CUDA")
    torch.library.register_fake(f"dllm::{_name}", _fake, lib=_LIB)
    torch.library.register_autograd(f"dllm::{_name}", functools.partial(_no_backward, _name), lib=_LIB)

# ----------------------------------------------------------------------------------------------
# Python entry points

_RMS_NORM = torch.ops.dllm.rms_norm.default
_RMS_NORM_QK = torch.ops.dllm.rms_norm_qk.default
_ROPE_ROWS = torch.ops.dllm.rope_rows.default


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float, *, round_once: bool) -> torch.Tensor:
    """RMSNorm of x [..., D] by weight [D] as one op -> contiguous [..., D] (``rms_norm_dtype``).

    round_once=False (LLaDA, Dream/Qwen2): normalise in float32, round to x's dtype, multiply by
    the weight in the result dtype. round_once=True (SDAR): multiply in float32, round once.
    Equals ``dllm.kernels.layer_ops.rms_norm_one_op`` bit for bit off CUDA; on CUDA it may differ by an
    ulp where the sum of squares, reduced in another order, rounds differently."""
    return _RMS_NORM(x, weight, float(eps), bool(round_once))


def rms_norm_qk(x: torch.Tensor, q_weight: torch.Tensor, k_weight: torch.Tensor, n_q: int, eps: float, *,
                round_once: bool) -> torch.Tensor:
    """Per-head RMSNorm of q and k side by side as one op: x [..., H', hd] (any strides; the q|k
    slice of a fused qkv row), heads ``[0, n_q)`` normalised with ``q_weight`` [hd] and the others
    with ``k_weight`` [hd] -> contiguous [..., H', hd]. Each head rounds as ``rms_norm``; equals
    ``dllm.kernels.layer_ops.rms_norm_qk`` (two ``rms_norm_one_op`` and a ``cat``) bit for bit off
    CUDA, and up to ``rms_norm``'s ulp on CUDA."""
    return _RMS_NORM_QK(x, q_weight, k_weight, int(n_q), float(eps), bool(round_once))


def rope_rows(x: torch.Tensor, cos_sin: torch.Tensor, *, fp32: bool) -> torch.Tensor:
    """Rotate x [B, T, H', hd] (q and k heads side by side, any strides) by ``cos_sin``
    [B|1, T|1, 2, 1, hd] (``RopeTable.lookup``: cos, signed sin) as one op -> contiguous
    [B, T, H', hd] (``rope_rows_dtype``). fp32: rotate in float32 and round once (LLaDA); else in
    the result dtype. Equals ``dllm.kernels.layer_ops.rope_rows`` bit for bit off CUDA; the CUDA kernel
    reproduces its roundings (each product, then the sum; or float32 throughout, rounded once)."""
    return _ROPE_ROWS(x, cos_sin, bool(fp32))


__all__ = ["KERNEL_DTYPES", "check_norm_shapes", "check_rope_shapes", "rms_norm", "rms_norm_dtype",
           "rms_norm_qk", "rms_norm_supported", "rope_rows", "rope_rows_dtype", "rope_rows_supported",
           "triton_kernels", "triton_unavailable"]
