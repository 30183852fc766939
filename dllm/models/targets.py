"""``load_target``: the autoregressive target of speculative decoding, by name or path.

A target is any transformers causal LM (``AutoModelForCausalLM``). ``load_target`` finds it the way
``dllm.models.load`` finds a diffusion model -- an embedded name (``dllm/models/embedded/<name>/``),
a local directory holding ``config.json``, else a Hugging Face Hub id, handed to transformers'
``from_pretrained`` as it is -- checks from ``config.json`` alone that it IS a causal LM (a dllm
diffusion checkpoint or a DFlash drafter directory is refused, naming its architectures and what
would load it), then loads the weights and the tokenizer shipped beside them. Remote code is never
run (``trust_remote_code=False``), so a model whose class lives only in its repository's code is
refused by transformers rather than executed.
"""

from __future__ import annotations

from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterator, Optional, Union

import torch

from dllm.lazy import preimport_quietly
from dllm.models.checkpoint import INDEX_FILE, open_checkpoint
from dllm.models.families.registry import MODEL_TYPES as DIFFUSION_MODEL_TYPES
from dllm.models.loading import (ModelNotFoundError, _looks_like_hub_id, embedded_names, locate, read_config,
                                 resolve_device, resolve_dtype)
from dllm.models.parallel.plan import check_tensor_parallel
from dllm.models.quantize import check_quantization, check_target, quantize_model
from dllm.models.text.tokenizer import has_tokenizer_files, load_tokenizer, tokenizer_size

PathLike = Union[str, Path]


@dataclass(frozen=True)
class TargetSource:
    """Where a target comes from, found and checked without loading any weight."""

    source: str  # what from_pretrained gets: a local directory or a Hub id
    directory: Optional[Path]  # the local directory (None for a Hub id)
    config: dict[str, Any]  # config.json as a dict


def _causal_lm_classes() -> tuple[dict[str, Any], set[str]]:
    from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING_NAMES as mapping

    names: set[str] = set()
    for value in mapping.values():
        names.update([value] if isinstance(value, str) else value)
    return dict(mapping), names


def _is_causal_arch(name: Any, known: set[str]) -> bool:
    return isinstance(name, str) and (name in known or name.endswith(("ForCausalLM", "LMHeadModel")))


def check_causal_lm_config(hf: dict[str, Any], source: str) -> None:
    """ValueError unless ``hf`` (a config.json dict) describes a transformers causal LM: a
    ``model_type`` that ``AutoModelForCausalLM`` maps and, when ``architectures`` is given, a
    causal-LM class among them. The message names what was found and, for a dllm diffusion model
    or a DFlash drafter, how to use that directory instead (as a drafter)."""
    model_type = hf.get("model_type")
    archs = hf.get("architectures")
    mapping, known = _causal_lm_classes()
    ok_type = isinstance(model_type, str) and model_type in mapping
    ok_arch = archs is None or (isinstance(archs, list) and any(_is_causal_arch(a, known) for a in archs))
    if ok_type and ok_arch:
        return
    found = f"architectures {archs!r}, model_type {model_type!r}"
    if hf.get("dflash_config") is not None or any("DFlash" in str(a) for a in (archs or [])):
        hint = (" It is a DFlash drafter checkpoint; use it as the drafter (--drafter dflash:model=DIR, "
                "drafter='dflash:model=DIR') and pass the model it was trained for as the target.")
    elif model_type in DIFFUSION_MODEL_TYPES:
        hint = (" It is a dllm diffusion model; a diffusion model can draft instead (--drafter dlm:model=NAME, "
                "drafter='dlm:model=NAME').")
    else:
        hint = ""
    raise ValueError(
        f"{source} is not a transformers causal LM ({found}); the target must be an autoregressive model that "
        f"AutoModelForCausalLM loads: a model_type it knows (e.g. qwen3, qwen2, llama) and architectures naming "
        f"a causal-LM class (e.g. ['Qwen3ForCausalLM']).{hint}"
    )


