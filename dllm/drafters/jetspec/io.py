"""JetSpec draft-head checkpoints: the authors' layout, loaded into a causal ``DFlashDrafter``.

The JetSpec head (Hu et al., arXiv 2606.18394; code hao-ai-lab/JetSpec ``jetflow/models/draft_head.py``,
``DFlashDraftModel``) is a DFlash drafter whose checkpoint says ``dflash_config.causal_head: true``:
same ``config.json`` (a Qwen3 config with ``architectures: ["DFlashDraftModel"]``, ``block_size``,
``num_target_layers``, ``dflash_config {target_layer_ids, mask_token_id, causal_head}``) and the same
safetensors key names (``layers.N.self_attn.q_proj.weight``, ``fc.weight``, ``hidden_norm.weight``, ...).
The flag makes every draft layer block-causal: block position i attends to the whole context and to
block positions 0..i only (``_build_dflash_causal_attention_mask`` there; keys are ordered context,
then block, so "index <= query index" is "position <= query position" here, which is what
``DFlashConfig(is_causal=True)`` gives). Everything else (fusion ``hidden_norm(fc(taps))``, KV
injection, the target's embedding and LM head, drafts read at block positions 1..B-1) is DFlash's,
so the network is ``dflash.model.DFlashDrafter`` with ``is_causal=True``.

Not read: ``dflash_config.target_hidden_size`` different from ``hidden_size`` (the authors'
random-init ``HiddenDimAdapter``, a smoke-test path) is refused.
"""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path
from typing import Any, Mapping, Optional, Union

import torch

from dllm.drafters.dflash.config import DFlashConfig
from dllm.drafters.dflash.io import (config_from_hf as dflash_config_from_hf, config_to_hf as dflash_config_to_hf,
                                     load_drafter_checkpoint, random_dflash, save_drafter_checkpoint)
from dllm.drafters.dflash.model import DFlashDrafter

PathLike = Union[str, Path]


def config_from_hf(hf: Mapping[str, Any], source: str = "config.json") -> DFlashConfig:
    """A JetSpec head's ``config.json`` -> a causal ``DFlashConfig``; ValueError when it is not one."""
    dflash = hf.get("dflash_config") if isinstance(hf.get("dflash_config"), dict) else {}
    if dflash.get("causal_head") is not True:
        raise ValueError(f"{source} is not a JetSpec causal draft head: dflash_config.causal_head is "
                         f"{dflash.get('causal_head')!r}, expected true (a bidirectional DFlash drafter loads with "
                         f"the dflash drafter: dflash:model=...)")
    width = dflash.get("target_hidden_size")
    if width is not None and width != hf.get("hidden_size"):
        raise ValueError(f"{source}: dflash_config.target_hidden_size {width} differs from hidden_size "
                         f"{hf.get('hidden_size')}; the authors' hidden-size adapter is a random-init smoke path, "
                         f"not supported")
    return replace(dflash_config_from_hf(hf, source), is_causal=True)


def config_to_hf(config: DFlashConfig, base: Optional[Mapping[str, Any]] = None,
                 dtype: Optional[torch.dtype] = None) -> dict[str, Any]:
    """The authors' ``config.json``: DFlash's, with ``dflash_config.causal_head: true`` carrying the mask
    (no top-level ``is_causal``: their attention reads the flag only)."""
    out = dflash_config_to_hf(config, base, dtype)
    out.pop("is_causal", None)
    out["dflash_config"] = {**out.get("dflash_config", {}), "causal_head": True}
    return out


def check_causal(model: Any) -> DFlashDrafter:
    """``model`` if it is a causal-head ``DFlashDrafter``; TypeError / ValueError otherwise."""
    if not isinstance(model, DFlashDrafter) or type(model) is not DFlashDrafter:
        raise TypeError(f"the jetspec drafter's model must be a DFlashDrafter with a causal head "
                        f"(dllm.drafters.jetspec.io.load_jetspec / random_jetspec), got {type(model).__name__}")
    if model.config.is_causal is not True:
        raise ValueError("the jetspec drafter needs a causal draft head (DFlashConfig.is_causal=True, "
                         "config.json dflash_config.causal_head: true); this DFlashDrafter attends "
                         "bidirectionally inside the block: use the dflash drafter for it")
    return model


def load_jetspec(name_or_path: PathLike, *, dtype: Union[torch.dtype, str, None] = None,
                 device: Union[str, torch.device, None] = None, target: Any = None,
                 quantization: Optional[str] = None) -> DFlashDrafter:
    """Load a JetSpec head (directory, embedded name or Hub id) in the authors' layout, unchanged.

    Errors: ValueError for a config that is not a causal DFlash head (naming the field);
    ``CheckpointError`` for missing / unexpected / mis-shaped keys or non-finite weights."""
    return load_drafter_checkpoint(name_or_path, config_from_hf, DFlashDrafter, dtype=dtype, device=device,
                                   target=target, quantization=quantization)


def save_jetspec(model: DFlashDrafter, directory: PathLike) -> Path:
    """Write ``config.json`` + ``model.safetensors`` in the authors' layout (``load_jetspec`` reads it,
    and so does their ``DFlashDraftModel.from_pretrained``)."""
    check_causal(model)
    return save_drafter_checkpoint(model, directory, model.state_dict(), config_to_hf)


def random_jetspec(target_config: Any, num_draft_layers: int, block_size: int, mask_token_id: int, seed: int = 0,
                   *, target_layer_ids: Optional[tuple[int, ...]] = None,
                   dtype: torch.dtype = torch.float32) -> DFlashDrafter:
    """A freshly initialised causal head for a target (``dflash.io.random_dflash`` with ``is_causal``)."""
    base = random_dflash(target_config, num_draft_layers, block_size, mask_token_id, seed,
                         target_layer_ids=target_layer_ids, dtype=dtype)
    return causal_copy(base)


def causal_copy(model: DFlashDrafter) -> DFlashDrafter:
    """The same weights under a causal head (a warm start from a bidirectional DFlash drafter)."""
    hf = dict(model.hf_config or {})
    hf.pop("is_causal", None)
    out = DFlashDrafter(replace(model.config, is_causal=True), hf_config=hf)
    out.load_state_dict(model.state_dict())
    return out.to(next(model.parameters()).dtype)


__all__ = ["causal_copy", "check_causal", "config_from_hf", "config_to_hf", "load_jetspec", "random_jetspec",
           "save_jetspec"]
