"""DFlash drafter checkpoints: load the official z-lab format unchanged, save it back, build random ones.

The format (z-lab/dflash ``dflash/model.py``, ``DFlashDraftModel``; paper arXiv 2602.06036): a
directory with ``config.json`` -- a Qwen3 config with ``architectures: ["DFlashDraftModel"]``,
``block_size``, ``num_target_layers`` and ``dflash_config: {target_layer_ids, mask_token_id}``
(optionally ``auto_map`` for transformers' remote code) -- and safetensors weights (one file, or
shards with an index) named ``layers.N.self_attn.{q,k,v,o}_proj.weight``, ``...q_norm.weight``,
``...k_norm.weight``, ``layers.N.mlp.{gate,up,down}_proj.weight``, ``layers.N.input_layernorm.weight``,
``layers.N.post_attention_layernorm.weight``, ``norm.weight``, ``fc.weight``, ``hidden_norm.weight``.
No embedding table and no LM head: the drafter uses the target's. Nothing here runs remote code.

Drafter fields are read as the reference reads them: from ``dflash_config`` first, then from the
top level of the config; Qwen3 defaults (head_dim, key/value heads, RoPE, layer types) come from
transformers' ``Qwen3Config``, the class the reference builds on.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Callable, Mapping, Optional, Union

import torch
import torch.nn as nn

from dllm.drafters.dflash.config import FULL_ATTENTION, SLIDING_ATTENTION, DFlashConfig, tap_layer_ids
from dllm.drafters.dflash.model import DFlashDrafter
from dllm.models.checkpoint import (CheckpointError, check_keys, nonfinite_counts, open_checkpoint,
                                    write_safetensors)
from dllm.models.loading import locate, read_config, resolve_device, resolve_dtype
from dllm.models.families.pretrained import DTYPE_NAMES
from dllm.models.quantize import quantize_model, refuse_quantized_save

ARCHITECTURE = "DFlashDraftModel"
ARCHITECTURE_V2 = "DFlash2DraftModel"
ARCHITECTURE_DFLARE = "QwenDFlareDraftModel"  # DFlare (Tencent/AngelSlim), loaded by dflare/io.py
DEFAULT_BLOCK_SIZE = 16  # the reference's default when config.json has no block_size

# fields every DFlash config.json must carry (the rest have Qwen3 or DFlash defaults)
_REQUIRED_TOP = ("hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads", "vocab_size",
                 "num_target_layers")
# optional drafter fields: name -> default (read from dflash_config, then the top level)
_DRAFT_EXTRAS: dict[str, Any] = {"input_embedding_scale": 1.0, "output_multiplier": 1.0,
                                 "final_logit_softcapping": None}

PathLike = Union[str, Path]


def _draft_value(hf: Mapping[str, Any], name: str, default: Any = None) -> Any:
    """A drafter field as the reference reads it: ``dflash_config[name]``, else ``hf[name]``, else default."""
    dflash = hf.get("dflash_config")
    dflash = dflash if isinstance(dflash, dict) else {}
    value = dflash.get(name, hf.get(name, default))
    return default if value is None else value


def _not_a_drafter(hf: Mapping[str, Any], source: str) -> list[str]:
    """What makes ``hf`` not a DFlash drafter config (empty when it is one)."""
    problems = []
    archs = hf.get("architectures")
    if archs is not None and ARCHITECTURE not in archs:
        problems.append(f"architectures is {archs!r}, expected [{ARCHITECTURE!r}]")
    if hf.get("dflash_config") is not None and not isinstance(hf.get("dflash_config"), dict):
        problems.append(f"dflash_config must be a JSON object, got {hf['dflash_config']!r}")
    missing = [n for n in _REQUIRED_TOP if hf.get(n) is None]
    if _draft_value(hf, "mask_token_id") is None:
        missing.append("dflash_config.mask_token_id")
    if missing:
        problems.append("missing " + ", ".join(missing))
    return problems


def config_from_hf(hf: Mapping[str, Any], source: str = "config.json") -> DFlashConfig:
    """Translate a DFlash ``config.json`` dict; ValueError naming every missing or invalid field."""
    archs = hf.get("architectures") or []
    if ARCHITECTURE_V2 in archs:
        raise ValueError(f"{source}: a DFlash 2 checkpoint ({ARCHITECTURE_V2}: grouped dynamic convolutions and a "
                         f"candidate selector); load it with dllm.drafters.dflash.dflash2.io.load_dflash2 (or "
                         f"load_any_dflash, which picks the architecture)")
    if ARCHITECTURE_DFLARE in archs:
        raise ValueError(f"{source}: a DFlare checkpoint ({ARCHITECTURE_DFLARE}: per-layer fusion of the tapped target "
                         f"layers); load it with dllm.drafters.dflash.dflare.io.load_dflare (or load_any_dflash, "
                         f"which picks the architecture)")
    problems = _not_a_drafter(hf, source)
    if problems:
        raise ValueError(
            f"{source} is not a DFlash drafter config: {'; '.join(problems)}. A DFlash drafter's config.json "
            f"is a Qwen3 config with architectures [{ARCHITECTURE!r}], num_target_layers, block_size and "
            "dflash_config {target_layer_ids, mask_token_id}")
    from transformers import Qwen3Config

    try:
        qc = Qwen3Config.from_dict(dict(hf))
    except Exception as e:  # strict field validation of transformers' config class
        raise ValueError(f"{source}: not a valid Qwen3 config: {e}") from None
    rope = dict(qc.rope_parameters)
    theta = rope.pop("rope_theta", 10000.0)
    if rope.get("rope_type", "default") == "default":
        rope.pop("rope_type", None)
    scaling = tuple(sorted((k, tuple(v) if isinstance(v, list) else v) for k, v in rope.items()))
    num_layers = qc.num_hidden_layers
    types = tuple(qc.layer_types or ())
    types = () if all(t == FULL_ATTENTION for t in types) else types  # () means all full
    ids = _draft_value(hf, "target_layer_ids")
    try:
        ids = tap_layer_ids(hf["num_target_layers"], num_layers) if ids is None else tuple(ids)
        return DFlashConfig(
            hidden_size=qc.hidden_size, intermediate_size=qc.intermediate_size, num_layers=num_layers,
            num_heads=qc.num_attention_heads, num_kv_heads=qc.num_key_value_heads,
            head_dim=qc.head_dim or qc.hidden_size // qc.num_attention_heads, vocab_size=qc.vocab_size,
            num_target_layers=hf["num_target_layers"], target_layer_ids=ids,
            block_size=_draft_value(hf, "block_size", DEFAULT_BLOCK_SIZE),
            mask_token_id=_draft_value(hf, "mask_token_id"), rms_norm_eps=float(qc.rms_norm_eps),
            rope_theta=float(theta), rope_scaling=scaling, max_position_embeddings=qc.max_position_embeddings,
            attention_bias=bool(qc.attention_bias), hidden_act=qc.hidden_act,
            layer_types=types, sliding_window=qc.sliding_window,
            is_causal=hf.get("is_causal"),
            **{name: _draft_value(hf, name, default) for name, default in _DRAFT_EXTRAS.items()},
        )
    except (ValueError, TypeError) as e:
        raise ValueError(f"{source}: {e}") from None


def config_to_hf(config: DFlashConfig, base: Optional[Mapping[str, Any]] = None,
                 dtype: Optional[torch.dtype] = None) -> dict[str, Any]:
    """The ``config.json`` dict of a drafter: ``base`` (the loaded config.json, if any) with every
    field this package knows overwritten, so unknown fields (``auto_map``, token ids) survive."""
    out: dict[str, Any] = dict(base or {})
    dflash = dict(out.get("dflash_config") or {})
    rope = config.rope_dict()
    scaling = {k: v for k, v in rope.items() if k != "rope_theta"}
    types = list(config.layer_types) or [FULL_ATTENTION] * config.num_layers
    out.update(
        architectures=[ARCHITECTURE], model_type="qwen3", hidden_size=config.hidden_size,
        intermediate_size=config.intermediate_size, num_hidden_layers=config.num_layers,
        num_attention_heads=config.num_heads, num_key_value_heads=config.num_kv_heads, head_dim=config.head_dim,
        vocab_size=config.vocab_size, rms_norm_eps=config.rms_norm_eps, attention_bias=config.attention_bias,
        hidden_act=config.hidden_act, max_position_embeddings=config.max_position_embeddings,
        num_target_layers=config.num_target_layers, block_size=config.block_size, layer_types=types,
        sliding_window=config.sliding_window, use_sliding_window=config.sliding_window is not None,
        rope_parameters=rope, rope_theta=config.rope_theta,
        rope_scaling=None if scaling.get("rope_type", "default") == "default" and len(scaling) == 1 else scaling,
    )
    if config.sliding_window is not None and SLIDING_ATTENTION in types:
        out["max_window_layers"] = types.index(SLIDING_ATTENTION)
    if config.is_causal is None:
        out.pop("is_causal", None)
    else:
        out["is_causal"] = config.is_causal
    dflash.update(target_layer_ids=list(config.target_layer_ids), mask_token_id=config.mask_token_id)
    if "block_size" in dflash:
        dflash["block_size"] = config.block_size
    for name in ("target_layer_ids", "mask_token_id"):  # a top-level copy must not disagree
        if name in out:
            out[name] = dflash[name]
    for name, default in _DRAFT_EXTRAS.items():
        value = getattr(config, name)
        if name in out:
            out[name] = value
        if name in dflash or (value != default and name not in out):
            dflash[name] = value
    out["dflash_config"] = dflash
    if dtype is not None:
        out["dtype"] = DTYPE_NAMES.get(dtype, str(dtype).removeprefix("torch."))
        if "torch_dtype" in out:
            out["torch_dtype"] = out["dtype"]
    return out


def check_target(config: Union[DFlashConfig, DFlashDrafter], target: Any) -> None:
    """ValueError listing every way ``target`` (a transformers causal LM or its config) cannot feed
    this drafter (or config): hidden size, layer count, tapped layers, the mask id's embedding row."""
    config = config.config if isinstance(config, DFlashDrafter) else config
    tc = getattr(target, "config", target)
    if hasattr(tc, "get_text_config"):
        tc = tc.get_text_config()
    get = (lambda k: tc.get(k)) if isinstance(tc, Mapping) else (lambda k: getattr(tc, k, None))
    rows = (target.get_input_embeddings().weight.shape[0] if hasattr(target, "get_input_embeddings")
            else get("vocab_size"))
    problems = []
    if get("hidden_size") != config.hidden_size:
        problems.append(f"hidden size {get('hidden_size')} (the drafter's is {config.hidden_size})")
    layers = get("num_hidden_layers")
    if layers != config.num_target_layers:
        problems.append(f"{layers} layers (the drafter was built for num_target_layers = {config.num_target_layers})")
    ids = config.target_layer_ids
    if layers is not None and max(ids) >= layers:
        problems.append(f"no layer {max(ids)} to tap (target_layer_ids {list(ids)})")
    if rows is not None and config.mask_token_id >= rows:
        problems.append(f"{rows} embedding rows, so no row for mask_token_id {config.mask_token_id}")
    if problems:
        raise ValueError("this DFlash drafter does not fit the target: the target has " + "; ".join(problems))