def resolve_target(name_or_path: PathLike) -> TargetSource:
    """Find a target and check its config.json, without loading weights (cheap: the command line
    calls it before building the drafter). An existing path or an embedded name goes through
    ``dllm.models.loading.locate`` (same errors); anything else that reads as a Hub id is handed to
    transformers as it is. ``ModelNotFoundError`` when nothing provides it; ValueError when what is
    found is not a causal LM."""
    name = str(name_or_path)
    path = Path(name).expanduser()
    if path.exists() or name in embedded_names() or not _looks_like_hub_id(name):
        directory = locate(name)  # ModelNotFoundError: file / no config.json / nothing by that name
        hf = read_config(directory)
        check_causal_lm_config(hf, repr(str(directory)))
        return TargetSource(str(directory), directory, hf)
    from transformers import PretrainedConfig

    try:
        hf, _ = PretrainedConfig.get_config_dict(name)
    except (OSError, ValueError) as err:  # offline cache miss, unknown repo, gated repo, no config.json
        first = (str(err).strip().splitlines() or [type(err).__name__])[0][:200]
        raise ModelNotFoundError(
            f"cannot load target {name!r}: no such local path, not an embedded model, and the Hugging Face Hub "
            f"could not provide its config.json ({first}). Embedded models: {', '.join(embedded_names()) or '(none)'}"
        ) from None
    check_causal_lm_config(hf, f"Hub model {name!r}")
    return TargetSource(name, None, hf)


VOCAB_KEYS = ("embed_tokens.weight", "lm_head.weight", "wte.weight")  # [vocab_size, D] in a causal LM


def check_local_weights(directory: Path, hf: dict) -> None:
    """A local target's safetensors before transformers reads them: every file readable (a
    ``CheckpointError`` naming a truncated or corrupted one) and the vocabulary rows of the embedding
    and LM head equal to config.json's ``vocab_size`` (a ValueError naming the keys)."""
    directory = Path(directory)
    if not any(directory.glob("*.safetensors")) and not (directory / INDEX_FILE).is_file():
        return  # .bin or other formats: transformers reads them
    reader = open_checkpoint(directory)
    text = hf.get("text_config") if isinstance(hf.get("text_config"), dict) else hf
    vocab = text.get("vocab_size")
    if not isinstance(vocab, int):
        return
    bad = [f"{k} {list(shape)}" for k, shape in sorted(reader.shapes.items())
           if k.endswith(VOCAB_KEYS) and len(shape) == 2 and shape[0] != vocab]
    if bad:
        raise ValueError(f"target {str(directory)!r}: config.json says vocab_size {vocab}, but the weights have "
                         f"{', '.join(bad)} (rows = vocabulary); make config.json's vocab_size match the weights")


def _dtype_keyword() -> str:
    """``from_pretrained``'s dtype keyword: ``dtype`` since transformers 4.56, ``torch_dtype`` before."""
    import transformers
    from packaging.version import Version

    return "dtype" if Version(transformers.__version__.split("+")[0]) >= Version("4.56") else "torch_dtype"


@contextmanager
def _quiet_loading(quiet: bool) -> Iterator[None]:
    """transformers' progress bars off while the block runs (``quiet``), then as the caller had them: the
    "Loading weights" bar that ``from_pretrained`` draws on every load since transformers 5
    (``transformers/core_model_loading.py``). ``transformers.utils.logging.disable_progress_bar`` turns the
    Hub's download bars off too, so a Hub id (which may download) keeps them; the Hub's own setting is restored."""
    from huggingface_hub.utils import are_progress_bars_disabled, disable_progress_bars
    from transformers.utils import logging as hf_logging

    if not quiet or not hf_logging.is_progress_bar_enabled():
        yield
        return
    hub_off = are_progress_bars_disabled()
    hf_logging.disable_progress_bar()
    try:
        yield
    finally:
        hf_logging.enable_progress_bar()
        if hub_off:
            disable_progress_bars()


def _load_tokenizer(found: TargetSource) -> Any:
    if found.directory is not None:
        return load_tokenizer(found.directory, family="") if has_tokenizer_files(found.directory) else None
    from transformers import AutoTokenizer

    try:
        return AutoTokenizer.from_pretrained(found.source, trust_remote_code=False)
    except (OSError, ValueError):  # no tokenizer in the repo, or only a remote-code one
        return None


