"""The recipe types and the model builder shared by every diffusion recipe.

- ``TrainConfig``: optimisation, logging and checkpointing settings of one run (CLI flags override
  single fields); ``Recipe``: a model architecture in an official checkpoint format plus its
  ``TrainConfig`` (the PB-mini recipes: ``dllm/train/recipes/pb_mini.py``);
- ``build_model``: a freshly initialised float32 model with the task tokenizer
  (``init_for_training``), warm-started from ``Recipe.init_from`` when set (``warm_start``).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, replace
from typing import Any, Optional

import torch

from dllm.models.text.task_tokenizer import task_tokenizer
from dllm.tasks.vocab import BOS, EOS, MASK, PAD, word_id
from dllm.models.inputs import SpecialIds
from dllm.models.core.config import TransformerConfig
from dllm.models.families.registry import family_class
from dllm.models.families.pretrained import TransformerLM
from dllm.registry import Registry
from dllm.train.data import MixtureConfig
from dllm.train.schedule import Phase


@dataclass(frozen=True)
class TrainConfig:
    """Optimisation, logging and checkpointing settings (CLI flags override single fields)."""

    steps: int = 10_000  # total optimiser steps; also the cosine horizon
    batch_size: int = 64
    lr: float = 1e-3  # peak learning rate
    min_lr_ratio: float = 0.1  # cosine decays to lr * min_lr_ratio at ``steps``
    warmup: int = 200  # linear warm-up steps from 0 to lr
    weight_decay: float = 0.1  # AdamW, on matrices and embeddings only (not norms / biases)
    betas: tuple[float, float] = (0.9, 0.95)
    clip: float = 1.0  # global gradient-norm clipping
    mask_eps: float = 1e-3  # p = (1 - eps) t + eps
    seed: int = 0  # model init, data and masking are all derived from it
    log_every: int = 10  # JSONL training line every N steps (averaged over them)
    eval_every: int = 1000  # exact-match evaluation every N steps (0: never)
    eval_per_size: int = 8  # test instances per default size of each task in an evaluation
    save_every: int = 1000  # checkpoint every N steps (0: only at the end)
    keep_last: int = 3  # periodic checkpoints kept (the best one is kept separately)
    bf16: bool = False  # bf16 autocast for forward/backward on CPU (weights stay float32)
    compile: bool = False  # torch.compile the transformer forward (dynamic shapes)
    threads: int = 0  # torch.set_num_threads (0: leave torch's default)
    device: str = "cpu"
    mixture: MixtureConfig = field(default_factory=MixtureConfig)
    phases: tuple[Phase, ...] = ()  # later phases: new mixture + restarted schedule (schedule.py)


@dataclass(frozen=True)
class Recipe:
    name: str
    family: str  # "llada" | "dream"
    model: dict[str, Any]  # TransformerConfig fields
    train: TrainConfig
    description: str = ""
    init_from: Optional[str] = None  # warm start: an embedded model name or a directory (warm_start)

    def with_overrides(self, model: dict[str, Any] | None = None, **train: Any) -> "Recipe":
        """A copy with some model fields and/or TrainConfig fields replaced (None values ignored)."""
        new_model = dict(self.model, **{k: v for k, v in (model or {}).items() if v is not None})
        new_train = replace(self.train, **{k: v for k, v in train.items() if v is not None})
        return replace(self, model=new_model, train=new_train)

    def transformer_config(self) -> TransformerConfig:
        return TransformerConfig(**self.model)


recipes: Registry[Recipe] = Registry("recipe")

def get_recipe(name: str) -> Recipe:
    return recipes.get(name)


def task_special_ids() -> SpecialIds:
    """Special ids of the task vocabulary (the same for both families)."""
    return SpecialIds(mask_id=word_id(MASK), eos_id=word_id(EOS), pad_id=word_id(PAD), eot_id=None,
                      bos_id=word_id(BOS))


def init_for_training(model: TransformerLM, seed: int, std: float = 0.02, embed_std: float = 1.0) -> None:
    """Init from a private generator: linear weights ~ N(0, std^2), residual output projections
    (o_proj, down_proj) ~ N(0, (std / sqrt(2 n_layers))^2), the input embedding ~ N(0, embed_std^2)
    (torch's ``nn.Embedding`` default), biases 0, norms 1.

    Why the embedding is not at GPT-2's 0.02: with d_model 128 a 0.02 embedding (norm ~0.23) is
    soon drowned in the residual stream by the layer outputs, and token identities that only need
    copying never become readable by the late layers (two-token items stay at chance)."""
    gen = torch.Generator().manual_seed(seed)
    out_std = std / math.sqrt(2 * model.config.n_layers)
    with torch.no_grad():
        for name, p in model.transformer.named_parameters():
            if name.endswith("norm.weight"):
                p.fill_(1.0)
            elif name.endswith(".bias"):
                p.zero_()
            else:
                s = out_std if name.endswith(("o_proj.weight", "down_proj.weight")) else std
                tied = model.transformer.lm_head is None  # a tied embedding is also the output head
                s = embed_std if name == "embed.weight" and not tied else s
                p.copy_(torch.randn(p.shape, generator=gen) * s)


def build_model(recipe: Recipe, seed: int | None = None, attn_backend: str = "auto") -> TransformerLM:
    """A freshly initialised float32 model of the recipe, carrying the task tokenizer."""
    config = recipe.transformer_config()
    from dllm.tasks.vocab import PB_MINI_VOCAB_SIZE

    if config.vocab_size < PB_MINI_VOCAB_SIZE:
        raise ValueError(f"recipe {recipe.name!r}: vocab_size {config.vocab_size} < the PB-mini vocabulary "
                         f"{PB_MINI_VOCAB_SIZE}")
    tok = task_tokenizer(size=min(config.vocab_size, len(task_tokenizer().get_vocab())))
    cls = family_class(recipe.family)
    model = cls(config, task_special_ids(), tokenizer=tok, attn_backend=attn_backend)
    init_for_training(model, recipe.train.seed if seed is None else seed)
    if recipe.init_from is not None:
        warm_start(model, recipe.init_from)
    return model


def warm_start(model: TransformerLM, source: str) -> TransformerLM:
    """Copy the weights of ``source`` (an embedded model name or a checkpoint directory of the same
    family and layer shapes) into ``model``. A larger vocabulary is allowed: the embedding and LM
    head rows past the source's keep their fresh init (new task words). Anything else that differs
    is a ValueError naming the tensor.

    Another family is a conversion (SDAR starts from Qwen3 AR checkpoints, arXiv 2510.06303): allowed
    when the two differ only in norm weights the source lacks (SDAR's per-head q/k norms), which keep
    their init of 1. The converted model computes a different function (the new norms rescale q and
    k, the attention mask may differ), so it is a starting point for training, not a copy."""
    from dllm.models import load

    src = load(source)
    theirs, ours = src.state_dict(), model.state_dict()
    new = sorted(set(ours) - set(theirs))
    if type(src) is not type(model) and (set(theirs) - set(ours)
                                          or any(not n.endswith("norm.weight") for n in new)):
        raise ValueError(f"init_from={source!r} is a {type(src).__name__}, the recipe builds a {type(model).__name__}; "
                         f"a conversion may only add norm weights, tensors differ: "
                         f"{sorted(set(theirs) ^ set(ours))[:4]}")
    if type(src) is type(model) and set(theirs) != set(ours):
        raise ValueError(f"init_from={source!r}: tensors differ: {sorted(set(theirs) ^ set(ours))[:4]}")
    rows_grow = ("transformer.embed.weight", "transformer.lm_head.weight")
    with torch.no_grad():
        for name, value in theirs.items():
            target = ours[name]
            if target.shape == value.shape:
                target.copy_(value)
            elif name in rows_grow and target.shape[1:] == value.shape[1:] and target.shape[0] > value.shape[0]:
                target[: value.shape[0]].copy_(value)  # [V_src, D] of [V, D]
            else:
                raise ValueError(f"init_from={source!r}: {name} is {tuple(value.shape)}, the recipe's is "
                                 f"{tuple(target.shape)} (only the vocabulary may grow)")
    return model


def count_parameters(model: torch.nn.Module) -> int:
    return sum(p.numel() for p in model.parameters())


__all__ = ["Recipe", "TrainConfig", "build_model", "count_parameters", "get_recipe",
           "init_for_training", "recipes", "task_special_ids", "warm_start"]
