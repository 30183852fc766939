"""``load``: an embedded tiny model, a local checkpoint directory, or a Hugging Face Hub id -> DiffusionLM.

Steps: locate the directory -> read config.json -> pick the family from ``model_type`` -> load the
tokenizer (if shipped) -> translate the config -> open the safetensors files -> build the model on
the meta device -> check every key and shape (one error listing all problems) -> assign the
tensors -> optionally spread the model over devices with accelerate.
"""

from __future__ import annotations

import dataclasses
import json
import os
import warnings
from pathlib import Path
from typing import Any, Optional, Union

import torch

from dllm.models.checkpoint import CheckpointReader, open_checkpoint
from dllm.models.core.config import TransformerConfig
from dllm.models.families.registry import class_for_model_type
from dllm.models.families.pretrained import GENERATION_CONFIG, TransformerLM
from dllm.models.quantize import QuantizationError, check_quantization, quantize_model
from dllm.models.parallel.plan import check_tensor_parallel
from dllm.models.text.tokenizer import load_tokenizer, tokenizer_size
from dllm.models.core.layer.block import TransformerBlock

EMBEDDED_DIR = Path(__file__).resolve().parent / "embedded"
HUB_PATTERNS = ["*.json", "*.safetensors", "tokenizer*", "*.model", "merges.txt", "*.jinja"]

_DTYPES: dict[str, torch.dtype] = {
    "float32": torch.float32, "fp32": torch.float32, "float": torch.float32,
    "bfloat16": torch.bfloat16, "bf16": torch.bfloat16,
    "float16": torch.float16, "fp16": torch.float16, "half": torch.float16,
    "float64": torch.float64, "double": torch.float64,
}
_FLOAT_DTYPES = (torch.float32, torch.bfloat16, torch.float16, torch.float64)


class ModelNotFoundError(FileNotFoundError):
    """The name is neither an embedded model, nor a local checkpoint directory, nor reachable on the Hub."""


def embedded_names() -> list[str]:
    """Names of the tiny checkpoints shipped inside the package (``dllm/models/embedded/<name>/``)."""
    if not EMBEDDED_DIR.is_dir():
        return []
    return sorted(p.name for p in EMBEDDED_DIR.iterdir() if (p / "config.json").is_file())


def _offline() -> bool:
    flag = os.environ.get("HF_HUB_OFFLINE", "").strip().upper()
    return flag in ("1", "ON", "YES", "TRUE")


def _looks_like_hub_id(name: str) -> bool:
    if name.startswith(("/", ".", "~")) or os.path.isabs(name) or name.count("/") > 1:
        return False
    from huggingface_hub.utils import validate_repo_id

    try:
        validate_repo_id(name)
    except Exception:
        return False
    return True


def _first_line(e: BaseException) -> str:
    text = str(e).strip().splitlines()
    line = text[0] if text else ""
    return f"{type(e).__name__}: {line[:200]}"


def locate(name_or_path: Union[str, Path]) -> Path:
    """The checkpoint directory for a local path, an embedded name, or a Hub id (downloaded).
    An empty or whitespace-only name is refused before anything is looked up (``Path("")`` would
    be the current directory)."""
    if not isinstance(name_or_path, (str, os.PathLike)):
        raise TypeError(f"name_or_path must be a model name or a path, got {type(name_or_path).__name__} "
                        f"{name_or_path!r:.80}")
    name = str(name_or_path)
    if not name.strip():
        raise ModelNotFoundError(
            f"the model name is empty ({name!r}); give an embedded model ({', '.join(embedded_names()) or 'none'}), "
            f"a local checkpoint directory with config.json, or a Hugging Face Hub id")
    path = Path(name).expanduser()
    if path.is_dir():
        if (path / "config.json").is_file():
            return path
        raise ModelNotFoundError(f"directory {name!r} exists but has no config.json")
    if path.exists():
        raise ModelNotFoundError(f"{name!r} is a file; pass the checkpoint directory that holds config.json")
    if name in embedded_names():
        return EMBEDDED_DIR / name
    embedded = ", ".join(embedded_names()) or "(none)"
    if not _looks_like_hub_id(name):
        reason = "not a valid Hub repo id"
    else:
        try:
            from huggingface_hub import snapshot_download

            # Offline: only the local Hub cache is consulted (no network, no wait).
            found = Path(snapshot_download(name, allow_patterns=HUB_PATTERNS, local_files_only=_offline()))
            if (found / "config.json").is_file():
                return found
            reason = "the Hub repo has no config.json"
        except Exception as e:  # network errors, unknown repo, gated repo, offline cache miss
            reason = ("HF_HUB_OFFLINE is set and it is not in the local Hub cache" if _offline()
                      else _first_line(e))
    raise ModelNotFoundError(
        f"cannot load {name!r}: no such local path, not an embedded model, and the Hugging Face Hub "
        f"could not provide it ({reason}). Embedded models: {embedded}"
    )