def load_dflash(
    name_or_path: PathLike,
    *,
    dtype: Union[torch.dtype, str, None] = None,
    device: Union[str, torch.device, None] = None,
    target: Any = None,
    quantization: Optional[str] = None,
) -> DFlashDrafter:
    """Load an official DFlash checkpoint (local directory, embedded name or Hub id) unchanged.

    dtype: a floating dtype or name ("auto"/None: the config's dtype, else the stored one).
    target: optional transformers model or config to check the drafter against (``check_target``).
    quantization: "int8" | "int4" | "nf4": weight-only quantization of its linear layers
    (``dllm.models.quantize``).
    Errors: ValueError for a config that is not a DFlash drafter (naming what is missing);
    ``CheckpointError`` listing missing / unexpected / mis-shaped keys or non-finite weights.
    """
    return load_drafter_checkpoint(name_or_path, config_from_hf, DFlashDrafter, dtype=dtype, device=device,
                                   target=target, quantization=quantization)


def load_drafter_checkpoint(
    name_or_path: PathLike,
    parse_config: Callable[..., Any],
    model_class: type,
    *,
    dtype: Union[torch.dtype, str, None] = None,
    device: Union[str, torch.device, None] = None,
    target: Any = None,
    stored_name: Callable[[str, Mapping[str, Any]], str] = lambda key, shapes: key,
    quantization: Optional[str] = None,
):
    """The loading steps every DFlash architecture shares: locate the directory, parse its config
    (``parse_config(hf, source=...)``), check it against ``target``, build ``model_class`` on the meta
    device, check the stored keys (``stored_name(key, stored_shapes)`` maps a parameter to its name in
    the checkpoint), refuse non-finite weights, load in ``dtype`` on ``device``."""
    device = resolve_device(device)
    directory = locate(name_or_path)
    hf = read_config(directory)
    config = parse_config(hf, source=repr(str(directory / "config.json")))
    if target is not None:
        check_target(config, target)
    reader = open_checkpoint(directory)
    want = resolve_dtype(dtype, hf, reader.stored_dtype())
    with torch.device("meta"):
        model = model_class(config, hf_config=hf)
    expected = {k: tuple(v.shape) for k, v in model.state_dict().items()}
    stored = {k: stored_name(k, reader.shapes) for k in expected}
    official = {name: key for key, name in stored.items()}  # checkpoint name -> parameter
    check_keys(expected, {official.get(name, name): shape for name, shape in reader.shapes.items()},
               repr(str(directory)))
    state, bad = {}, []
    for key in expected:
        tensor = reader.get(stored[key])
        counts = nonfinite_counts(tensor)
        if counts is not None:
            bad.append(f"{stored[key]} ({counts[0]} NaN, {counts[1]} inf)")
        state[key] = tensor.to(device=device or "cpu", dtype=want)
    if bad:
        raise CheckpointError(f"checkpoint {str(directory)!r} has non-finite weights: " + ", ".join(bad))
    model.load_state_dict(state, strict=True, assign=True)
    return quantize_model(model.eval(), quantization)


