"""A non-numeric numeric config.json field (``"rope_theta": "abc"``, ``true``, ``"10000"``) is refused with a
ValueError naming the family's file, the field and the value, for every family: ``float("abc")`` alone
names neither, and ``float(True)`` / ``float("10000")`` were silently accepted."""

from __future__ import annotations

from typing import Any

import pytest

from dllm.models import tiny
from dllm.models.families.llada2 import moe_from_hf
from dllm.models.families.registry import class_for_model_type

FAMILY_NAME = {"dream": "Dream", "sdar": "SDAR", "fastdllm_v2": "Fast-dLLM v2", "llada2": "LLaDA2", "llada": "LLaDA"}
BAD_NUMBERS = ["abc", True, "10000"]


def _config(family: str, **changes: Any) -> dict[str, Any]:
    """The config.json a tiny ``family`` model saves, with ``changes``."""
    return {**tiny(family, seed=0).official_config(), **changes}


def _read(hf: dict[str, Any]) -> Any:
    return class_for_model_type(hf["model_type"]).from_hf_config(hf)


@pytest.mark.parametrize("family", ["dream", "sdar", "fastdllm_v2", "llada2", "llada"])
@pytest.mark.parametrize("field", ["rope_theta", "rms_norm_eps"])
@pytest.mark.parametrize("value", BAD_NUMBERS, ids=repr)
def test_non_numeric_float_field_is_named(family: str, field: str, value: Any) -> None:
    with pytest.raises(ValueError, match=rf"^{FAMILY_NAME[family]} config\.json field {field} = {value!r} is not "
                                         r"a number; it must be a JSON number"):
        _read(_config(family, **{field: value}))


@pytest.mark.parametrize("field", ["partial_rotary_factor", "routed_scaling_factor"])
@pytest.mark.parametrize("value", [*BAD_NUMBERS, None], ids=repr)
def test_llada2_optional_float_field_is_named(field: str, value: Any) -> None:
    with pytest.raises(ValueError, match=rf"^LLaDA2 config\.json field {field} = {value!r} is not a number"):
        _read(_config("llada2", **{field: value}))


@pytest.mark.parametrize("field", ["block_size", "head_dim"])
@pytest.mark.parametrize("value", ["8", True, 4.5], ids=repr)
def test_llada2_integer_field_is_named(field: str, value: Any) -> None:
    with pytest.raises(ValueError, match=rf"^LLaDA2 config\.json field {field} = {value!r} is not an integer"):
        _read(_config("llada2", **{field: value}))


@pytest.mark.parametrize("family", ["dream", "sdar", "fastdllm_v2", "llada2", "llada"])
def test_numbers_still_read(family: str) -> None:
    """JSON integers are numbers (``"rope_theta": 10000``); a tiny model's own config reads back unchanged."""
    model = tiny(family, seed=0)
    config, _ = _read(_config(family, rope_theta=10000))
    assert config.rope_theta == 10000.0 and isinstance(config.rope_theta, float)
    config, _ = _read(_config(family))
    assert config.rms_eps == model.config.rms_eps and config.block_size == model.config.block_size
    assert config.rope_dim == model.config.rope_dim


def test_llada2_absent_optional_fields_take_their_defaults() -> None:
    hf = _config("llada2")
    for name in ("partial_rotary_factor", "rotary_dim", "routed_scaling_factor", "block_size"):
        del hf[name]
    config, _ = _read(hf)
    assert config.rope_dim is None and config.block_size == 32
    assert moe_from_hf(hf).routed_scaling == 1.0