def read_config(directory: Path, name: str = "config.json") -> dict[str, Any]:
    path = directory / name
    try:
        hf = json.loads(path.read_text())
    except (OSError, ValueError) as e:
        raise ValueError(f"cannot parse {str(path)!r}: {e}") from None
    if not isinstance(hf, dict):
        raise ValueError(f"{str(path)!r} must hold a JSON object, got {type(hf).__name__}")
    return hf


def _is_auto(dtype: Any) -> bool:
    """None or "auto" in any case: the dtype the checkpoint (or a given module) already has."""
    return dtype is None or (isinstance(dtype, str) and dtype.lower() == "auto")


def resolve_dtype(dtype: Union[torch.dtype, str, None], hf: dict[str, Any],
                  stored: Optional[torch.dtype]) -> torch.dtype:
    """Requested dtype; None / "auto" -> config's torch_dtype (or "dtype"), else the stored tensors'.
    Names in any case ("BF16", "torch.Float16"); ValueError naming the valid dtypes for anything but a
    floating dtype."""
    if isinstance(dtype, torch.dtype):
        if dtype not in _FLOAT_DTYPES:
            raise ValueError(f"dtype {dtype} is not supported: weights need a floating dtype; valid: "
                             f"{', '.join(map(str, _FLOAT_DTYPES))}, 'auto', or one of {', '.join(sorted(_DTYPES))}")
        return dtype
    if _is_auto(dtype):
        name = hf.get("torch_dtype") or hf.get("dtype")
        if name is None:
            return stored or torch.float32
        dtype, where = name, "config.json torch_dtype"
    else:
        where = "dtype"
    key = str(dtype).lower().removeprefix("torch.")
    if key not in _DTYPES:
        raise ValueError(f"{where} {dtype!r} is not supported; valid: a floating torch.dtype, 'auto', or one of "
                         f"{', '.join(sorted(_DTYPES))}")
    return _DTYPES[key]


def available_devices() -> list[str]:
    """The devices this process can place a model on ("cpu", "cuda:0", ..., "mps")."""
    out = ["cpu"] + [f"cuda:{i}" for i in range(torch.cuda.device_count() if torch.cuda.is_available() else 0)]
    mps = getattr(torch.backends, "mps", None)
    return out + (["mps"] if mps is not None and mps.is_available() else [])


def resolve_device(device: Union[str, torch.device, None]) -> Optional[torch.device]:
    """The requested device, checked: ValueError saying what is missing and which devices exist."""
    if device is None:
        return None
    available = ", ".join(available_devices())
    try:
        dev = torch.device(device)
    except (RuntimeError, TypeError, ValueError):
        raise ValueError(f"device {device!r} is not a device name; available devices: {available}") from None
    if dev.type == "cuda":
        if not torch.cuda.is_available():
            why = "this torch build has no CUDA" if torch.version.cuda is None else "no CUDA GPU is visible"
            raise ValueError(f"device {device!r}: CUDA is not available ({why}); available devices: "
                             f"{available}")
        if dev.index is not None and dev.index >= torch.cuda.device_count():
            raise ValueError(f"device {device!r}: there are {torch.cuda.device_count()} CUDA device(s); "
                             f"available devices: {available}")
    elif dev.type == "mps" and "mps" not in available_devices():
        raise ValueError(f"device {device!r}: MPS is not available; available devices: {available}")
    elif dev.type not in ("cpu", "cuda", "mps"):  # meta, xla, ...: a weight-less or foreign device
        raise ValueError(f"device {device!r}: dllm runs on cpu, cuda or mps; available devices: {available}")
    return dev


def place_module(module: torch.nn.Module, dtype: Union[torch.dtype, str, None],
                 device: Union[str, torch.device, None]) -> torch.nn.Module:
    """A module given already built, moved to the requested dtype (None / "auto": as it is) and
    device (None: where it is), each checked as ``resolve_dtype`` / ``resolve_device`` check them."""
    if not _is_auto(dtype):
        module.to(dtype=resolve_dtype(dtype, {}, None))
    if device is not None:
        module.to(device=resolve_device(device))
    return module


