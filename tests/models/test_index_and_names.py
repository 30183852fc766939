"""A sharded checkpoint is read by its index (shards inside the directory, only the listed tensors), and
quantization / dtype names are matched in any case."""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file

import dllm
from dllm.models import tiny
from dllm.models.checkpoint import INDEX_FILE, CheckpointError, open_checkpoint
from dllm.models.loading import resolve_dtype
from dllm.models.quantize import QUANTIZATIONS, QuantizationError, check_quantization

from .helpers import random_ids


def sharded(directory: Path) -> tuple[dict[str, str], str]:
    """A tiny LLaDA saved in shards under ``directory``: its weight_map and its first shard's name."""
    tiny("llada").save_pretrained(directory, max_shard_size=60_000)
    weight_map = json.loads((directory / INDEX_FILE).read_text())["weight_map"]
    return weight_map, sorted(set(weight_map.values()))[0]


def rewrite_index(directory: Path, weight_map: dict[str, str]) -> None:
    (directory / INDEX_FILE).write_text(json.dumps({"metadata": {}, "weight_map": weight_map}))


@pytest.mark.parametrize("bad", ["../../../outside.safetensors", "ABSOLUTE", "sub/model.safetensors", ".", ".."])
def test_a_shard_outside_the_directory_is_refused(tmp_path, bad):
    """The index's shard names were joined to the directory as given: ``../../x.safetensors`` and an
    absolute path were read from outside the checkpoint; "." failed as 'file ... does not exist'."""
    directory = tmp_path / "a" / "b" / "ckpt"
    weight_map, first = sharded(directory)
    outside = tmp_path / "outside.safetensors"
    shutil.move(str(directory / first), str(outside))  # a real shard: following the path would load it
    bad = str(outside) if bad == "ABSOLUTE" else bad
    if bad.startswith("sub/"):
        (directory / "sub").mkdir()
        shutil.copy(outside, directory / bad)
    key = next(k for k, v in weight_map.items() if v == first)
    rewrite_index(directory, {k: bad if v == first else v for k, v in weight_map.items()})
    message = (re.escape(f"{str(directory / INDEX_FILE)!r}: 'weight_map' maps {key!r} to {bad!r}, which is not a "
                         f"plain file name inside {str(directory)!r}"))
    with pytest.raises(CheckpointError, match=message):
        open_checkpoint(directory)
    with pytest.raises(CheckpointError, match=message):
        dllm.load(directory)


def test_a_tensor_the_index_does_not_list_is_not_loaded(tmp_path):
    """A tensor stored in a shard but absent from weight_map was loaded (here refused as an unexpected
    key); transformers reads a sharded checkpoint by its weight_map, so it is left out."""
    model = tiny("llada")
    weight_map, first = sharded(tmp_path)
    tensors = load_file(str(tmp_path / first))
    tensors["extra.weight"] = torch.ones(3)
    save_file(tensors, str(tmp_path / first), metadata={"format": "pt"})
    reader = open_checkpoint(tmp_path)
    assert set(reader.shapes) == set(weight_map)
    ids = random_ids(model, 2, 6)
    with torch.no_grad():
        assert torch.equal(dllm.load(tmp_path)(ids).logits, model(ids).logits)


def test_a_model_tensor_the_index_does_not_list_is_missing(tmp_path):
    """The weight_map, not the shards' contents, says what the checkpoint holds: a model tensor stored in
    a shard but left out of the index is reported missing, not read behind the index's back."""
    weight_map, first = sharded(tmp_path)
    key = next(k for k, v in weight_map.items() if v == first)
    rewrite_index(tmp_path, {k: v for k, v in weight_map.items() if k != key})
    assert key not in open_checkpoint(tmp_path).shapes
    with pytest.raises(CheckpointError, match=rf"missing keys \(1\): {re.escape(key)}"):
        dllm.load(tmp_path)


def test_quantization_names_in_any_case():
    """"INT8" was accepted but "None" / "NONE" refused as unknown; every name now matches in any case, and
    an unknown one is refused naming the valid ones."""
    for name in ("None", "NONE", "none", "", None):
        assert check_quantization(name) is None
    for name in ("INT8", "Int4", "NF4"):
        assert check_quantization(name) is QUANTIZATIONS[name.lower()]
    for bad in ("int3", "NONE8", 8, ["int8"]):
        with pytest.raises(QuantizationError, match=rf"unknown quantization {re.escape(repr(bad))}; valid: none, int8"):
            check_quantization(bad)


@pytest.mark.parametrize("name, dtype", [("BF16", torch.bfloat16), ("Float32", torch.float32),
                                         ("torch.Float16", torch.float16), ("HALF", torch.float16)])
def test_dtype_names_in_any_case(name, dtype):
    """dtype names were case-sensitive: "BF16" was refused while "bf16" loaded."""
    assert resolve_dtype(name, {}, None) == dtype
    assert resolve_dtype(None, {"torch_dtype": name}, None) == dtype
    assert tiny("llada", dtype=name).dtype == dtype
    bad = name + "x"  # still refused, naming the valid names
    with pytest.raises(ValueError, match=rf"dtype {re.escape(repr(bad))} is not supported; valid: .*bf16, bfloat16"):
        resolve_dtype(bad, {}, None)


def test_auto_in_any_case_keeps_the_checkpoint_dtype():
    assert resolve_dtype("AUTO", {"torch_dtype": "bfloat16"}, None) == torch.bfloat16
    model = torch.nn.Linear(2, 2).to(torch.float16)
    from dllm.models.loading import place_module

    assert place_module(model, "Auto", None).weight.dtype == torch.float16
