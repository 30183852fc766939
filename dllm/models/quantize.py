"""Weight-only quantization of a loaded model's linear layers through maintained libraries.

``dllm.load(name, quantization="int8")`` (and ``load_target``, the DFlash drafter loaders) call
``quantize_model`` on the loaded float model. Methods (``QUANTIZATIONS``):

- ``int8``: torchao ``Int8WeightOnlyConfig``: symmetric int8 per output row (one float scale per
  row), dequantised inside the matmul. Activations stay in the model dtype.
- ``int4``: torchao ``IntxWeightOnlyConfig(weight_dtype=torch.int4, PerGroup(g), MappingType.ASYMMETRIC)``:
  asymmetric int4 values with a scale and zero point per group of ``g`` input columns (the largest of
  32/16/8 that divides the layer's width; per row otherwise). The 16 levels span the group's
  ``[min(min, 0), max(max, 0)]`` (torchao's affine qparams keep 0 exact), so a weight is off by at
  most half a step, a 30th of that span. torchao >= 0.15 keeps these values one per byte
  (``IntxUnpackedToInt8Tensor``): int4 accuracy at int8 storage on CPU. The packed CPU int4 layout
  (``Int4OpaqueTensor``) exists only in torchao <= 0.14, which does not support this torch.
- ``nf4``: bitsandbytes ``Linear4bit`` (4-bit NormalFloat, blocks of 64 with double-quantised
  absmax; QLoRA, arXiv 2305.14314), two values per byte, on the CPU backend of bitsandbytes >= 0.46
  or on CUDA.

Embeddings, norms and an LM head that shares the embedding matrix stay in the model dtype. A
quantized model decodes like any other; it cannot be saved in the official layout (the official
formats hold float weights). ``weight_bytes`` measures what the weights really occupy (a quantized
tensor's int data plus its scales), the number ``benchmarks/quantize.py`` reports.
"""

from __future__ import annotations

import types
from dataclasses import dataclass
from typing import Any, Callable, Iterator, Optional

import torch
import torch.nn as nn

from dllm.lazy import quiet_import_chatter


class QuantizationError(ValueError):
    """A quantization the installed libraries, the device or the dtype cannot do."""


@dataclass(frozen=True)
class Method:
    """One quantization method: the library that performs it and where it runs."""

    name: str
    library: str  # the pip package that implements it
    min_version: str  # the oldest version of that package dllm uses for it
    devices: tuple[str, ...]  # torch device types it runs on here
    dtypes: tuple[torch.dtype, ...]  # model dtypes it accepts
    description: str


_HALF = (torch.float32, torch.bfloat16, torch.float16)
QUANTIZATIONS: dict[str, Method] = {
    "int8": Method("int8", "torchao", "0.15", ("cpu", "cuda"), _HALF,
                   "int8 weights, one scale per output row (torchao Int8WeightOnlyConfig)"),
    "int4": Method("int4", "torchao", "0.15", ("cpu", "cuda"), _HALF,
                   "int4 weights, scale + zero point per group of 32 columns (torchao IntxWeightOnlyConfig); "
                   "stored one value per byte by torchao"),
    "nf4": Method("nf4", "bitsandbytes", "0.46", ("cpu", "cuda"), _HALF,
                  "4-bit NormalFloat, blocks of 64, packed two per byte (bitsandbytes Linear4bit)"),
}
NONE_NAMES = (None, "none", "")  # no quantization


def valid_names() -> str:
    return ", ".join(["none", *QUANTIZATIONS])


def check_quantization(quantization: Any) -> Optional[Method]:
    """The ``Method`` named by ``quantization`` (None / "none": no quantization; names in any case,
    "INT8" and "None" as "int8" and "none"); a ``QuantizationError`` naming the value and the valid ones
    otherwise."""
    name = quantization.lower() if isinstance(quantization, str) else quantization
    if name in NONE_NAMES:
        return None
    if not isinstance(name, str) or name not in QUANTIZATIONS:
        raise QuantizationError(f"unknown quantization {quantization!r}; valid: {valid_names()}")
    return QUANTIZATIONS[name]


def _version_tuple(text: str) -> tuple[int, ...]:
    out = []
    for part in text.split("+")[0].split(".")[:3]:
        digits = "".join(c for c in part if c.isdigit())
        out.append(int(digits) if digits else 0)
    return tuple(out)


def import_library(method: Method) -> Any:
    """Import the method's library (its import-time chatter about optional compiled kernels kept
    quiet); ``QuantizationError`` with the pip command when it is missing or too old."""
    hint = f"pip install '{method.library}>={method.min_version}'"
    try:
        with quiet_import_chatter():
            module = __import__(method.library)
    except ImportError as e:
        raise QuantizationError(f"quantization {method.name!r} needs {method.library}, which is not installed "
                                f"({e}); {hint}") from None
    version = getattr(module, "__version__", "0")
    if _version_tuple(version) < _version_tuple(method.min_version):
        raise QuantizationError(f"quantization {method.name!r} needs {method.library} >= {method.min_version}, "
                                f"found {version}; {hint}")
    return module


