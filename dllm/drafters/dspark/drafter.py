"""``dspark``: DSpark, a semi-autoregressive drafter with a confidence-scheduled verify length
(Cheng et al., arXiv 2607.05147; authors' code github.com/deepseek-ai/DeepSpec).

Each round (``model.draft_dspark``): one backbone forward drafts the block ``[anchor, MASK x (K-1)]``
(DFlash-style: the target's tapped hidden states are the context; slot k predicts position
``anchor_pos + k + 1``), a Markov head picks the K tokens left to right (each conditioned on the one
before), a confidence head scores each position, and the verify-length policy
(``verify_length.py``) keeps the prefix the target verifies. Greedy drafts are arg-max; at T > 0 the
tokens are drawn from the corrected logits warped like the target's and their distributions go to
verification (exact speculative sampling).

Options (``DSparkOptions``):
- ``model``: embedded name, directory or Hub id of a checkpoint in the authors' format (``io.py``), or
  pass a loaded ``DSparkModel`` as ``model=``.
- ``verify_length``: a verify-length policy spec; default ``threshold:threshold=0.0`` (verify every
  draft: the authors' evaluator's default ``--confidence-threshold 0.0``); e.g.
  ``(threshold:threshold=0.5)`` is their early stop at the first position whose confidence is below 0.5.
  Without a confidence head the confidences are each position's top draft probability.
- ``dtype``, ``device``, ``quantization``: as ``dflash``.
- ``sample``: at T > 0 draw the drafts (True, as the authors do) or take the arg-max.

The call's block size B drafts K = B - 1 tokens; the default B is the checkpoint's ``block_size`` + 1
and a larger one is refused. Drafts are always K long, as in the authors' loop (no last-block trim).
Host syncs: one per round when the policy cuts (the verify width is a shape).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any, Optional

import torch

from dllm.drafters.base import Draft, DraftContext, DraftSession, DraftSetup, Drafter, TargetInfo, register_drafter
from dllm.drafters.dflash.cache import DraftKVCache
from dllm.drafters.dspark import scheduled as _scheduled  # noqa: F401  (registers the ``scheduled`` drafter)
from dllm.drafters.dspark.io import load_dspark
from dllm.drafters.dspark.model import DSparkModel, draft_dspark
from dllm.drafters.dspark.verify_length import VerifyLength, make_verify_length, schedule_draft, top_confidence
from dllm.models.loading import locate, place_module, resolve_device, resolve_dtype
from dllm.models.quantize import check_quantization
from dllm.options import check_bool


@dataclass(frozen=True)
class DSparkOptions:
    model: Optional[str] = None  # embedded name / directory / Hub id for load_dspark (or pass model=<DSparkModel>)
    verify_length: str = "threshold:threshold=0.0"  # verify-length policy spec (verify_length.py)
    dtype: Optional[str] = None  # "float32", "bfloat16", "float16", "auto"; None = the checkpoint's
    device: Optional[str] = None  # load device (None: CPU); calls move the drafter to the target's device
    sample: bool = True  # T > 0: draw drafts from the corrected, warped draft distribution (else arg-max)
    quantization: Optional[str] = None  # "int8" | "int4" | "nf4": weight-only (dllm.models.quantize)

    def __post_init__(self) -> None:
        if self.model is not None and (not isinstance(self.model, str) or not self.model):
            raise ValueError(f"model must be a DSpark checkpoint name or path (or pass a DSparkModel as "
                             f"model=...), got {self.model!r}")
        make_verify_length(self.verify_length)  # the registry's error, naming the valid policies / options
        if self.dtype is not None:
            resolve_dtype(self.dtype, {}, None)
        resolve_device(self.device)
        check_bool("sample", self.sample)
        check_quantization(self.quantization)


@register_drafter("dspark")
class DSparkDrafter(Drafter):
    """DSpark: parallel block drafting + a Markov head, verify length scheduled by confidence (arXiv 2607.05147)."""

    Config = DSparkOptions
    gives_distributions = True

    def __init__(self, config: Optional[DSparkOptions] = None, *, model: Any = None, **options: Any) -> None:
        if isinstance(model, (str, Path)):
            options["model"] = str(model)
            model = None
        super().__init__(config, **options)
        cfg = self.config
        if model is None:
            if cfg.model is None:
                raise ValueError("the dspark drafter needs a DSpark checkpoint: model=<DSparkModel> or a name/path "
                                 "(dspark:model=tiny-ar-dspark)")
            model = load_dspark(locate(cfg.model), dtype=cfg.dtype, device=cfg.device, quantization=cfg.quantization)
        elif not isinstance(model, DSparkModel):
            raise TypeError(f"the dspark drafter's model must be a DSparkModel (dllm.drafters.dspark.io.load_dspark "
                            f"/ random_dspark), got {type(model).__name__}")
        else:
            place_module(model, cfg.dtype, cfg.device)
        self.model: DSparkModel = model.eval()
        self.policy: VerifyLength = make_verify_length(cfg.verify_length)

    @property
    def target_layers(self) -> tuple[int, ...]:
        return tuple(self.model.target_layer_ids)

    @property
    def vocab_size(self) -> int:
        return int(self.model.config.vocab_size)

    @property
    def block_size(self) -> int:
        return int(self.model.block_size) + 1  # the anchor + the checkpoint's K drafts

    def check_target(self, info: TargetInfo) -> None:
        super().check_target(info)
        c = self.model.config
        if c.hidden_size != info.hidden_size:
            raise ValueError(f"the dspark drafter has hidden size {c.hidden_size} but the target's is "
                             f"{info.hidden_size}; a DSpark drafter reads the target's hidden states, so it must "
                             f"be trained for this target")

    def begin(self, setup: DraftSetup) -> DraftSession:
        if setup.block_size > self.block_size:
            raise ValueError(f"block_size {setup.block_size} exceeds the dspark drafter's trained block size "
                             f"{self.block_size} (its {self.block_size - 1} drafts + the anchor); use block_size "
                             f"<= {self.block_size}")
        if next(self.model.parameters()).device != torch.device(setup.device):
            self.model.to(setup.device)
        return DSparkSession(self, setup)


class DSparkSession(DraftSession):
    """One call's drafter state: the backbone's context K/V cache."""

    def __init__(self, drafter: DSparkDrafter, setup: DraftSetup) -> None:
        super().__init__(drafter, setup)
        self.model = drafter.model
        self.policy = drafter.policy
        self.sample = drafter.config.sample
        self.cache = DraftKVCache(self.model.config.num_layers)

    def propose(self, ctx: DraftContext) -> Draft:
        if ctx.hidden is None:
            raise RuntimeError("the dspark drafter got no target hidden states; the loop must tap the target "
                               f"layers {list(self.model.target_layer_ids)} (Drafter.target_layers)")
        out = draft_dspark(self.model, self.cache, ctx.hidden, ctx.anchor, ctx.anchor_position, ctx.num_draft,
                           ctx.params, generator=ctx.generator, sample=self.sample, feature_mask=ctx.hidden_mask,
                           feature_positions=ctx.hidden_positions, row_lengths=ctx.lengths,
                           with_confidence=self.policy.cuts)
        draft = Draft(tokens=out.tokens, probs=out.probs, logits=out.logits, lengths=ctx.lengths)
        if not self.policy.cuts:
            return draft
        confidence = out.confidence if out.confidence is not None else top_confidence(draft)  # [R, K]
        return schedule_draft(draft, self.policy.lengths(confidence))

    def select(self, keep: torch.Tensor) -> None:
        self.cache.select(keep)


__all__ = ["DSparkDrafter", "DSparkOptions", "DSparkSession"]
