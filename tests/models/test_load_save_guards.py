"""Saving, device maps, quantized targets and ``tiny``: a refused call changes nothing and names the bad value."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest
import torch

import dllm
from dllm.models import tiny
from dllm.models.checkpoint import SINGLE_FILE, open_checkpoint
from dllm.models.families.pretrained import TransformerLM
from dllm.models.families.registry import class_for_model_type
from dllm.models.loading import EMBEDDED_DIR, read_config
from dllm.models.parallel.plan import ParallelPlan
from dllm.models.parallel.shard import TensorParallel, splits_vocab
from dllm.models.quantize import QuantizationError

from .helpers import random_ids

TORCHAO = pytest.mark.skipif(importlib.util.find_spec("torchao") is None, reason="torchao is not installed")
BNB = pytest.mark.skipif(importlib.util.find_spec("bitsandbytes") is None, reason="bitsandbytes is not installed")


def listing(path: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted(path.iterdir())}


@pytest.mark.parametrize("bad", [0, -5, "1MB", True, 1.5e6])
def test_a_bad_max_shard_size_leaves_an_earlier_save_as_it_was(tmp_path, bad):
    """The old weights were removed before max_shard_size was checked: a refused save left config.json
    and no weights (0, -5), or failed with a TypeError ('1MB')."""
    model = tiny("llada")
    model.save_pretrained(tmp_path)
    before = listing(tmp_path)
    with pytest.raises(ValueError, match=rf"max_shard_size must be None \(one file\) or a positive int .*got {bad!r}"):
        model.save_pretrained(tmp_path, max_shard_size=bad)
    assert listing(tmp_path) == before
    ids = random_ids(model, 2, 6)
    with torch.no_grad():
        assert torch.equal(dllm.load(tmp_path)(ids).logits, model(ids).logits)


def test_saving_removes_only_its_own_weight_files(tmp_path):
    """Every ``model*.safetensors`` was deleted, a file the layout never reads (an EMA copy, a
    transformers ``variant``) included; the earlier save's shards and index still go."""
    model = tiny("dream")
    model.save_pretrained(tmp_path, max_shard_size=50_000)
    others = {"model_ema.safetensors": b"ema", "model.fp16.safetensors": b"variant", "model-notes.safetensors": b"x"}
    for name, data in others.items():
        (tmp_path / name).write_bytes(data)
    model.save_pretrained(tmp_path)
    assert sorted(p.name for p in tmp_path.glob("model*")) == sorted([SINGLE_FILE, *others])
    assert all((tmp_path / name).read_bytes() == data for name, data in others.items())


def split_rank0(name: str = "tiny-random-dream") -> TransformerLM:
    """Rank 0 of a tensor_parallel=2 load, built as ``dllm.load`` builds it (its slices assigned),
    without a process group: saving never reaches a collective."""
    directory = EMBEDDED_DIR / name
    hf = read_config(directory)
    cls = class_for_model_type(hf["model_type"])
    config, special = cls.from_hf_config(hf, None)
    with torch.device("meta"):
        model = cls(config, special, hf_config=hf)
    model.sharding = TensorParallel(ParallelPlan(2, 0), None, None, splits_vocab(config, 2))
    model.load_official(open_checkpoint(directory), dtype=torch.float32)
    return model


def test_a_model_split_over_ranks_refuses_to_save(tmp_path):
    """Each rank wrote its slices (half the heads and MLP columns) under the whole model's config.json:
    a checkpoint that no loader reads back."""
    model = split_rank0()
    assert model.transformer.layers[0].attn.q_proj.weight.shape[0] == model.config.d_model // 2
    with pytest.raises(ValueError, match=r"tensor_parallel=2 ranks: rank 0 holds only its slices"):
        model.save_pretrained(tmp_path / "out")
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize("device_map, match", [
    ({"": "meta"}, r"device_map\[''\] = 'meta': device 'meta': dllm runs on cpu, cuda or mps"),
    ({"": "disk"}, r"device_map\[''\] = 'disk': device 'disk' is not a device name; available devices: cpu"),
    ({"transformer": "cuda:7"}, r"device_map\['transformer'\] = 'cuda:7': device 'cuda:7'"),
    ({"": 7}, r"device_map\[''\] = 7: device 'cuda:7'"),
    ({0: "cpu"}, r"device_map keys are module names"),
    ("balanced", r"device_map must be 'auto' or a dict"),
])
def test_a_device_map_is_checked_before_any_weight_is_read(monkeypatch, device_map, match):
    """``{"": "meta"}`` loaded a model without weights; a GPU that is not there failed inside torch
    (an AssertionError) after the whole checkpoint was read."""
    def no_read(*args, **kwargs):
        raise AssertionError("a weight was read")

    monkeypatch.setattr("dllm.models.loading.open_checkpoint", no_read)
    with pytest.raises(ValueError, match=match):
        dllm.load("tiny-random-llada", device_map=device_map)


def test_a_device_map_on_the_cpu_still_loads():
    model = dllm.load("tiny-random-llada", device_map={"": "cpu"})
    assert model.device.type == "cpu"


@pytest.mark.parametrize("method", [pytest.param("int8", marks=TORCHAO), pytest.param("int4", marks=TORCHAO),
                                    pytest.param("nf4", marks=BNB)])
def test_a_quantized_target_refuses_save_pretrained(tmp_path, method):
    """transformers' save_pretrained failed inside torch on torchao's weights ("invalid python storage")
    and wrote NF4's packed ``qweight`` under the float config.json (a checkpoint missing every weight)."""
    target, _ = dllm.load_target("tiny-ar", quantization=method)
    with pytest.raises(QuantizationError, match=rf"cannot save a {method}-quantized model"):
        target.save_pretrained(tmp_path / "out")
    assert not (tmp_path / "out").exists()
    float_target, _ = dllm.load_target("tiny-ar")
    float_target.save_pretrained(tmp_path / "float")  # a float target still saves
    assert (tmp_path / "float" / SINGLE_FILE).is_file()


def test_tiny_takes_dtype_names_and_checks_the_device():
    """``tiny(dtype="bfloat16")`` failed with "Invalid device string: 'bfloat16'"; ``tiny("llada2",
    device="cpu")`` was refused as not the CPU."""
    assert tiny("dream", dtype="bfloat16").dtype == torch.bfloat16
    assert tiny("sdar", dtype="fp16").hf_config["torch_dtype"] == "float16"
    with pytest.raises(ValueError, match=r"dtype 'int32' is not supported; valid: .*bfloat16"):
        tiny("llada", dtype="int32")
    with pytest.raises(ValueError, match=r"device 'gpu' is not a device name; available devices: cpu"):
        tiny("llada", device="gpu")
    assert tiny("llada2", device="cpu").device.type == "cpu"