def check_device_map(device_map: Any) -> None:
    """ValueError, before any weight is read, unless ``device_map`` is None, "auto", or a dict of module
    name -> a device this process has (checked as ``resolve_device`` checks ``device=``; a GPU index
    as accelerate takes it): accelerate would put the weights on "meta" (a model with no weights) or
    fail inside torch on a GPU that is not there."""
    if device_map is None or device_map == "auto":
        return
    if not isinstance(device_map, dict):
        raise ValueError(f"device_map must be 'auto' or a dict of module name -> device, got "
                         f"{device_map!r} (use device= for a single device)")
    for name, where in device_map.items():
        if not isinstance(name, str):
            raise ValueError(f"device_map keys are module names ('' for the whole model), got {name!r}")
        index = isinstance(where, int) and not isinstance(where, bool)
        try:
            resolve_device(f"cuda:{where}" if index else where)
        except ValueError as e:
            raise ValueError(f"device_map[{name!r}] = {where!r}: {e}") from None


def _dispatch(
    model: TransformerLM, device_map: Union[str, dict[str, Any]], dtype: torch.dtype
) -> TransformerLM:
    """Spread the model over devices with accelerate ("auto": fill GPUs, then CPU); ``device_map``
    already passed ``check_device_map``."""
    from accelerate import dispatch_model, infer_auto_device_map

    if device_map == "auto":
        device_map = infer_auto_device_map(model, no_split_module_classes=[TransformerBlock.__name__],
                                           dtype=dtype)
    return dispatch_model(model, device_map=device_map)


def tensor_parallel_split(cls: type, config: Any, hf: dict[str, Any], n: int, expert_parallel: bool,
                          device: Optional[torch.device], device_map: Any, quantization: Optional[str]) -> Any:
    """The ``dllm.models.parallel.TensorParallel`` of this process: the split checked with the numbers (before
    any weight is read or any process group starts), then the group joined."""
    from dllm.models.parallel.group import tensor_parallel_group
    from dllm.models.parallel.plan import ParallelPlan, check_plan
    from dllm.models.parallel.shard import TensorParallel, splits_vocab

    from dllm.models.families.llada2 import LLaDA2, moe_from_hf

    moe = moe_from_hf(hf) if issubclass(cls, LLaDA2) else None
    check_plan(config, n, moe=moe, expert_parallel=expert_parallel, device_map=device_map,
               quantization=quantization)
    group = tensor_parallel_group(n, device)
    return TensorParallel(ParallelPlan(n, group.rank, expert_parallel), group, moe, splits_vocab(config, n))


def tie_stored_head(cls: type[TransformerLM], config: TransformerConfig, hf: dict[str, Any],
                    reader: CheckpointReader, dtype: torch.dtype) -> TransformerConfig:
    """``config`` for a checkpoint whose config.json sets ``tie_word_embeddings`` but whose files also
    store the LM head, decided as transformers' ``from_pretrained`` decides it
    (``PreTrainedModel.tie_weights(missing_keys=...)`` in transformers 5.x ``modeling_utils.py``): a head
    equal to the embedding (in the load ``dtype``) is the tied head, and its tensor is left unread; a
    head that differs is NOT tied (transformers warns and keeps the stored head), so the model is
    built untied with that head, and a one-line warning names the key. A head stored WITHOUT the
    embedding is the tied weight (transformers swaps source and target when only the target is stored):
    it is read as the embedding when its shape is the embedding's (otherwise the key check names the
    stored head as unexpected). Otherwise ``config`` as given."""
    if not (config.tie_embeddings and hf.get("tie_word_embeddings")):
        return config
    head, embed = cls.keymap.to_official("lm_head.weight"), cls.keymap.to_official("embed.weight")
    if head in reader.shapes and embed not in reader.shapes:
        if reader.shapes[head] == (config.vocab_size, config.d_model):
            reader.rename(head, embed)
        return config
    if head not in reader.shapes or embed not in reader.shapes:
        return config
    if reader.shapes[head] == reader.shapes[embed] and torch.equal(reader.get(head).to(dtype),
                                                                   reader.get(embed).to(dtype)):
        reader.drop(head)
        return config
    warnings.warn(f"checkpoint {str(reader.directory)!r}: config.json sets tie_word_embeddings, but the stored "
                  f"{head!r} differs from {embed!r}; it is loaded as an untied LM head, as transformers loads it",
                  stacklevel=3)
    return dataclasses.replace(config, tie_embeddings=False)


