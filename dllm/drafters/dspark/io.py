"""DSpark checkpoints in the authors' format (DeepSpec ``Qwen3DSparkModel.save_pretrained``; config
built by ``deepspec/modeling/dspark/qwen3/config.py`` ``build_draft_config``).

``config.json``: the target's Qwen3 config with ``architectures: ["Qwen3DSparkModel"]``,
``num_hidden_layers`` = draft layers, ``num_target_layers``, ``block_size`` (K, drafts per block),
``mask_token_id``, ``target_layer_ids``, ``num_anchors`` (training only), ``markov_rank`` (+
``markov_head_type`` when > 0), ``enable_confidence_head`` (+ ``confidence_head_with_markov``), all at
the top level. Weights (safetensors): the DFlash body's names (``layers.N.*``, ``fc``, ``hidden_norm``,
``norm``) plus ``embed_tokens.weight``, ``lm_head.weight``, ``markov_head.markov_w1.weight``,
``markov_head.markov_w2.weight`` (``gate_proj`` / ``joint_proj`` for the gated / rnn heads) and
``confidence_head.proj.{weight,bias}``. A tap of the embedding output (target layer id -1, allowed by
the authors' config) is refused: ``dllm`` taps decoder layers only.
"""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path
from typing import Any, Mapping, Optional, Union

import torch

from dllm.drafters.dflash.io import ARCHITECTURE as DFLASH_ARCHITECTURE
from dllm.drafters.dflash.io import config_from_hf as dflash_config_from_hf
from dllm.drafters.dflash.io import config_to_hf as dflash_config_to_hf
from dllm.drafters.dflash.io import load_drafter_checkpoint, random_dflash
from dllm.drafters.dspark.model import DSparkConfig, DSparkHeads, DSparkModel
from dllm.models.checkpoint import write_safetensors
from dllm.models.quantize import refuse_quantized_save

ARCHITECTURE = "Qwen3DSparkModel"
_REQUIRED = ("target_layer_ids", "mask_token_id", "block_size", "num_target_layers", "markov_rank",
             "enable_confidence_head")

PathLike = Union[str, Path]


def config_from_hf(hf: Mapping[str, Any], source: str = "config.json") -> DSparkConfig:
    """Translate a DSpark ``config.json`` dict; ValueError naming what is missing or invalid."""
    archs = hf.get("architectures")
    problems = []
    if archs is not None and ARCHITECTURE not in archs:
        problems.append(f"architectures is {archs!r}, expected [{ARCHITECTURE!r}]")
    missing = [n for n in _REQUIRED if hf.get(n) is None]
    if int(hf.get("markov_rank") or 0) > 0 and hf.get("markov_head_type") is None:
        missing.append("markov_head_type")
    if hf.get("enable_confidence_head") and hf.get("confidence_head_with_markov") is None:
        missing.append("confidence_head_with_markov")
    if missing:
        problems.append("missing " + ", ".join(missing))
    if problems:
        raise ValueError(f"{source} is not a DSpark drafter config: {'; '.join(problems)}. A DSpark config.json is "
                         f"a Qwen3 config with architectures [{ARCHITECTURE!r}] and top-level "
                         f"{', '.join(_REQUIRED)}")
    ids = list(hf["target_layer_ids"])
    if any(i == -1 for i in ids):
        raise ValueError(f"{source}: target_layer_ids {ids} taps the embedding output (-1); dllm taps decoder "
                         f"layers only (0 .. num_target_layers - 1)")
    body = {k: v for k, v in hf.items() if k not in ("dflash_config",)}
    body["architectures"] = [DFLASH_ARCHITECTURE]
    body["dflash_config"] = {"target_layer_ids": ids, "mask_token_id": hf["mask_token_id"]}
    backbone = dflash_config_from_hf(body, source)
    try:
        heads = DSparkHeads(markov_rank=int(hf["markov_rank"]),
                            markov_head_type=str(hf.get("markov_head_type", "vanilla")),
                            enable_confidence_head=bool(hf["enable_confidence_head"]),
                            confidence_head_with_markov=bool(hf.get("confidence_head_with_markov", False)))
    except ValueError as e:
        raise ValueError(f"{source}: {e}") from None
    return DSparkConfig(backbone=backbone, heads=heads)


