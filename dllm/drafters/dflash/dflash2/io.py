"""DFlash 2 drafter checkpoints: load the official z-lab format unchanged, save it back, build random ones.

Source: z-lab/dflash ``dflash/model.py`` (``DFlash2DraftModel``, package ``dflash`` 0.1.0), no paper.
The format is DFlash's (``io.py``) with ``architectures: ["DFlash2DraftModel"]``, four more
drafter fields (read from ``dflash_config`` first, then the top level, as the reference reads them):
``conv_kernel_size``, ``conv_group_size``, ``selector_top_k``, ``selector_rank``, and more weights:

- ``layers.N.attention_conv.base_kernel`` [2, k, D], ``layers.N.attention_conv.kernel_projection.weight``
  [2*k*D/group, D], the same under ``layers.N.mlp_conv``;
- ``candidate_selector.predecessor_codebook`` [V, r] and ``candidate_selector.successor_codebook``
  [V, r] -- no ``.weight`` suffix: the reference maps them onto its embeddings with a ``key_mapping``
  at load time and writes them back bare -- and ``candidate_selector.hidden_projection.weight`` [r, D].

A checkpoint written by the reference from a freshly built model (``save_pretrained`` without that
mapping) names the codebooks ``...codebook.weight``; ``load_dflash2`` accepts both spellings.
Nothing here runs remote code. ``load_any_dflash`` dispatches on ``architectures`` between both versions
and DFlare (``dflare/io.py``).
"""

from __future__ import annotations

from dataclasses import fields
from pathlib import Path
from typing import Any, Mapping, Optional, Union

import torch

from dllm.drafters.dflash.dflash2.model import DFlash2Config, DFlash2Drafter
from dllm.drafters.dflash.config import DFlashConfig
from dllm.drafters.dflash.dflare.io import is_dflare_config, load_dflare
from dllm.drafters.dflash.io import (ARCHITECTURE, ARCHITECTURE_DFLARE, ARCHITECTURE_V2, _draft_value, config_from_hf,
                                     config_to_hf, load_dflash, load_drafter_checkpoint, random_dflash,
                                     save_drafter_checkpoint)
from dllm.drafters.dflash.model import DFlashDrafter
from dllm.models.loading import locate, read_config

PathLike = Union[str, Path]

# the DFlash 2 fields of config.json (dflash_config first, then the top level); all required
V2_FIELDS = ("conv_kernel_size", "conv_group_size", "selector_top_k", "selector_rank")
# codebooks: official (bare) checkpoint name -> the spelling of a reference model saved without key_mapping
_CODEBOOK_ALIASES = {f"candidate_selector.{n}": f"candidate_selector.{n}.weight"
                     for n in ("predecessor_codebook", "successor_codebook")}


def dflash_version(hf: Mapping[str, Any], source: str = "config.json") -> int:
    """1 for a DFlash config (``DFlashDraftModel``), 2 for DFlash 2 (``DFlash2DraftModel``).

    Without ``architectures``, a config carrying ``conv_kernel_size`` is DFlash 2, else DFlash.
    ValueError for any other architecture.
    """
    archs = hf.get("architectures")
    if archs is None:
        return 2 if _draft_value(hf, "conv_kernel_size") is not None else 1
    if ARCHITECTURE_V2 in archs:
        return 2
    if ARCHITECTURE in archs:
        return 1
    raise ValueError(f"{source} is not a DFlash drafter config: architectures is {archs!r}, expected "
                     f"[{ARCHITECTURE!r}] (DFlash) or [{ARCHITECTURE_V2!r}] (DFlash 2), or [{ARCHITECTURE_DFLARE!r}] "
                     f"(DFlare, read by load_any_dflash)")


def config_from_hf2(hf: Mapping[str, Any], source: str = "config.json") -> DFlash2Config:
    """Translate a DFlash 2 ``config.json`` dict; ValueError naming every missing or invalid field."""
    if dflash_version(hf, source) != 2:
        raise ValueError(f"{source} is a DFlash (v1) config ({ARCHITECTURE!r}), not DFlash 2: load it with "
                         "dllm.drafters.dflash.io.load_dflash (or load_any_dflash)")
    missing = [f"dflash_config.{n}" for n in V2_FIELDS if _draft_value(hf, n) is None]
    try:  # the DFlash fields, translated as for a DFlash checkpoint
        base: Optional[DFlashConfig] = config_from_hf({**hf, "architectures": [ARCHITECTURE]}, source)
        base_problem = ""
    except ValueError as e:
        base, base_problem = None, str(e)
    if missing or base is None:
        parts = [f"missing DFlash 2 field(s) {', '.join(missing)}"] if missing else []
        parts += [base_problem] if base_problem else []
        raise ValueError(f"{source} is not a usable DFlash 2 drafter config: {'; '.join(parts)}")
    values = {f.name: getattr(base, f.name) for f in fields(base)}
    try:
        return DFlash2Config(**values, **{n: _draft_value(hf, n) for n in V2_FIELDS})
    except (ValueError, TypeError) as e:
        raise ValueError(f"{source}: {e}") from None


