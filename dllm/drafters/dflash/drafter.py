"""``dflash``: DFlash block drafting (arXiv 2602.06036; reference z-lab/dflash ``dflash/model.py``).

A small drafter (``model.DFlashDrafter``) drafts the whole block ``[anchor, MASK x K]`` in
one forward, conditioned on hidden states tapped from the target (``target_layers`` = the
checkpoint's ``target_layer_ids``) and reading the target's own embedding table and LM head. Per
call, the session keeps the drafter's context K/V (``DraftKVCache``): each ``propose`` projects only
the features of the tokens the target committed since the previous one (the prompt on the first
round), runs the block at positions ``anchor_position + 0..K`` and reads the drafts; the block's own
K/V are never stored, so nothing has to be cropped. Finished rows leave the cache (``select``).

Options (``DFlashOptions``):
- ``model``: embedded name, directory or Hub id of an official DFlash or DFlash 2 checkpoint, or of a
  DFlare one (Tencent/AngelSlim ``QwenDFlareDraftModel``, arXiv 2606.02091: ``dflare/model.py``; it
  drafts exactly as DFlash, through its own per-layer context fusion) (``load_any_dflash`` picks the
  architecture from ``config.json``),
  or pass a loaded ``DFlashDrafter`` as ``model=`` (like ``dlm``'s ``model=``).
- ``dtype``: "float32" / "bfloat16" / "float16" / "auto"; None keeps the checkpoint's (a given
  ``DFlashDrafter`` is cast in place). The drafter's dtype may differ from the target's.
- ``device``: where the weights are loaded (None: CPU); at each call the drafter is moved (in place)
  to the target's device, since it reads the target's hidden states, embedding and head.
- ``sample``: at T > 0, True (default, as the reference ``dflash_generate`` 0.1.0 does) draws each
  drafted token from the draft logits warped like the target's (temperature, top-k, top-p) and
  returns those distributions, so verification accepts with min(1, p/q). False drafts the arg-max
  (one-hot drafts are exact too: verification accepts them with the target's p(d)).

The default block size of a call is the checkpoint's trained ``block_size``; a larger one is refused
(the drafter never saw those positions), a smaller one runs (the reference shortens the last block
the same way). A checkpoint directory that also holds a block head (``block_head.py``) gives the
drafter its ``block_head``, used by ``plan="auto"``; a path head (``trees/path_head.py``) beside it
gives every ``Draft`` a ``PathScorer``, used by the ``taps`` tree builder. Both are read on first use,
never by plain chain decoding with a fixed block size (a broken head file is an error naming it
then) (DFlash checkpoints only: a DFlash
2 drafter's candidate selector picks its paths its own way, and its drafts carry none). No host syncs in
``propose``.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Optional, Union

import torch
import torch.nn as nn

from dllm.drafters.base import Draft, DraftContext, DraftSession, DraftSetup, Drafter, TargetInfo, register_drafter
from dllm.drafters.dflash.block_head import has_block_head, load_block_head
from dllm.drafters.dflash.cache import DraftKVCache
from dllm.drafters.dflash.dflash2.io import load_any_dflash
from dllm.drafters.dflash.dflash2.model import DFlash2Drafter, draft_block2
from dllm.drafters.dflash.model import (DFlashDrafter, DraftBlock, draft_block, make_block, target_embedding,
                                        target_head)
from dllm.drafters.dflash.static_draft import StaticDraft, static_draft_issue
from dllm.drafters.trees.path_head import PathScorer, has_path_head, load_path_head
from dllm.drafters.verify import sample_categorical, target_probs
from dllm.models.loading import locate, place_module, resolve_device, resolve_dtype
from dllm.models.quantize import check_quantization
from dllm.options import check_bool


@dataclass(frozen=True)
class DFlashOptions:
    model: Optional[str] = None  # embedded name / directory / Hub id for load_dflash (or pass model=<DFlashDrafter>)
    dtype: Optional[str] = None  # "float32", "bfloat16", "float16", "auto"; None = the checkpoint's
    device: Optional[str] = None  # load device (None: CPU); calls move the drafter to the target's device
    sample: bool = True  # T > 0: draw drafts from the warped draft distribution (else arg-max drafts)
    quantization: Optional[str] = None  # "int8" | "int4" | "nf4": weight-only (dllm.models.quantize)

    def __post_init__(self) -> None:
        if self.model is not None and (not isinstance(self.model, str) or not self.model):
            raise ValueError(f"model must be a DFlash checkpoint name or path (or pass a DFlashDrafter as "
                             f"model=...), got {self.model!r}")
        if self.dtype is not None:
            resolve_dtype(self.dtype, {}, None)  # ValueError naming the valid dtypes
        resolve_device(self.device)  # ValueError naming the available devices
        check_bool("sample", self.sample)
        check_quantization(self.quantization)  # QuantizationError naming the valid methods


def _param(model: nn.Module) -> torch.Tensor:
    return next(model.parameters())


@register_drafter("dflash")
class DFlashBlockDrafter(Drafter):
    """DFlash: a block drafter conditioned on the target's hidden states (arXiv 2602.06036)."""

    Config = DFlashOptions
    trims_last_block = True  # as dflash_generate: verify_size = min(block_size, max_length - start)
    gives_distributions = True

    def __init__(self, config: Optional[DFlashOptions] = None, *, model: Any = None, **options: Any) -> None:
        if isinstance(model, (str, Path)):
            options["model"] = str(model)
            model = None
        super().__init__(config, **options)
        cfg = self.config
        if model is None:
            if cfg.model is None:
                raise ValueError("the dflash drafter needs a DFlash checkpoint: model=<DFlashDrafter> or a "
                                 "name/path (dflash:model=/path/to/checkpoint)")
            directory = locate(cfg.model)  # once: the weights, and heads beside them (read when used)
            model = load_any_dflash(directory, dtype=cfg.dtype, device=cfg.device,  # DFlash, DFlash 2, DFlare
                                    quantization=cfg.quantization)
            self._directory = Path(directory)
        elif not isinstance(model, DFlashDrafter):
            raise TypeError(f"the dflash drafter's model must be a DFlashDrafter (dllm.drafters.dflash.io."
                            f"load_dflash / random_dflash), got {type(model).__name__}")
        else:
            place_module(model, cfg.dtype, cfg.device)
        self.model: DFlashDrafter = model.eval()

    _directory: Optional[Path] = None  # the checkpoint directory (None: a model passed as model=)
    _heads: dict  # "block" / "path" -> the head read from the directory (or None), on first use

    def _head(self, kind: str) -> Any:
        heads = self.__dict__.setdefault("_heads", {})
        if kind not in heads:
            d = self._directory
            if kind == "block":
                heads[kind] = load_block_head(d) if d is not None and has_block_head(d) else None
            else:  # a DFlash 2 drafter's candidate selector picks its paths its own way
                usable = d is not None and not isinstance(self.model, DFlash2Drafter)
                heads[kind] = load_path_head(d) if usable and has_path_head(d) else None
        return heads[kind]

    @property
    def block_head(self) -> Any:
        """The checkpoint's block head (``block_head.json`` / ``.safetensors``), read on first use
        (``plan="auto"``); None when the checkpoint has none. A broken head is an error naming the file."""
        return self._head("block")

    @block_head.setter
    def block_head(self, head: Any) -> None:
        self.__dict__.setdefault("_heads", {})["block"] = head

    @property
    def path_head(self) -> Any:
        """The checkpoint's path head (``path_head.json`` / ``.safetensors``), read on first use (a
        ``taps`` tree); None when there is none (or for DFlash 2)."""
        return self._head("path")

    @path_head.setter
    def path_head(self, head: Any) -> None:
        self.__dict__.setdefault("_heads", {})["path"] = head

    @property
    def target_layers(self) -> tuple[int, ...]:
        return tuple(self.model.target_layer_ids)

    @property
    def vocab_size(self) -> int:
        return int(self.model.config.vocab_size)

    @property
    def block_size(self) -> int:
        return int(self.model.block_size)

    def check_target(self, info: TargetInfo) -> None:
        super().check_target(info)
        c = self.model.config
        if c.hidden_size != info.hidden_size:
            raise ValueError(f"the dflash drafter has hidden size {c.hidden_size} but the target's is "
                             f"{info.hidden_size}; a DFlash drafter reads the target's hidden states, embedding "
                             f"and LM head, so it must be trained for this target")
        if c.mask_token_id >= info.vocab_size:
            raise ValueError(f"the dflash drafter's mask_token_id {c.mask_token_id} is not a token of the "
                             f"target's {info.vocab_size}-token vocabulary")

    def begin(self, setup: DraftSetup) -> DraftSession:
        if setup.block_size > self.block_size:
            raise ValueError(f"block_size {setup.block_size} exceeds the dflash drafter's trained block size "
                             f"{self.block_size}; use block_size <= {self.block_size}")
        if _param(self.model).device != torch.device(setup.device):
            self.model.to(setup.device)
        head = self.path_head if setup.paths else None  # read only when a tree builder uses it
        if head is not None and _param(head).device != torch.device(setup.device):
            head.to(setup.device)
        return DFlashSession(self, setup)


