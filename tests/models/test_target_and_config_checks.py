"""Checks made before work is done: ``load_target`` refuses a quantization the requested dtype cannot take
before it reads any weight, and LLaDA's config.json reader names a non-numeric numeric field."""

from __future__ import annotations

from typing import Any, Union

import pytest
import torch
import transformers

import dllm.models.targets as targets
from dllm.models.families.llada import LLaDA
from dllm.models.loading import locate, read_config
from dllm.models.quantize import QuantizationError


@pytest.mark.parametrize("quantization,dtype", [("int8", torch.float64), ("nf4", "float64"), ("int4", "double")])
def test_load_target_refuses_quantization_dtype_before_reading_weights(
        monkeypatch: pytest.MonkeyPatch, quantization: str, dtype: Union[torch.dtype, str]) -> None:
    read: list[str] = []

    def no_weights(*args: Any, **kwargs: Any) -> Any:
        read.append("weights")
        raise AssertionError("a weight was read before the quantization/dtype check")

    monkeypatch.setattr(targets, "check_local_weights", no_weights)
    monkeypatch.setattr(transformers.AutoModelForCausalLM, "from_pretrained", no_weights)
    with pytest.raises(QuantizationError, match=rf"quantization '{quantization}' needs .*got float64"):
        targets.load_target("tiny-ar", dtype=dtype, quantization=quantization)
    assert read == []


def _llada_config(**changes: Any) -> dict[str, Any]:
    hf = read_config(locate("tiny-llada"))
    hf.update(changes)
    return hf


@pytest.mark.parametrize("field,value", [("rope_theta", "x"), ("rms_norm_eps", "eps"), ("rope_theta", True)])
def test_llada_non_numeric_field_is_named(field: str, value: Any) -> None:
    with pytest.raises(ValueError, match=rf"LLaDA config\.json field {field} = {value!r} is not a number"):
        LLaDA.from_hf_config(_llada_config(**{field: value}))


def test_llada_non_numeric_mlp_ratio_is_named() -> None:
    hf = _llada_config(mlp_ratio="4")
    del hf["mlp_hidden_size"]  # mlp_ratio is read only without mlp_hidden_size
    with pytest.raises(ValueError, match=r"LLaDA config\.json field mlp_ratio = '4' is not a number"):
        LLaDA.from_hf_config(hf)


def test_llada_numeric_fields_still_read() -> None:
    hf = _llada_config(rope_theta=10000, mlp_ratio=2)
    del hf["mlp_hidden_size"]
    config, _ = LLaDA.from_hf_config(hf)
    assert config.rope_theta == 10000.0 and isinstance(config.rope_theta, float)
    assert config.mlp_hidden == 2 * hf["d_model"]


def test_tensor_parallel_with_quantization_none_is_no_quantization():
    # "none" asks for no quantization: only a real method is refused with tensor_parallel (outside
    # torchrun the plan then asks for the ranks' processes)
    with pytest.raises(ValueError, match="needs one process per rank"):
        targets.load_target("tiny-ar", tensor_parallel=2, quantization="none")
    with pytest.raises(ValueError, match="with quantization='int8' is not supported"):
        targets.load_target("tiny-ar", tensor_parallel=2, quantization="int8")
