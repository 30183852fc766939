"""``dlm``: a dllm diffusion LM drafts the block with any registered sampler (SpecDiff style,
Christopher et al. arXiv 2408.05636).

Each round the drafter decodes K = B - 1 masked positions after every row's committed sequence
with ``dllm.engine.generate`` (one batched call for all rows; ``steps`` denoising forwards for a
fixed-step sampler, as many as the sampler needs for an adaptive one), so every sampler in the
registry is a drafting policy. Drafts are one-hot (the sampler's tokens): exact at any target
temperature, since verification then accepts ``d`` with the target's ``p(d)``. With
``marginals=true`` the drafter also reads the model's per-position logits of ``[context, MASK x K]``
(one more forward per round), which lets a tree builder (a Plan's ``tree``) draft a tree from them.

The drafter must share the target's tokenizer: its vocabulary size must equal the target's logits
width and, when both tokenizers are known, their vocabularies must agree; or its vocabulary is a
prefix of the target's (same word at every id it has; target ids beyond it are read as its pad). The drafter cannot read
its own mask id: context tokens equal to it (a target may emit any id) are shown to it as its pad
id, which changes what it drafts, never what the loop emits.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Optional

import torch

from dllm.drafters.base import Draft, DraftContext, DraftSession, DraftSetup, Drafter, TargetInfo, register_drafter
from dllm.engine import generate
from dllm.models import load
from dllm.models.quantize import check_quantization
from dllm.options import check_bool, check_number, check_optional_int
from dllm.samplers import make_sampler


@dataclass(frozen=True)
class DLMConfig:
    model: Optional[str] = None  # embedded name / directory / Hub id for dllm.models.load (or pass model=<DiffusionLM>)
    sampler: str = "low_confidence"  # sampler spec; one option fits a drafter spec: sampler=threshold:threshold=0.8
    steps: Optional[int] = 1  # denoising forwards per draft for fixed-step samplers (None: one per token)
    temperature: float = 0.0  # the drafter's own proposal temperature (0: arg-max drafts)
    cache: str = "none"  # dllm cache policy of the drafting call
    max_context: Optional[int] = None  # read at most the last max_context committed tokens (None: all that fit)
    marginals: bool = False  # also return the per-position logits of [context, MASK x K] (one more
    #   forward per round), so draft trees (tree=) can be built from a diffusion model's marginals
    quantization: Optional[str] = None  # "int8" | "int4" | "nf4": weight-only (dllm.models.quantize)

    def __post_init__(self) -> None:
        if self.model is not None and (not isinstance(self.model, str) or not self.model):
            raise ValueError(f"model must be a model name or path (or pass a DiffusionLM as model=...), "
                             f"got {self.model!r}")
        make_sampler(self.sampler)  # unknown names / options fail here, listing the valid ones
        check_optional_int("steps", self.steps, 1, hint=" (denoising forwards per draft)")
        check_number("temperature", self.temperature, low=0.0, finite=True)
        check_optional_int("max_context", self.max_context, 1)
        check_bool("marginals", self.marginals)
        check_quantization(self.quantization)  # QuantizationError naming the valid methods


@register_drafter("dlm")
class DLMDrafter(Drafter):
    """A dllm diffusion LM drafting the block with a registered sampler (SpecDiff style)."""

    Config = DLMConfig

    @property
    def gives_distributions(self) -> Optional[bool]:
        return bool(self.config.marginals)  # marginals=True: one more forward for them

    def __init__(self, config: Optional[DLMConfig] = None, *, model: Any = None, **options: Any) -> None:
        if isinstance(model, str):
            options["model"] = model
            model = None
        super().__init__(config, **options)
        if model is None:
            if self.config.model is None:
                raise ValueError(f"the {self.name} drafter needs a diffusion model: model=<dllm DiffusionLM> or a "
                                 f"name/path ({self.name}:model=tiny-random-llada)")
            model = load(self.config.model, quantization=self.config.quantization)
        if not hasattr(model, "mask_id") or not callable(model):
            raise TypeError(f"the {self.name} drafter's model must be a dllm DiffusionLM (dllm.models.load / tiny), "
                            f"got {type(model).__name__}")
        self.model = model

    @property
    def vocab_size(self) -> int:
        return int(self.model.vocab_size)

    def check_target(self, info: TargetInfo) -> None:
        """The drafter's vocabulary must be the target's or a prefix of it (the same token at every
        id the drafter has: a model trained before words were appended to a shared vocabulary)."""
        mine = getattr(self.model, "tokenizer", None)
        if self.vocab_size < info.vocab_size and (mine is None or info.tokenizer is None):
            missing = "the drafter's model has no tokenizer" if mine is None else "the call has no tokenizer"
            raise ValueError(f"the {self.name} drafter has a vocabulary of {self.vocab_size} tokens but the target's "
                             f"logits have {info.vocab_size}; a shorter vocabulary serves only when it is a prefix "
                             f"of the target's, which is checked on both tokenizers, and {missing}"
                             + (" (pass the target's tokenizer=...)" if mine is not None else ""))
        if self.vocab_size > info.vocab_size:
            super().check_target(info)  # the plain equality error
        if mine is not None and info.tokenizer is not None and mine is not info.tokenizer:
            a, b = mine.get_vocab(), info.tokenizer.get_vocab()
            shared = {w: i for w, i in b.items() if i < len(a)}
            if a != shared:
                diff = sorted(set(a.items()) ^ set(shared.items()))[:3]
                raise ValueError(f"the {self.name} drafter's tokenizer differs from the target's ({len(a)} vs {len(b)} "
                                 f"tokens; e.g. {diff}); drafter and target must share the tokenizer (the "
                                 f"drafter's may be a prefix of the target's)")

    def begin(self, setup: DraftSetup) -> DraftSession:
        k = setup.block_size - 1
        if self.config.steps is not None and k > 0 and self.config.steps > k and make_sampler(self.config.sampler).fixed_steps:
            raise ValueError(f"dlm steps={self.config.steps} exceeds the {k} tokens drafted per round "
                             f"(block_size {setup.block_size}); use steps <= {k} or a larger block_size")
        room = int(self.model.max_positions) - k
        if room < 1:
            raise ValueError(f"block_size {setup.block_size} leaves no context in the drafter's "
                             f"{self.model.max_positions} positions")
        return DraftSession(self, setup)

    def context(self, seq: list[int], k: int) -> list[int]:
        """The committed tokens the drafter reads: the tail that fits its positions; its mask id and
        ids beyond its vocabulary (a target with a longer vocabulary) -> its pad id."""
        keep = int(self.model.max_positions) - k
        if self.config.max_context is not None:
            keep = min(keep, self.config.max_context)
        mask, pad, vocab = self.model.mask_id, self.model.pad_id, self.vocab_size
        return [pad if t == mask or t >= vocab else t for t in seq[-keep:]]

    def propose(self, ctx: DraftContext) -> Draft:
        k, cfg = ctx.num_draft, self.config
        sampler = make_sampler(cfg.sampler)
        seed = None
        if cfg.temperature > 0 and ctx.generator is not None:  # the call's stream seeds the drafting call
            seed = int(torch.randint(0, 2**62, (1,), generator=ctx.generator, device=ctx.generator.device))
        out = generate(self.model, [self.context(seq, k) for seq in ctx.tokens], sampler, gen_length=k,
                       steps=cfg.steps if sampler.fixed_steps else None, temperature=cfg.temperature,
                       seed=seed, cache=cfg.cache)
        if not cfg.marginals:
            return Draft(tokens=out.generated.to(ctx.anchor.device), forwards=out.nfe)
        logits = self.marginal_logits([self.context(seq, k) for seq in ctx.tokens], k)  # [R, K, V_drafter]
        return Draft(tokens=out.generated.to(ctx.anchor.device), forwards=out.nfe + 1,
                     logits=logits.to(ctx.anchor.device))

    @torch.no_grad()
    def marginal_logits(self, contexts: list[list[int]], k: int) -> torch.Tensor:
        """[R, K, V] logits of the K masked positions of ``[context, MASK x K]`` (left-padded rows, one
        forward): the diffusion model's per-position marginals of the block; the mask id is never
        proposed (-inf)."""
        model = self.model
        width = max(len(c) for c in contexts) + k
        device = next(model.parameters()).device
        ids = torch.full((len(contexts), width), model.pad_id, dtype=torch.long, device=device)
        real = torch.zeros((len(contexts), width), dtype=torch.bool, device=device)
        for row, c in enumerate(contexts):
            ids[row, width - k - len(c):width - k] = torch.tensor(c, dtype=torch.long, device=device)
            real[row, width - k - len(c):] = True
        ids[:, width - k:] = model.mask_id
        logits = model(ids, key_padding_mask=real).logits[:, -k:].float()  # [R, K, V]
        logits[..., model.mask_id] = float("-inf")
        return logits


__all__ = ["DLMConfig", "DLMDrafter"]
