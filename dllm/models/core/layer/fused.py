"""The fused inference layer: the same transformer layer in fewer, larger ops.

A GPU runs a cached decode step's small matmuls in microseconds, so the step is bound by the ops
Python issues per layer, and by the Python around them. ``TransformerBlock``'s fused path is made of
``FusedWeight`` (the q/k/v and gate/up projections as one matrix each), the one-op norm
(``dllm.models.core.layer.norm.fused_norm``) and the table RoPE of q and k together
(``dllm.kernels.layer_ops.rope_rows``); the module-by-module path in ``transformer.py`` stays beside
it as the reference, and the tests compare the two (tests/models/core/test_fused.py): the same values,
bit for bit off CUDA.

- ``FusedWeight``: the q/k/v (or gate/up) weights concatenated into one matrix, with the original
  ``nn.Linear`` parameters re-pointed into it (no second copy of the weights; ``state_dict``, the
  checkpoint key maps, saving, training and quantization still see the separate projections).
  ``valid()`` notices when something replaced a parameter (``load_state_dict``, ``.to()``), and
  the layer then fuses again.
- ``FusedLayer``, ``fused_qkv_rows``, ``fused_residual_out``: the layer's two halves as plain
  functions over its modules and fused weights gathered once (``Transformer.fused_layers``). They
  read parameters from the modules' ``_parameters`` and plain attributes (never
  ``nn.Module.__getattr__``, a Python call per read) and call no module but a hooked or replaced
  projection.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Optional, Sequence

import torch
import torch.nn as nn
import torch.nn.functional as F
import torch.nn.modules.module as _mod

from dllm.kernels.fused_ops import rope_rows as op_rope_rows
from dllm.kernels.layer_ops import rope_rows, rope_rows_pair
from dllm.models.core.layer.norm import RMSNorm, fused_norm, qk_norms_fused


class FusedWeight:
    """One weight matrix [sum(out), in] (and bias) made of several ``nn.Linear`` layers' weights,
    whose parameters are re-pointed to slices of it (they share its memory)."""

    def __init__(self, linears: Sequence[nn.Linear]) -> None:
        self.linears = tuple(linears)
        with torch.no_grad():
            self.weight = torch.cat([lin.weight.detach() for lin in linears])  # [N, D]
            has_bias = [lin.bias is not None for lin in linears]
            self.bias: Optional[torch.Tensor] = None
            if any(has_bias):
                self.bias = torch.cat([lin.bias.detach() if lin.bias is not None else  # type: ignore[union-attr]
                                       lin.weight.new_zeros(lin.out_features) for lin in linears])
            start = 0
            for lin in linears:
                end = start + lin.out_features
                lin.weight.data = self.weight[start:end]
                if lin.bias is not None and self.bias is not None:
                    lin.bias.data = self.bias[start:end]
                start = end
        self._ptrs = self._pointers()

    def _pointers(self) -> tuple[int, ...]:
        out = []
        for lin in self.linears:
            out.append(lin.weight.data_ptr())
            out.append(-1 if lin.bias is None else lin.bias.data_ptr())
        return tuple(out)

    def valid(self) -> bool:
        """The projections still read this memory (no parameter was replaced since fusing)."""
        return self._pointers() == self._ptrs


def fusable(linears: Sequence[nn.Module]) -> bool:
    """Plain ``nn.Linear`` layers with floating weights on one real device and dtype, no hooks (a
    forward hook must see its module run; accelerate's offload hooks (``_hf_hook``) load weights that
    sit on the meta device until the module runs)."""
    first = linears[0]
    if not all(type(lin) is nn.Linear and not hasattr(lin, "_hf_hook") for lin in linears):
        return False
    w = first.weight
    if w.device.type == "meta":
        return False
    return all(type(lin.weight.data) is torch.Tensor  # not a quantized tensor subclass
               and (lin.bias is None or type(lin.bias.data) is torch.Tensor)
               and lin.weight.dtype == w.dtype and lin.weight.device == w.device and w.is_floating_point()
               and not lin._forward_hooks and not lin._forward_pre_hooks for lin in linears)


def refused(current: Optional[FusedWeight], linears: Sequence[nn.Module]) -> Optional[FusedWeight]:
    """``current`` while it was fused from these very ``linears`` (a projection module replaced by
    assignment, as ``dllm.models.quantize``'s NF4 layers, leaves ``current`` holding the old ones) and
    they still read its memory, else the projections fused anew (None when they cannot be: ``fusable``)."""
    if (current is not None and len(current.linears) == len(linears)
            and all(a is b for a, b in zip(current.linears, linears)) and current.valid()):
        return current
    return FusedWeight(linears) if fusable(linears) else None


def plain_weight(module: nn.Module) -> Optional[torch.Tensor]:
    """The weight of a bias-free ``nn.Linear`` the fused path may run as ``F.linear`` (``fusable``:
    plain, unhooked, a real floating weight), else None: the module is called."""
    if not fusable([module]) or module.bias is not None:
        return None
    return module.weight


def linear_or_module(module: nn.Module, weight: Optional[torch.Tensor], x: torch.Tensor) -> torch.Tensor:
    """``F.linear(x, weight)`` while ``weight`` (``plain_weight`` of ``module``) is still the module's
    and no hook is on it, else the module itself (its hooks run, a replaced weight is used)."""
    if (weight is None or module._forward_hooks or module._forward_pre_hooks
            or module._parameters.get("weight") is not weight):
        return module(x)
    return F.linear(x, weight)


def watched(module: nn.Module) -> bool:
    """Whether ``module(...)`` runs anything around ``module.forward``: a hook on the module, a global
    module hook, or a compiled call (``module.compile()`` routes the call)."""
    return bool(module._forward_hooks or module._forward_pre_hooks or module._backward_hooks
                or module._backward_pre_hooks or module._compiled_call_impl is not None
                or _mod._global_forward_hooks or _mod._global_forward_pre_hooks or _mod._global_backward_hooks
                or _mod._global_backward_pre_hooks)


def call_module(module: nn.Module, *args: Any, **kwargs: Any) -> Any:
    """``module(*args, **kwargs)``, skipping ``nn.Module.__call__``'s dispatch when nothing would run
    around ``forward`` (``watched``). A replaced ``forward`` (accelerate's device-map wrapper) is
    what runs either way."""
    return module(*args, **kwargs) if watched(module) else module.forward(*args, **kwargs)


@dataclass(frozen=True)
class FusedLayer:
    """What one layer's fused path reads, gathered once (``Transformer.fused_layers``): the q/k/v and
    gate/up ``FusedWeight``, whether norms and RoPE run as the one-launch operators, the layer's
    modules, and the output and down projections' weights when they may run as ``F.linear`` (None:
    their modules are called; ``linear_or_module`` checks their hooks and weights at every call)."""

    qkv: FusedWeight
    gate_up: Optional[FusedWeight]  # None: an MoE feed-forward, run as its module
    ops: bool
    attn: nn.Module  # the layer's Attention (head counts, q/k norms)
    mlp: nn.Module  # its MLP or SparseMoE
    attn_norm: RMSNorm
    mlp_norm: RMSNorm
    o_proj: nn.Linear
    down_proj: Optional[nn.Linear]  # None with an MoE feed-forward
    o_weight: Optional[torch.Tensor] = None
    down_weight: Optional[torch.Tensor] = None


def fused_qkv_rows(p: FusedLayer, h: torch.Tensor, cos: torch.Tensor, sin: Optional[torch.Tensor] = None
                   ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The attention norm, q/k/v in one matmul and one rotation of q and k together: h [B, T, D] ->
    q [B, H, T, hd], k and v [B, Hkv, T, hd] (strided views). ``cos``, ``sin``: the RoPE table's cos
    and signed sin [B, T, 1, hd] (``Transformer.forward`` unbinds the table once for every layer); with
    ``sin`` None, ``cos`` is the whole table [B, T, 2, 1, hd] (``RopeTable.lookup``), which the
    one-launch ``dllm::rope_rows`` takes."""
    attn = p.attn
    b, t, _ = h.shape
    nh, nk, hd = attn.n_heads, attn.n_kv_heads, attn.head_dim
    w = p.qkv
    qkv = F.linear(fused_norm(p.attn_norm, h, p.ops), w.weight, w.bias).view(b, t, nh + 2 * nk, hd)  # [B, T, H + 2Hkv, hd]
    if attn.qk_norm:
        qk = qk_norms_fused(attn.q_norm, attn.k_norm, qkv, nh, nk, p.ops)  # [B, T, H + Hkv, hd]
        v = qkv[:, :, nh + nk:]  # [B, T, Hkv, hd]
    else:
        qk, v = qkv.split_with_sizes([nh + nk, nk], dim=2)  # views: one call for both
    rd, fp32 = cos.shape[-1], attn.rope_fp32
    if rd < hd:  # partial rotary (LLaDA 2.x): the first rd channels turn, the rest pass
        turned = rope_rows(qk[..., :rd], cos, fp32=fp32) if sin is None else rope_rows_pair(qk[..., :rd], cos, sin,
                                                                                            fp32=fp32)
        qk = torch.cat((turned, qk[..., rd:]), dim=-1)
    elif sin is None:
        qk = (op_rope_rows if p.ops else rope_rows)(qk, cos, fp32=fp32)
    else:
        qk = rope_rows_pair(qk, cos, sin, fp32=fp32)
    q, k = qk.transpose(1, 2).split_with_sizes([nh, nk], dim=1)  # [B, H|Hkv, T, hd]
    return q, k, v.transpose(1, 2)


def fused_residual_out(p: FusedLayer, h: torch.Tensor, out: torch.Tensor) -> torch.Tensor:
    """h [B, T, D], attention output [B, H, T, hd] -> the layer's output [B, T, D]: the output
    projection and residual, the MLP norm, one gate-up matmul, SiLU times up, down and residual."""
    b, _, t, _ = out.shape
    h = h + linear_or_module(p.o_proj, p.o_weight, out.transpose(1, 2).reshape(b, t, -1))  # [B, T, D]
    x = fused_norm(p.mlp_norm, h, p.ops)
    if p.gate_up is None:  # an MoE feed-forward (LLaDA 2.x): its module
        return h + p.mlp(x)
    gate, up = F.linear(x, p.gate_up.weight).chunk(2, dim=-1)  # [B, T, F] each (views)
    return h + linear_or_module(p.down_proj, p.down_weight, F.silu(gate).mul_(up))


__all__ = ["FusedLayer", "FusedWeight", "call_module", "fusable", "fused_qkv_rows", "fused_residual_out",
           "linear_or_module", "plain_weight", "refused", "watched"]