def load_target(
    name_or_path: Union[PathLike, TargetSource],
    *,
    dtype: Union[torch.dtype, str, None] = None,
    device: Union[str, torch.device, None] = None,
    quantization: Optional[str] = None,
    tensor_parallel: Optional[int] = None,
) -> tuple[Any, Any]:
    """Load a transformers causal LM to serve as the target of ``speculative_generate``.

    name_or_path: an embedded name (``dllm/models/embedded/<name>/``), a local directory with
    config.json, or a Hub id (passed to ``from_pretrained``); or a ``resolve_target`` result.
    dtype: a floating torch dtype or name ("float32", "bfloat16", ...; None / "auto": the
    config's dtype, else float32). device: one device (ValueError listing those that exist).
    quantization: "int8" | "int4" | "nf4": weight-only quantization of the linear layers
    (``dllm.models.quantize``; a tied LM head stays float). tensor_parallel: N ranks under torchrun:
    transformers' own tensor-parallel plan (``tp_plan="auto"``) over this job's N processes (heads
    refused with the numbers when N does not divide them; not with ``quantization``).

    Returns ``(model, tokenizer)``: the model in eval mode, and the tokenizer shipped with it
    (``AutoTokenizer``, else ``PreTrainedTokenizerFast`` from tokenizer.json), or None when there is
    none. Errors: ``ModelNotFoundError`` (an ``OSError``) when nothing is found; ValueError when the
    config is not a causal LM (a dllm diffusion model, a DFlash drafter), when weights are missing
    from the checkpoint, or when the tokenizer has more tokens than the model's embedding rows.
    """
    method = check_quantization(quantization)
    tensor_parallel = check_tensor_parallel(tensor_parallel)
    if tensor_parallel is not None and method is not None:  # "none" is no quantization
        raise ValueError(f"tensor_parallel={tensor_parallel} with quantization={quantization!r} is not supported")
    device = resolve_device(device)
    found = name_or_path if isinstance(name_or_path, TargetSource) else resolve_target(name_or_path)
    want = resolve_dtype(dtype, found.config, None)
    if method is not None:  # before any weight is read: the dtype (and device) the method cannot use
        check_target(method, device if device is not None else torch.device("cpu"), want)
    parallel: dict[str, Any] = {}
    if tensor_parallel is not None:
        parallel = _tensor_parallel_plan(found.config, tensor_parallel, device)
        device = None  # transformers places each rank's part on its device
    for name in ("torchao", "torchao.quantization", "torchao.prototype.mx_formats"):  # transformers imports them
        preimport_quietly(name)  # (their chatter about CUDA-only kernels and a torch deprecation)
    from transformers import AutoModelForCausalLM

    if found.directory is not None:
        check_local_weights(found.directory, found.config)
    try:
        with _quiet_loading(found.directory is not None):  # a local target: no download whose bar would matter
            model, info = AutoModelForCausalLM.from_pretrained(
                found.source, trust_remote_code=False, output_loading_info=True, **{_dtype_keyword(): want},
                **parallel)
    except RuntimeError as err:  # e.g. shapes that disagree with config.json
        first = (str(err).strip().splitlines() or [type(err).__name__])[0][:300]
        raise ValueError(f"cannot load target {found.source!r}: its weights do not fit its config.json "
                         f"({first})") from None
    missing = sorted(info.get("missing_keys") or [])
    if missing:
        raise ValueError(f"target {found.source!r}: the checkpoint lacks {len(missing)} weight(s) of "
                         f"{type(model).__name__} ({', '.join(missing[:5])}{' ...' if len(missing) > 5 else ''}); "
                         f"they would be random. Is it a base model without its LM head?")
    tokenizer = _load_tokenizer(found)
    rows = model.get_input_embeddings().weight.shape[0]
    if tokenizer is not None and tokenizer_size(tokenizer) > rows:
        raise ValueError(f"tokenizer/model vocabulary mismatch in {found.source!r}: the tokenizer has "
                         f"{tokenizer_size(tokenizer)} tokens but the model's embedding has {rows} rows")
    if device is not None:
        model = model.to(device)
    return quantize_model(model.eval(), quantization), tokenizer


def _tensor_parallel_plan(config: dict, n: int, device: Any) -> dict[str, Any]:
    """``from_pretrained``'s keywords for transformers' tensor-parallel plan over n ranks, after the
    split is checked with the numbers and the process group is joined (``dllm.models.parallel.group``)."""
    from dllm.models.parallel.group import tensor_parallel_group

    heads = {name: config.get(name) for name in ("num_attention_heads", "num_key_value_heads")}
    bad = [f"{name} {value} is not divisible by tensor_parallel={n}" for name, value in heads.items()
           if isinstance(value, int) and value % n]
    if bad:
        raise ValueError("cannot split this target: " + "; ".join(bad))
    tensor_parallel_group(n, device)
    try:
        from transformers import DistributedConfig
    except ImportError:  # older transformers: the tp_plan keyword
        return {"tp_plan": "auto", "tp_size": n}
    return {"distributed_config": DistributedConfig(tp_plan="auto", tp_size=n)}


__all__ = ["TargetSource", "check_causal_lm_config", "check_local_weights", "load_target", "resolve_target"]
