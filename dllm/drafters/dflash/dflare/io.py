"""DFlare drafter checkpoints: load the authors' format unchanged, save it back, build random ones.

Source: Tencent/AngelSlim ``angelslim/compressor/speculative/train/models/draft/qwen_dflare.py``
(``QwenDFlareDraftModel``, a transformers ``Qwen3PreTrainedModel``; arXiv 2606.02091) and its draft
config ``configs/qwen3_dflare.json``. The checkpoint is what ``save_pretrained`` writes for that
class: ``config.json`` -- a Qwen3 config with ``architectures: ["QwenDFlareDraftModel"]``,
``block_size``, ``num_target_layers`` and ``dflash_config: {target_layer_ids, mask_token_id}`` (the
DFlash keys; training extras such as ``num_anchors`` ride along) -- and safetensors weights named

- ``layer_fusion_weights`` [L, T] (fusion logits: draft layers x tapped target layers) and ``hidden_norm.weight``;
- DFlash's layer weights (``io.py``) plus ``layers.N.self_attn.k_proj_target.weight`` and
  ``layers.N.self_attn.v_proj_target.weight`` [Hkv*hd, D];
- ``norm.weight``; no ``fc.weight``, no embedding table, no LM head (the target's are used).

The reference's benchmark (``tools/dflash_benchmark.py --draft-arch dflare``) loads it with
``QwenDFlareDraftModel.from_pretrained``. Nothing here runs remote code.
"""

from __future__ import annotations

from dataclasses import fields
from pathlib import Path
from typing import Any, Mapping, Optional, Union

import torch

from dllm.drafters.dflash.config import DFlashConfig
from dllm.drafters.dflash.dflare.model import DFlareConfig, DFlareDrafter
from dllm.drafters.dflash.io import (ARCHITECTURE, ARCHITECTURE_DFLARE, config_from_hf, config_to_hf, drafter_config,
                                     load_drafter_checkpoint, save_drafter_checkpoint)

PathLike = Union[str, Path]


def is_dflare_config(hf: Mapping[str, Any]) -> bool:
    """True when ``config.json`` names the DFlare architecture."""
    return ARCHITECTURE_DFLARE in (hf.get("architectures") or [])


def dflare_config(base: DFlashConfig) -> DFlareConfig:
    """The same drafter fields read as a DFlare config (ValueError for what DFlare does not run)."""
    return DFlareConfig(**{f.name: getattr(base, f.name) for f in fields(base)})


def config_from_hf_dflare(hf: Mapping[str, Any], source: str = "config.json") -> DFlareConfig:
    """Translate a DFlare ``config.json`` dict; ValueError naming every missing or invalid field."""
    if not is_dflare_config(hf):
        raise ValueError(f"{source} is not a DFlare drafter config: architectures is {hf.get('architectures')!r}, "
                         f"expected [{ARCHITECTURE_DFLARE!r}]")
    base = config_from_hf({**hf, "architectures": [ARCHITECTURE]}, source)  # the DFlash fields, read alike
    try:
        return dflare_config(base)
    except ValueError as e:
        raise ValueError(f"{source}: {e}") from None


def config_to_hf_dflare(config: DFlareConfig, base: Optional[Mapping[str, Any]] = None,
                        dtype: Optional[torch.dtype] = None) -> dict[str, Any]:
    """The ``config.json`` dict of a DFlare drafter (``config_to_hf`` with the DFlare architecture)."""
    out = config_to_hf(config, base, dtype)
    out["architectures"] = [ARCHITECTURE_DFLARE]
    return out


def load_dflare(
    name_or_path: PathLike,
    *,
    dtype: Union[torch.dtype, str, None] = None,
    device: Union[str, torch.device, None] = None,
    target: Any = None,
    quantization: Optional[str] = None,
) -> DFlareDrafter:
    """Load an authors' DFlare checkpoint (local directory, embedded name or Hub id) unchanged.

    Arguments and errors as ``io.load_dflash``: ValueError for a config that is not DFlare,
    ``CheckpointError`` listing missing / unexpected / mis-shaped keys or non-finite weights.
    """
    return load_drafter_checkpoint(name_or_path, config_from_hf_dflare, DFlareDrafter, dtype=dtype, device=device,
                                   target=target, quantization=quantization)


def save_dflare(model: DFlareDrafter, directory: PathLike, *, max_shard_size: Optional[int] = None) -> Path:
    """Write ``config.json`` + safetensors in the authors' DFlare format, loadable by ``load_dflare`` and
    by the reference's ``QwenDFlareDraftModel.from_pretrained``."""
    if not isinstance(model, DFlareDrafter):
        raise TypeError(f"save_dflare needs a DFlareDrafter, got {type(model).__name__}")
    return save_drafter_checkpoint(model, directory, model.state_dict(), config_to_hf_dflare, max_shard_size)


def random_dflare(
    target_config: Any,
    num_draft_layers: int,
    block_size: int,
    mask_token_id: int,
    seed: int = 0,
    *,
    target_layer_ids: Optional[tuple[int, ...]] = None,
    dtype: torch.dtype = torch.float32,
) -> DFlareDrafter:
    """A freshly initialised DFlare drafter for a target (sizes and default taps as ``random_dflash``;
    weights N(0, 0.02), norms 1, fusion logits ``dflare.model.fusion_init``)."""
    base = drafter_config(target_config, num_draft_layers, block_size, mask_token_id, target_layer_ids=target_layer_ids)
    model = DFlareDrafter(dflare_config(base))
    model.init_weights(generator=torch.Generator().manual_seed(seed))
    return model.to(dtype).eval()


__all__ = ["config_from_hf_dflare", "config_to_hf_dflare", "dflare_config", "is_dflare_config", "load_dflare",
           "random_dflare", "save_dflare"]
