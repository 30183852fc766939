"""Reading and writing safetensors checkpoints in the Hugging Face layout.

One file ``model.safetensors``, or shards ``model-0000K-of-0000N.safetensors`` plus
``model.safetensors.index.json`` (``metadata.total_size`` and ``weight_map``: key -> shard file).
Every problem with the files is a ``CheckpointError`` whose message names the file or the keys.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Optional

import torch
from safetensors import safe_open
from safetensors.torch import save_file

SINGLE_FILE = "model.safetensors"
INDEX_FILE = "model.safetensors.index.json"

# safetensors dtype strings -> torch dtypes (those a checkpoint of ours can hold)
_ST_DTYPES: dict[str, torch.dtype] = {
    "F64": torch.float64, "F32": torch.float32, "F16": torch.float16, "BF16": torch.bfloat16,
}

Shape = tuple[int, ...]


class CheckpointError(ValueError):
    """A checkpoint's files are missing, unreadable, or do not match the model's parameters."""


def shard_name(k: int, n: int) -> str:
    return f"model-{k:05d}-of-{n:05d}.safetensors"


def _nbytes(t: torch.Tensor) -> int:
    return t.numel() * t.element_size()


def check_shard_size(max_shard_size: Any) -> Optional[int]:
    """``max_shard_size`` checked: None (one file) or a positive int of bytes; ValueError naming the value
    otherwise (a string such as transformers' "5GB" included), before anything is written."""
    if max_shard_size is None:
        return None
    if not isinstance(max_shard_size, int) or isinstance(max_shard_size, bool) or max_shard_size <= 0:
        raise ValueError(f"max_shard_size must be None (one file) or a positive int number of bytes "
                         f"(e.g. 5_000_000_000 for 5 GB), got {max_shard_size!r}")
    return max_shard_size


def plan_shards(tensors: dict[str, torch.Tensor], max_shard_size: int) -> list[list[str]]:
    """Group keys (in order) into shards of at most max_shard_size bytes (a bigger tensor gets its own)."""
    check_shard_size(max_shard_size)
    shards: list[list[str]] = [[]]
    size = 0
    for key, t in tensors.items():
        n = _nbytes(t)
        if shards[-1] and size + n > max_shard_size:
            shards.append([])
            size = 0
        shards[-1].append(key)
        size += n
    return shards


_SHARD_FILE = re.compile(r"model-\d{5}-of-\d{5}\.safetensors")


def _remove_old_weights(directory: Path) -> None:
    """Delete the weight files of an earlier save (``model.safetensors``, the index, ``shard_name``
    shards) so the directory holds exactly one layout; other files (``model_ema.safetensors``, a
    ``model.fp16.safetensors`` variant) are not ours and stay, as transformers' ``save_pretrained``
    leaves them (it removes only the shards its pattern matches)."""
    for p in [directory / SINGLE_FILE, directory / INDEX_FILE, *directory.glob("model-*-of-*.safetensors")]:
        if p.is_file() and (p.name in (SINGLE_FILE, INDEX_FILE) or _SHARD_FILE.fullmatch(p.name)):
            p.unlink()


def _own_memory(t: torch.Tensor) -> torch.Tensor:
    """``t``, or a copy when it is a slice of larger memory (a projection re-pointed into a fused
    weight, ``dllm.models.core.layer.fused``): safetensors refuses tensors that share memory."""
    return t.clone() if t.untyped_storage().nbytes() != t.numel() * t.element_size() else t


def write_safetensors(
    tensors: dict[str, torch.Tensor], directory: str | Path, max_shard_size: Optional[int] = None
) -> list[Path]:
    """Write ``tensors`` (official names) as one file, or as shards + index when max_shard_size is set
    and more than one shard is needed. Returns the written weight files. The shards are planned
    (``max_shard_size`` checked) before an earlier save's files are removed."""
    directory = Path(directory)
    max_shard_size = check_shard_size(max_shard_size)
    tensors = {k: _own_memory(v.detach().to("cpu").contiguous()) for k, v in tensors.items()}
    meta = {"format": "pt"}
    shards = [list(tensors)] if max_shard_size is None else plan_shards(tensors, max_shard_size)
    directory.mkdir(parents=True, exist_ok=True)
    _remove_old_weights(directory)
    if len(shards) == 1:
        path = directory / SINGLE_FILE
        save_file(tensors, str(path), metadata=meta)
        return [path]
    written: list[Path] = []
    weight_map: dict[str, str] = {}
    for k, keys in enumerate(shards, start=1):
        name = shard_name(k, len(shards))
        save_file({key: tensors[key] for key in keys}, str(directory / name), metadata=meta)
        weight_map.update({key: name for key in keys})
        written.append(directory / name)
    index = {"metadata": {"total_size": sum(_nbytes(t) for t in tensors.values())},
             "weight_map": weight_map}
    (directory / INDEX_FILE).write_text(json.dumps(index, indent=2) + "\n")
    return written


def _open(path: Path) -> Any:
    if not path.is_file():
        raise CheckpointError(f"checkpoint file {str(path)!r} does not exist")
    try:
        return safe_open(str(path), framework="pt")
    except Exception as e:  # SafetensorError (truncated / corrupted header), OSError
        raise CheckpointError(
            f"cannot read safetensors file {str(path)!r} (truncated or corrupted?): {e}"
        ) from None


@dataclass
class CheckpointReader:
    """Lazy view of a checkpoint's tensors: shapes up front, data read per key."""

    directory: Path
    files: list[Path]
    shapes: dict[str, Shape] = field(default_factory=dict)  # official key -> shape
    dtypes: dict[str, str] = field(default_factory=dict)  # official key -> safetensors dtype ("BF16")
    _handles: dict[Path, Any] = field(default_factory=dict, repr=False)
    _file_of: dict[str, Path] = field(default_factory=dict, repr=False)
    _stored_as: dict[str, str] = field(default_factory=dict, repr=False)  # key -> its name in the file (``rename``)

    def get(self, key: str) -> torch.Tensor:
        path, stored = self._file_of[key], self._stored_as.get(key, key)
        try:
            return self._handles[path].get_tensor(stored)
        except Exception as e:
            raise CheckpointError(f"cannot read tensor {stored!r} from {str(path)!r}: {e}") from None

    def rename(self, key: str, new: str) -> None:
        """Serve the stored tensor ``key`` under the name ``new`` only: an LM head stored without the
        embedding it is tied to, which loads as that embedding (``dllm.models.loading.tie_stored_head``)."""
        if key not in self.shapes or new in self.shapes:
            raise ValueError(f"cannot rename {key!r} to {new!r}: the view must hold the first and not the second")
        for table in (self.shapes, self.dtypes, self._file_of):
            table[new] = table.pop(key)
        self._stored_as[new] = self._stored_as.pop(key, key)

    def drop(self, key: str) -> None:
        """Leave ``key`` out of this view: a stored tensor the model does not load (a tied LM head
        stored beside its embedding, ``dllm.models.loading.tie_stored_head``)."""
        for table in (self.shapes, self.dtypes, self._file_of, self._stored_as):
            table.pop(key, None)

    def stored_dtype(self) -> Optional[torch.dtype]:
        """The floating dtype most tensors are stored in (None for an empty checkpoint)."""
        if not self.dtypes:
            return None
        names = list(self.dtypes.values())
        common = max(set(names), key=names.count)
        return _ST_DTYPES.get(common)


def _shard_file(directory: Path, index: Path, key: str, name: str) -> Path:
    """The shard ``name`` the index maps ``key`` to, as a file inside ``directory``; a CheckpointError naming
    the index, the tensor and the name for anything else (``../x.safetensors``, an absolute path, ".")."""
    if name in (".", "..") or Path(name).name != name or "\\" in name:
        raise CheckpointError(f"{str(index)!r}: 'weight_map' maps {key!r} to {name!r}, which is not a plain file "
                              f"name inside {str(directory)!r} (expected a shard name such as {shard_name(1, 2)!r})")
    return directory / name


def _read_index(directory: Path, index: Path) -> dict[str, Path]:
    """The index's ``weight_map`` as tensor name -> shard file inside ``directory`` (checked)."""
    try:
        weight_map = json.loads(index.read_text())["weight_map"]
    except (ValueError, KeyError, TypeError) as e:
        raise CheckpointError(f"cannot parse {str(index)!r} (need a 'weight_map'): {e}") from None
    if not isinstance(weight_map, dict) or not all(isinstance(k, str) and isinstance(v, str) and v
                                                   for k, v in weight_map.items()):
        raise CheckpointError(f"{str(index)!r}: 'weight_map' must map each tensor name to a shard file name, "
                              f"got {str(weight_map)[:200]}")
    return {k: _shard_file(directory, index, k, v) for k, v in weight_map.items()}


def open_checkpoint(directory: str | Path) -> CheckpointReader:
    """Open the single-file or sharded safetensors checkpoint in ``directory``.

    A sharded checkpoint is read by its index, as transformers' ``modeling_utils`` does: the view holds
    the tensors ``weight_map`` lists, each from its shard; a tensor a shard stores but the index does not
    list is not loaded."""
    directory = Path(directory)
    single, index = directory / SINGLE_FILE, directory / INDEX_FILE
    if single.is_file():
        files = [single]
        expected_file: Optional[dict[str, Path]] = None
    elif index.is_file():
        expected_file = _read_index(directory, index)
        files = sorted(set(expected_file.values()))
    else:
        raise CheckpointError(
            f"no weights in {str(directory)!r}: expected {SINGLE_FILE} or {INDEX_FILE} with shards"
        )
    reader = CheckpointReader(directory, files)
    for path in files:
        handle = _open(path)
        reader._handles[path] = handle
        stored = set(handle.keys())
        listed = stored if expected_file is None else [k for k, p in expected_file.items() if p == path]
        for key in listed:
            if key not in stored:
                raise CheckpointError(f"{INDEX_FILE} maps {key!r} to {path.name}, but that file does not "
                                      f"contain it")
            sl = handle.get_slice(key)
            reader.shapes[key] = tuple(sl.get_shape())
            reader.dtypes[key] = sl.get_dtype()
            reader._file_of[key] = path
    return reader


def nonfinite_counts(t: torch.Tensor) -> Optional[tuple[int, int]]:
    """(NaN count, inf count) of a floating tensor, or None when every value is finite.

    Screened by ``aminmax``: NaN propagates through min/max and inf is an extreme, so one reduction
    at memory speed with no temporary of the tensor's size (``isfinite().all()`` is ~10x slower on
    CPU for bf16); only a tensor that fails the screen is counted exactly. torch 2.1 has no CPU
    ``aminmax`` for float16: there the screen is ``isfinite().all()``.
    """
    if t.numel() == 0:
        return None
    try:
        lo, hi = torch.aminmax(t.detach())
        finite = bool(torch.isfinite(lo) & torch.isfinite(hi))  # one host sync per tensor, on purpose
    except RuntimeError:  # "aminmax_cpu" not implemented for 'Half' (torch 2.1)
        finite = bool(torch.isfinite(t).all())
    if finite:
        return None
    return int(t.isnan().sum()), int(t.isinf().sum())


def check_keys(expected: dict[str, Shape], found: dict[str, Shape], source: str) -> None:
    """Raise one CheckpointError listing missing, unexpected and mis-shaped keys (official names)."""
    missing = sorted(set(expected) - set(found))
    unexpected = sorted(set(found) - set(expected))
    misshaped = sorted(k for k in set(expected) & set(found) if tuple(expected[k]) != tuple(found[k]))
    if not (missing or unexpected or misshaped):
        return
    lines = [f"checkpoint {source} does not match the model built from its config.json:"]
    if missing:
        lines.append(f"  missing keys ({len(missing)}): " + ", ".join(missing))
    if unexpected:
        lines.append(f"  unexpected keys ({len(unexpected)}): " + ", ".join(unexpected))
    for k in misshaped:
        lines.append(f"  mis-shaped key {k}: expected {list(expected[k])}, found {list(found[k])}")
    raise CheckpointError("\n".join(lines))