def save_dflash(model: DFlashDrafter, directory: PathLike, *, max_shard_size: Optional[int] = None) -> Path:
    """Write ``config.json`` + ``model.safetensors`` (shards + index past ``max_shard_size`` bytes) in
    the official format, loadable by ``load_dflash`` and by the reference's ``from_pretrained``."""
    return save_drafter_checkpoint(model, directory, model.state_dict(), config_to_hf, max_shard_size)


def save_drafter_checkpoint(model: nn.Module, directory: PathLike, state: Mapping[str, torch.Tensor],
                            to_hf: Callable[..., dict], max_shard_size: Optional[int] = None) -> Path:
    """Write ``state`` (official key names) as safetensors and ``to_hf(config, hf_config, dtype)`` as
    ``config.json``: the saving steps every DFlash architecture shares."""
    refuse_quantized_save(model)
    directory = Path(directory)
    meta = [k for k, v in state.items() if v.is_meta]
    if meta:
        raise ValueError(f"cannot save a drafter whose weights are not materialised (meta): {meta[:3]} ...")
    write_safetensors(dict(state), directory, max_shard_size)
    hf = to_hf(model.config, model.hf_config, model.dtype)
    (directory / "config.json").write_text(json.dumps(hf, indent=2, sort_keys=True) + "\n")
    return directory