class DFlashSession(DraftSession):
    """One call's drafter state: the context K/V cache and the target's embedding and head."""

    def __init__(self, drafter: DFlashBlockDrafter, setup: DraftSetup) -> None:
        super().__init__(drafter, setup)
        self.model = drafter.model
        self.sample = drafter.config.sample
        self.path_head = drafter.path_head if setup.paths else None  # [a PathHead] for the taps builder
        self.cache = DraftKVCache(self.model.config.num_layers)
        # one row, every feature real (the batch-1 fast loop): a preallocated buffer (static_draft.py),
        # decided at the first propose and kept for the call
        self.static: Optional[StaticDraft] = None
        self.rounds = 0
        self.embed = target_embedding(setup.target)  # [V, D], read raw
        head = target_head(setup.target)
        head_dtype = _param(head).dtype
        self.head: Union[nn.Module, Callable[[torch.Tensor], torch.Tensor]] = head
        if head_dtype != _param(self.model).dtype:  # e.g. a float32 drafter for a bfloat16 target
            self.head = lambda h: head(h.to(head_dtype))

    def propose(self, ctx: DraftContext) -> Draft:
        if ctx.hidden is None:
            raise RuntimeError("the dflash drafter got no target hidden states; the loop must tap the target "
                               f"layers {list(self.model.target_layer_ids)} (Drafter.target_layers)")
        k = ctx.num_draft
        block = make_block(ctx.anchor, k + 1, self.model.mask_token_id)  # [R, K+1] = [anchor, MASK x K]
        if self.rounds == 0 and len(ctx.tokens) == 1 and ctx.hidden_mask is None and ctx.lengths is None \
                and self.path_head is None \
                and static_draft_issue(self.model) is None:
            self.static = StaticDraft(self.model)
        self.rounds += 1
        if self.static is not None:
            if len(ctx.tokens) != 1 or ctx.hidden_mask is not None or ctx.lengths is not None:
                raise RuntimeError("a call that began drafting one unmasked row passed a batch or a feature mask")
            out = draft_block(self.model, self.static, ctx.hidden, block, embed_tokens=self.embed,
                              lm_head=self.head)  # type: ignore[arg-type]
            return self._draft(out, ctx, None)
        positions = ctx.anchor_position[:, None] + torch.arange(k + 1, device=ctx.anchor.device)  # [R, K+1]
        valid = None  # [R, K+1]: each row's own block [anchor, MASK x K_r] (rows with fewer drafts than K)
        if ctx.lengths is not None:
            valid = torch.arange(k + 1, device=ctx.anchor.device)[None, :] <= ctx.lengths.to(ctx.anchor.device)[:, None]
        # features ctx.hidden [R, N, L*D] of the tokens committed since the last propose, mask / positions [R, N]
        if isinstance(self.model, DFlash2Drafter):  # DFlash 2: the candidate selector picks a coherent path
            greedy = ctx.params.greedy or not self.sample
            out2 = draft_block2(self.model, self.cache, ctx.hidden, block, embed_tokens=self.embed,
                                lm_head=self.head,  # type: ignore[arg-type]
                                temperature=0.0 if greedy else ctx.params.temperature, generator=ctx.generator,
                                feature_mask=ctx.hidden_mask, feature_positions=ctx.hidden_positions,
                                block_positions=positions, block_valid=valid)
            # sampled paths: the selector's distribution over its K candidates, spread to [R, K, V]
            if greedy:
                return Draft(tokens=out2.tokens, logits=out2.logits)
            return Draft(tokens=out2.tokens, probs=out2.vocab_probs(), logits=out2.logits)
        out = draft_block(self.model, self.cache, ctx.hidden, block, embed_tokens=self.embed,
                          lm_head=self.head,  # type: ignore[arg-type]  # a module or a casting callable
                          feature_mask=ctx.hidden_mask, feature_positions=ctx.hidden_positions,
                          block_positions=positions, block_valid=valid)  # out.tokens [R, K], out.logits [R, K, V]
        head = self.path_head
        paths = None if head is None else PathScorer(head, out.hidden, ctx.anchor, self.embed,
                                                     lambda h: self.model.compute_logits(h, self.head))
        return self._draft(out, ctx, paths)

    def _draft(self, out: DraftBlock, ctx: DraftContext, paths: Optional[PathScorer]) -> Draft:
        """The drafted block as the loop's ``Draft``: arg-max tokens, or at T > 0 (``sample``) tokens
        drawn from the draft logits warped like the target's, with those distributions."""
        if ctx.params.greedy or not self.sample:
            return Draft(tokens=out.tokens, logits=out.logits, paths=paths)  # [R, K] arg-max, one-hot
        q = target_probs(out.logits, ctx.params)  # [R, K, V] the draft logits warped like the target's
        return Draft(tokens=sample_categorical(q, ctx.generator), probs=q, logits=out.logits, paths=paths)

    def select(self, keep: torch.Tensor) -> None:
        self.cache.select(keep)


__all__ = ["DFlashBlockDrafter", "DFlashOptions", "DFlashSession"]