ORACLE_NAME = "oracle"  # load("oracle"): the stress tasks' exact-posterior model (dllm.models.oracle)


def load(
    name_or_path: Union[str, Path],
    dtype: Union[torch.dtype, str, None] = None,
    device: Union[str, torch.device, None] = None,
    device_map: Union[str, dict[str, Any], None] = None,
    attn_backend: str = "auto",
    quantization: Optional[str] = None,
    tensor_parallel: Optional[int] = None,
    expert_parallel: bool = False,
) -> TransformerLM:
    """Load a LLaDA, Dream or SDAR checkpoint in the official layout (the family from config.json's
    ``model_type``; SDAR's block-causal attention and ``block_size`` come with it).

    name_or_path: an embedded name (see ``embedded_names()``), a local directory with config.json,
    a Hub id, or ``"oracle"`` (the stress tasks' exact-posterior ``OracleLM``, weightless).
    dtype: a floating torch dtype or "float32" / "bfloat16" / "float16" / "auto" (default: the
    checkpoint's torch_dtype). device: one device (ValueError when it does not exist here, listing
    those that do); device_map: "auto" or a dict of module name -> device, through accelerate (each
    device checked as device= is, before any weight is read). Weights with NaN or inf are
    refused (``CheckpointError`` naming the tensors). quantization: "int8" | "int4" | "nf4"
    (weight-only, ``dllm.models.quantize``; one device, not with device_map).
    tensor_parallel: N ranks under torchrun (``dllm.models.parallel``): each process loads only its heads'
    and MLP columns' slices, its KV caches hold its heads, one all-reduce per sub-layer; a split that
    cannot be made is refused with the numbers before any weight is read. expert_parallel (with it,
    LLaDA 2 MoE): whole experts per rank instead of split columns.
    """
    tensor_parallel = check_tensor_parallel(tensor_parallel)
    if expert_parallel and tensor_parallel is None:
        raise ValueError("expert_parallel=True needs tensor_parallel=N (the ranks the experts are placed on)")
    if device is not None and device_map is not None:
        raise ValueError(f"pass either device ({device!r}) or device_map ({device_map!r}), not both")
    method = check_quantization(quantization)
    if method is not None and device_map is not None:
        raise QuantizationError(f"quantization={quantization!r} needs the model on one device; pass device= "
                                f"instead of device_map={device_map!r}")
    device = resolve_device(device)
    check_device_map(device_map)
    if str(name_or_path) == ORACLE_NAME:
        if tensor_parallel is not None:
            raise ValueError(f"the {ORACLE_NAME!r} model has no weights to split (tensor_parallel={tensor_parallel})")
        if method is not None:
            raise QuantizationError(f"the {ORACLE_NAME!r} model has no weights to quantize "
                                    f"(quantization={quantization!r})")
        from dllm.models.oracle import OracleLM

        return OracleLM().to(device)  # exact posterior marginals of the stress tasks; no weights
    directory = locate(name_or_path)
    hf = read_config(directory)
    cls = class_for_model_type(hf.get("model_type"))
    tokenizer = load_tokenizer(directory, cls.family)
    config, special = cls.from_hf_config(hf, tokenizer)
    if tokenizer is not None and tokenizer_size(tokenizer) > config.vocab_size:
        raise ValueError(
            f"tokenizer/model vocabulary mismatch in {str(directory)!r}: the tokenizer has "
            f"{tokenizer_size(tokenizer)} tokens but the model's embedding has {config.vocab_size} rows"
        )
    sharding = None
    if tensor_parallel is not None:
        sharding = tensor_parallel_split(cls, config, hf, tensor_parallel, expert_parallel, device, device_map,
                                         quantization)
        device = sharding.group.device
    reader = open_checkpoint(directory)
    target = resolve_dtype(dtype, hf, reader.stored_dtype())
    # after the split (planned for the tied config): an untied head keeps the vocabulary whole on each rank
    config = tie_stored_head(cls, config, hf, reader, target)
    with torch.device("meta"):
        model = cls(config, special, hf_config=hf, tokenizer=tokenizer, attn_backend=attn_backend)
    model.sharding = sharding
    model.load_official(reader, dtype=target, device=device)
    if (directory / GENERATION_CONFIG).is_file():
        model.hf_generation_config = read_config(directory, GENERATION_CONFIG)
    model.eval()
    model.name_or_path = str(name_or_path)
    quantize_model(model, method.name if method is not None else None)
    if device_map is not None:
        model = _dispatch(model, device_map, target)
    return model
