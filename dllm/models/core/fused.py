"""Fused projections for the fused inference layer: the same transformer layer in fewer, larger ops.

A GPU runs a cached decode step's small matmuls in microseconds, so the step is bound by the ops
Python issues per layer. ``TransformerBlock``'s fused path (``dllm.models.core.fused_layer``) is made of
``FusedWeight`` (here), the one-op norm (``dllm.models.core.norm.fused_norm``) and the table RoPE of q
and k together (``dllm.models.core.rope.rope_rows``); the module-by-module path in ``transformer.py`` stays beside it as
the reference, and the tests compare the two (tests/models/core/test_fused.py).

- ``FusedWeight``: the q/k/v (or gate/up) weights concatenated into one matrix, with the original
  ``nn.Linear`` parameters re-pointed into it (no second copy of the weights; ``state_dict``, the
  checkpoint key maps, saving, training and quantization still see the separate projections).
  ``valid()`` notices when something replaced a parameter (``load_state_dict``, ``.to()``), and
  the layer then fuses again.
"""

from __future__ import annotations

from typing import Optional, Sequence

import torch
import torch.nn as nn
import torch.nn.functional as F


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
    """``current`` while its projections still read its memory, else the projections fused anew
    (None when they cannot be: ``fusable``)."""
    if current is not None and current.valid():
        return current
    return FusedWeight(linears) if fusable(linears) else None


__all__ = ["FusedWeight", "fusable", "refused"]


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