def config_to_hf(config: DSparkConfig, base: Optional[Mapping[str, Any]] = None,
                 dtype: Optional[torch.dtype] = None) -> dict[str, Any]:
    """The authors' ``config.json`` dict (``base``'s unknown fields kept)."""
    out = dflash_config_to_hf(config.backbone, base, dtype)
    out.pop("dflash_config", None)
    h = config.heads
    out.update(architectures=[ARCHITECTURE], target_layer_ids=list(config.backbone.target_layer_ids),
               mask_token_id=config.backbone.mask_token_id, block_size=config.backbone.block_size,
               markov_rank=h.markov_rank, enable_confidence_head=h.enable_confidence_head,
               tie_word_embeddings=False)
    out.setdefault("num_anchors", 512)  # a training setting of the authors' trainer (its default config)
    if h.markov_rank > 0:
        out["markov_head_type"] = h.markov_head_type
    if h.enable_confidence_head:
        out["confidence_head_with_markov"] = h.confidence_head_with_markov
    return out


def load_dspark(name_or_path: PathLike, *, dtype: Union[torch.dtype, str, None] = None,
                device: Union[str, torch.device, None] = None, quantization: Optional[str] = None) -> DSparkModel:
    """Load a DSpark checkpoint (directory, embedded name or Hub id) in the authors' format.
    Errors: ValueError for a config that is not DSpark's; ``CheckpointError`` for missing / unexpected /
    mis-shaped keys or non-finite weights."""
    return load_drafter_checkpoint(name_or_path, config_from_hf, DSparkModel, dtype=dtype, device=device,
                                   quantization=quantization)


def save_dspark(model: DSparkModel, directory: PathLike) -> Path:
    """Write ``config.json`` + ``model.safetensors`` in the authors' format (``load_dspark`` reads it back)."""
    refuse_quantized_save(model)
    directory = Path(directory)
    write_safetensors({k: v.detach().contiguous() for k, v in model.state_dict().items()}, directory)
    hf = config_to_hf(model.dspark, model.hf_config, model.dtype)
    (directory / "config.json").write_text(json.dumps(hf, indent=2, sort_keys=True) + "\n")
    return directory


def random_dspark(target: Any, num_draft_layers: int, block_size: int, mask_token_id: int, *,
                  heads: DSparkHeads = DSparkHeads(), seed: int = 0,
                  target_layer_ids: Optional[tuple[int, ...]] = None,
                  dtype: torch.dtype = torch.float32) -> DSparkModel:
    """A fresh DSpark drafter for a target (transformers model or config): the body as ``random_dflash``
    builds it, heads ~ N(0, 0.02); the embedding and LM head copy the target's when ``target`` is a
    model (as the authors' trainer initialises them), else ~ N(0, 0.02). ``block_size`` = K."""
    body = random_dflash(target, num_draft_layers, max(block_size, 2), mask_token_id, seed,
                         target_layer_ids=target_layer_ids)
    config = DSparkConfig(backbone=replace(body.config, block_size=block_size), heads=heads)
    model = DSparkModel(config)
    gen = torch.Generator().manual_seed(seed + 1)
    model.init_weights(generator=gen)
    with torch.no_grad():
        model.load_state_dict(body.state_dict(), strict=False)
        for p in [model.embed_tokens.weight, *(model.markov_head.parameters() if model.markov_head else [])]:
            p.normal_(0.0, 0.02, generator=gen)
        if hasattr(target, "get_input_embeddings"):
            model.embed_tokens.weight.copy_(target.get_input_embeddings().weight)
            out = target.get_output_embeddings()
            model.lm_head.weight.copy_(out.weight)
    return model.to(dtype).eval()


__all__ = ["ARCHITECTURE", "config_from_hf", "config_to_hf", "load_dspark", "random_dspark", "save_dspark"]