def config_to_hf2(config: DFlash2Config, base: Optional[Mapping[str, Any]] = None,
                  dtype: Optional[torch.dtype] = None) -> dict[str, Any]:
    """The ``config.json`` dict of a DFlash 2 drafter (``config_to_hf`` + architecture + the DFlash 2 fields
    in ``dflash_config``; a top-level copy of one of them is kept in agreement)."""
    out = config_to_hf(config, base, dtype)
    out["architectures"] = [ARCHITECTURE_V2]
    dflash = dict(out["dflash_config"])
    for name in V2_FIELDS:
        dflash[name] = getattr(config, name)
        if name in out:
            out[name] = dflash[name]
    out["dflash_config"] = dflash
    return out


def _stored_name(key: str, found: Mapping[str, Any]) -> str:
    """The checkpoint's name for parameter ``key`` (a codebook may carry a ``.weight`` suffix)."""
    alias = _CODEBOOK_ALIASES.get(key)
    return alias if key not in found and alias is not None and alias in found else key


def load_dflash2(
    name_or_path: PathLike,
    *,
    dtype: Union[torch.dtype, str, None] = None,
    device: Union[str, torch.device, None] = None,
    target: Any = None,
    quantization: Optional[str] = None,
) -> DFlash2Drafter:
    """Load an official DFlash 2 checkpoint (local directory, embedded name or Hub id) unchanged.

    Arguments and errors as ``io.load_dflash``: ValueError for a config that is not DFlash 2
    (naming the missing fields), ``CheckpointError`` listing missing / unexpected / mis-shaped keys
    (official names) or non-finite weights.
    """
    return load_drafter_checkpoint(name_or_path, config_from_hf2, DFlash2Drafter, dtype=dtype, device=device,
                                   target=target, stored_name=_stored_name, quantization=quantization)


def save_dflash2(model: DFlash2Drafter, directory: PathLike, *, max_shard_size: Optional[int] = None) -> Path:
    """Write ``config.json`` + safetensors in the official DFlash 2 format (bare codebook names),
    loadable by ``load_dflash2`` and by the reference's ``DFlash2DraftModel.from_pretrained``."""
    return save_drafter_checkpoint(model, directory, model.state_dict(), config_to_hf2, max_shard_size)


def load_any_dflash(
    name_or_path: PathLike,
    *,
    dtype: Union[torch.dtype, str, None] = None,
    device: Union[str, torch.device, None] = None,
    target: Any = None,
    quantization: Optional[str] = None,
) -> DFlashDrafter:
    """``load_dflash``, ``load_dflash2`` or ``dflare.io.load_dflare``, by the checkpoint's ``architectures``
    (ValueError for none of them)."""
    directory = locate(name_or_path)
    hf = read_config(directory)
    if is_dflare_config(hf):
        return load_dflare(directory, dtype=dtype, device=device, target=target, quantization=quantization)
    version = dflash_version(hf, repr(str(directory / "config.json")))
    load = load_dflash2 if version == 2 else load_dflash
    return load(directory, dtype=dtype, device=device, target=target, quantization=quantization)


def random_dflash2(
    target_config: Any,
    num_draft_layers: int,
    block_size: int,
    mask_token_id: int,
    seed: int = 0,
    *,
    conv_kernel_size: int = 4,
    conv_group_size: int = 16,
    selector_top_k: int = 8,
    selector_rank: int = 32,
    target_layer_ids: Optional[tuple[int, ...]] = None,
    dtype: torch.dtype = torch.float32,
) -> DFlash2Drafter:
    """A freshly initialised DFlash 2 drafter for a target (sizes as ``random_dflash``; weights from
    ``DFlash2Drafter.init_weights``: N(0, 0.02), norms 1, identity base kernels)."""
    base = random_dflash(target_config, num_draft_layers, block_size, mask_token_id, seed,
                         target_layer_ids=target_layer_ids).config
    config = DFlash2Config(**{f.name: getattr(base, f.name) for f in fields(base)},
                           conv_kernel_size=conv_kernel_size, conv_group_size=conv_group_size,
                           selector_top_k=selector_top_k, selector_rank=selector_rank)
    model = DFlash2Drafter(config)
    model.init_weights(generator=torch.Generator().manual_seed(seed))
    return model.to(dtype).eval()


__all__ = ["V2_FIELDS", "config_from_hf2", "config_to_hf2", "dflash_version", "load_any_dflash", "load_dflash2",
           "random_dflash2", "save_dflash2"]
