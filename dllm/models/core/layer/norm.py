"""The RMSNorm module: the reference forward (the official order of each family, ``round_once`` for
SDAR) and the fused layer's form (``fused_norm``: ATen's one-kernel norm, or with ``ops`` the
one-launch ``dllm::rms_norm`` operator; ``qk_norms_fused``: the per-head q and k norms together, with
``ops`` one ``dllm::rms_norm_qk``). The math lives in ``dllm.kernels.layer_ops``.
"""

from __future__ import annotations

import torch
import torch.nn as nn

from dllm.kernels.fused_ops import rms_norm as fused_rms_norm
from dllm.kernels.fused_ops import rms_norm_qk as fused_rms_norm_qk
from dllm.kernels.layer_ops import rms_norm_one_op, rms_norm_reference


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float, round_once: bool = False) -> torch.Tensor:
    """RMSNorm in the official order: normalise in float32, cast back, THEN multiply by the weight
    (LLaDA, Qwen2); ``round_once``: multiply in float32 and cast once (SDAR's flash-attn kernel).

    x: [..., D] any float dtype; weight: [D]. Returns x's dtype (times weight's promotion).
    """
    return rms_norm_reference(x, weight, eps, round_once=round_once)


class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float, round_once: bool = False) -> None:
        super().__init__()
        self.eps = eps
        self.round_once = round_once
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return rms_norm(x, self.weight, self.eps, self.round_once)


def fused_norm(norm: RMSNorm, x: torch.Tensor, ops: bool = False) -> torch.Tensor:
    """``norm``'s RMSNorm of x [..., D] in one ATen kernel (``rms_norm_one_op``), or with ``ops`` as the
    one-launch operator ``dllm::rms_norm`` (a Triton kernel on CUDA; the same function elsewhere).
    Reads the module's current weight from ``_parameters``, without ``nn.Module.__getattr__`` (a Python
    call per read: the fused layer's Python is what bounds a cached step on a GPU)."""
    weight = norm._parameters["weight"]
    if ops:
        return fused_rms_norm(x, weight, norm.eps, round_once=norm.round_once)
    return rms_norm_one_op(x, weight, norm.eps, round_once=norm.round_once)


def qk_norms_fused(q_norm: RMSNorm, k_norm: RMSNorm, qkv: torch.Tensor, n_q: int, n_k: int,
                   ops: bool = False) -> torch.Tensor:
    """The per-head q and k norms (Qwen3 / SDAR) of a fused qkv row [B, T, H + 2Hkv, hd] (q: heads
    ``[0, n_q)``, k: the next ``n_k``) -> [B, T, H + Hkv, hd]: each module's ``fused_norm`` of its
    heads, concatenated, or with ``ops`` the one-launch ``dllm::rms_norm_qk`` (the same values)."""
    if ops and q_norm.eps == k_norm.eps and q_norm.round_once == k_norm.round_once:
        return fused_rms_norm_qk(qkv[:, :, :n_q + n_k], q_norm._parameters["weight"], k_norm._parameters["weight"],
                                 n_q, q_norm.eps, round_once=q_norm.round_once)
    return torch.cat((fused_norm(q_norm, qkv[:, :, :n_q], ops), fused_norm(k_norm, qkv[:, :, n_q:n_q + n_k], ops)),
                     dim=2)


__all__ = ["RMSNorm", "fused_norm", "qk_norms_fused", "rms_norm", "rms_norm_one_op", "rms_norm_reference"]