def check_target(method: Method, device: torch.device, dtype: torch.dtype) -> None:
    """``QuantizationError`` when the model's device or dtype is one the method cannot run on."""
    if device.type not in method.devices:
        raise QuantizationError(f"quantization {method.name!r} ({method.library}) does not run on device "
                                f"{str(device)!r}; valid devices: {', '.join(method.devices)}")
    if dtype not in method.dtypes:
        raise QuantizationError(f"quantization {method.name!r} needs the model in "
                                f"{', '.join(str(d).removeprefix('torch.') for d in method.dtypes)}, got "
                                f"{str(dtype).removeprefix('torch.')}; load with dtype='float32' or 'bfloat16'")


# ----------------------------------------------------------------------------------------------
# Which layers


def tied_linears(model: nn.Module) -> set[int]:
    """ids of Linear modules whose weight IS an embedding's matrix (a tied LM head): quantizing
    them would untie the head from the (float) embedding."""
    embeds = {id(m.weight) for m in model.modules() if isinstance(m, nn.Embedding)}
    return {id(m) for m in model.modules() if isinstance(m, nn.Linear) and id(m.weight) in embeds}


def quantizable_linears(model: nn.Module) -> list[tuple[str, nn.Linear]]:
    """(name, module) of every plain ``nn.Linear`` that will be quantized, in module order."""
    tied = tied_linears(model)
    return [(n, m) for n, m in model.named_modules() if type(m) is nn.Linear and id(m) not in tied]


def int4_group_size(in_features: int, preferred: int = 32) -> Optional[int]:
    """The largest of ``preferred``, 16, 8 that divides ``in_features`` (None: per row)."""
    for g in (preferred, 16, 8):
        if g <= preferred and in_features % g == 0:
            return g
    return None


# ----------------------------------------------------------------------------------------------
# bitsandbytes NF4 as a module that still answers ``.weight`` in the model dtype


class NF4Linear(nn.Module):
    """A Linear whose weight is bitsandbytes NF4 (``qweight``: packed uint8 + its quant state).

    ``weight`` dequantizes on access: code that reads ``layer.weight.dtype`` / ``.device`` (the KV
    cache allocator, a DFlash drafter's input cast) or multiplies by it sees the float matrix the
    layer computes with, not the packed bytes."""

    def __init__(self, linear: nn.Linear, bnb: Any) -> None:
        super().__init__()
        self.in_features, self.out_features = linear.in_features, linear.out_features
        self.compute_dtype = linear.weight.dtype
        weight = bnb.nn.Params4bit(linear.weight.data.to(torch.float32), requires_grad=False, quant_type="nf4")
        self.qweight = weight._quantize(linear.weight.device)
        self.bias = linear.bias
        self._matmul = bnb.matmul_4bit
        self._dequantize = bnb.functional.dequantize_4bit

    @property
    def weight(self) -> torch.Tensor:  # [out, in] in the compute dtype
        return self._dequantize(self.qweight, self.qweight.quant_state).to(self.compute_dtype)

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # [..., in] -> [..., out]
        out = self._matmul(x.to(self.compute_dtype), self.qweight.t(), quant_state=self.qweight.quant_state)
        out = out.to(x.dtype)
        return out if self.bias is None else out + self.bias.to(out.dtype)

    def extra_repr(self) -> str:
        return f"in_features={self.in_features}, out_features={self.out_features}, nf4"


# ----------------------------------------------------------------------------------------------
# Applying a method


def _set_child(model: nn.Module, name: str, module: nn.Module) -> None:
    parent_name, _, child = name.rpartition(".")
    setattr(model.get_submodule(parent_name) if parent_name else model, child, module)


def _torchao_config(method: Method, in_features: int) -> Any:
    from torchao.quantization import Int8WeightOnlyConfig, IntxWeightOnlyConfig
    from torchao.quantization.granularity import PerAxis, PerGroup
    from torchao.quantization.quant_primitives import MappingType

    if method.name == "int8":
        return Int8WeightOnlyConfig()
    group = int4_group_size(in_features)
    # ASYMMETRIC: a scale and a zero point per group, so the 16 levels span [min(min, 0), max(max, 0)]
    # (torchao's default, SYMMETRIC, fixes the zero point at 0 and spans [-absmax, absmax])
    return IntxWeightOnlyConfig(weight_dtype=torch.int4, granularity=PerAxis(0) if group is None else PerGroup(group),
                                mapping_type=MappingType.ASYMMETRIC)