def _target_field(target_config: Any, name: str, default: Any = None) -> Any:
    if isinstance(target_config, Mapping):
        return target_config.get(name, default)
    value = getattr(target_config, name, default)
    return default if value is None else value


def random_dflash(
    target_config: Any,
    num_draft_layers: int,
    block_size: int,
    mask_token_id: int,
    seed: int = 0,
    *,
    target_layer_ids: Optional[tuple[int, ...]] = None,
    dtype: torch.dtype = torch.float32,
) -> DFlashDrafter:
    """A freshly initialised drafter for a target (a transformers model, its config, or a config dict).

    Sizes and taps: ``drafter_config``; weights ~ N(0, 0.02) from ``seed``, norms 1.
    """
    model = DFlashDrafter(drafter_config(target_config, num_draft_layers, block_size, mask_token_id,
                                         target_layer_ids=target_layer_ids))
    model.init_weights(generator=torch.Generator().manual_seed(seed))
    return model.to(dtype).eval()


def drafter_config(target_config: Any, num_draft_layers: int, block_size: int, mask_token_id: int, *,
                   target_layer_ids: Optional[tuple[int, ...]] = None) -> DFlashConfig:
    """The DFlash config of a drafter for a target (a transformers model, its config, or a config
    dict): sizes (hidden, MLP, heads, head_dim, RoPE, norm eps) copy the target's, as DFlash drafters
    do; taps default to ``tap_layer_ids``."""
    tc = getattr(target_config, "config", target_config)
    if isinstance(target_config, nn.Module) and not hasattr(target_config, "config"):
        raise ValueError("random_dflash needs the target's config (or a transformers model carrying one)")
    if hasattr(tc, "get_text_config"):
        tc = tc.get_text_config()
    field = lambda name, default=None: _target_field(tc, name, default)  # noqa: E731
    missing = [n for n in ("hidden_size", "intermediate_size", "num_attention_heads", "num_hidden_layers",
                           "vocab_size") if field(n) is None]
    if missing:
        raise ValueError(f"the target config lacks {', '.join(missing)}; pass a transformers causal-LM config")
    rope = dict(field("rope_parameters") or {})
    theta = rope.pop("rope_theta", field("rope_theta", 10000.0))
    if rope.get("rope_type", "default") == "default":
        rope.pop("rope_type", None)
    hidden, heads = field("hidden_size"), field("num_attention_heads")
    config = DFlashConfig(
        hidden_size=hidden, intermediate_size=field("intermediate_size"), num_layers=num_draft_layers,
        num_heads=heads, num_kv_heads=field("num_key_value_heads", heads), head_dim=field("head_dim", hidden // heads),
        vocab_size=field("vocab_size"), num_target_layers=field("num_hidden_layers"),
        target_layer_ids=tuple(target_layer_ids) if target_layer_ids is not None else tap_layer_ids(
            field("num_hidden_layers"), num_draft_layers),
        block_size=block_size, mask_token_id=mask_token_id, rms_norm_eps=float(field("rms_norm_eps", 1e-6)),
        rope_theta=float(theta), rope_scaling=tuple(sorted((k, tuple(v) if isinstance(v, list) else v)
                                                           for k, v in rope.items())),
        max_position_embeddings=field("max_position_embeddings", 32768), hidden_act=field("hidden_act", "silu"),
    )
    return config


__all__ = ["ARCHITECTURE", "ARCHITECTURE_DFLARE", "ARCHITECTURE_V2", "check_target", "config_from_hf", "config_to_hf", "drafter_config", "load_dflash", "load_drafter_checkpoint",
           "random_dflash", "save_drafter_checkpoint",
           "save_dflash"]