def _quantizer(method: Method) -> Callable[[nn.Module, str, nn.Linear], None]:
    lib = import_library(method)
    if method.library == "torchao":
        from torchao.quantization import quantize_

        def apply(model: nn.Module, name: str, linear: nn.Linear) -> None:
            quantize_(linear, _torchao_config(method, linear.in_features))  # replaces linear.weight in place
        return apply

    def apply_nf4(model: nn.Module, name: str, linear: nn.Linear) -> None:
        _set_child(model, name, NF4Linear(linear, lib))
    return apply_nf4


def model_device_dtype(model: nn.Module) -> tuple[torch.device, torch.dtype]:
    """Device and dtype of the linear layers (the weights being quantized)."""
    linears = quantizable_linears(model)
    if not linears:
        raise QuantizationError(f"{type(model).__name__} has no nn.Linear layer to quantize")
    devices = {m.weight.device for _, m in linears}
    if len(devices) > 1:
        raise QuantizationError(f"the model's linear layers are spread over {sorted(map(str, devices))}; "
                                "quantize a model on one device (device=..., not device_map)")
    return devices.pop(), linears[0][1].weight.dtype


def quantize_model(model: nn.Module, quantization: Any) -> nn.Module:
    """Quantize ``model``'s linear layers in place with the named method; returns the model.

    quantization: "int8" | "int4" | "nf4" (None / "none": unchanged). The model must sit on one
    device the method runs on, in float32 / bfloat16 / float16. Records the method as
    ``model.quantization``. ``QuantizationError`` (a ValueError) names what is wrong and what is
    valid: an unknown method, a missing or old library, a device or dtype the method cannot use, a
    model that is already quantized.
    """
    method = check_quantization(quantization)
    if method is None:
        return model
    done = getattr(model, "quantization", None)
    if done:
        raise QuantizationError(f"the model is already quantized ({done!r}); load it again in float to "
                                f"quantize it as {method.name!r}")
    device, dtype = model_device_dtype(model)
    check_target(method, device, dtype)
    apply = _quantizer(method)
    with torch.no_grad():
        for name, linear in quantizable_linears(model):
            apply(model, name, linear)
    for module in model.modules():  # fused projections read the float weights: fuse again (or not)
        if hasattr(module, "invalidate_fused"):
            module.invalidate_fused()
    model.quantization = method.name
    guard_save(model)
    return model


def refuse_quantized_save(model: nn.Module) -> None:
    """``QuantizationError`` for a quantized model: the official layouts hold float weights."""
    method = getattr(model, "quantization", None)
    if method:
        raise QuantizationError(f"cannot save a {method}-quantized model in the official layout (it holds float "
                                "weights); save the float model, and quantize when loading (quantization=...)")


def _refused_save(model: nn.Module, *args: Any, **kwargs: Any) -> None:
    refuse_quantized_save(model)


def guard_save(model: nn.Module) -> None:
    """Make a quantized model's ``save_pretrained`` (and so ``push_to_hub``) refuse, as dllm's own do: a
    transformers target's (``load_target(quantization=...)``) would otherwise fail inside torch on
    torchao's weights, or write ``NF4Linear``'s packed ``qweight`` under a float config.json."""
    if callable(getattr(model, "save_pretrained", None)):
        model.save_pretrained = types.MethodType(_refused_save, model)


# ----------------------------------------------------------------------------------------------
# Measuring


def _inner_tensors(t: torch.Tensor) -> Iterator[torch.Tensor]:
    """The plain tensors that hold a (possibly quantized) tensor's data: a torchao subclass's
    ``__tensor_flatten__`` parts, a bitsandbytes ``Params4bit``'s bytes plus its quant state."""
    if hasattr(t, "__tensor_flatten__") and type(t) not in (torch.Tensor, nn.Parameter):
        names, _ = t.__tensor_flatten__()
        for n in names:
            yield from _inner_tensors(getattr(t, n))
        return
    yield t
    state = getattr(t, "quant_state", None)
    while state is not None:
        for part in (state.absmax, state.code, getattr(state, "offset", None)):
            if isinstance(part, torch.Tensor):
                yield part
        state = getattr(state, "state2", None)


def weight_bytes(model: nn.Module) -> int:
    """Bytes the model's parameters and buffers occupy (each shared tensor once); for quantized
    tensors the integer data plus scales / zero points / absmax, as stored."""
    seen: set[int] = set()
    total = 0
    for t in list(model.parameters()) + list(model.buffers()):
        if id(t) in seen:
            continue
        seen.add(id(t))
        total += sum(p.numel() * p.element_size() for p in _inner_tensors(t))
    return total


__all__ = ["NF4Linear", "QUANTIZATIONS", "QuantizationError", "Method", "check_quantization", "quantizable_linears",
           "quantize_model", "refuse_quantized_save", "weight_bytes"]
