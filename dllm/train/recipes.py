"""Named training recipes: a model architecture in an official checkpoint format plus the
training settings, so that ``python -m dllm.train --recipe NAME`` is the whole reproduction.

Both recipes train one multi-task model on every PB-mini task with the LLaDA SFT objective and the
task tokenizer (80 words = 80 embedding rows, already a multiple of 8). Special ids point at the
task vocabulary: mask = ``[MASK]`` (1), eos = ``[EOS]`` (4), pad = ``[PAD]`` (0), bos = ``[BOS]``
(2), no end-of-turn token. The family conventions kept are the checkpoint format (key names,
config.json), the logit shift (Dream), q/k/v biases and bf16 RoPE (Dream), GQA (Dream: 2 KV heads;
LLaDA: full multi-head), RMSNorm eps. RoPE theta is 10000 for both (the official 5e5 / 1e6 waste
most rotary frequencies on sequences of <= 64 tokens).

Sizes: d_model 256, 6 layers, 8 heads of 32, SwiGLU width 688 (~2.7 d), 128 positions:
LLaDA 4.78M parameters (19.1 MB float32 safetensors), Dream 4.15M (16.6 MB).

Schedule: ``steps`` = 40,000 is the length of the reference run (and the cosine horizon; warm-up
200, peak lr 1e-3, cosine to 1e-4, batch 64 = 2.56M examples, ~83k per task). Measured on the
2-core AMD EPYC (AVX2) build machine with ``--threads 2`` and nothing else running: LLaDA ~1.35-1.6
steps/s (~1.9-2.2k real tokens/s, batches ~25 tokens wide after length bucketing), Dream ~1.5-1.7
steps/s, i.e. 7-8 hours for the full run; with ``--threads 1`` ~0.8-1.0 steps/s. Two threads
collapse to ~0.35 steps/s when another process holds a core (thread-pool spin-waits), so use
``--threads 1`` on a shared machine. A 600-step LLaDA run took the loss from 4.2 to 1.8 with exact
match still ~0: expect the C(Y|X) = 0 tasks to need most of the run. Run it in the background with
``--resume`` (see ``dllm/train/__main__.py``); the float32 checkpoint is the shipped artifact.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, replace
from typing import Any

import torch

from dllm.eval.tasks.tokenizer import task_tokenizer
from dllm.eval.tasks.vocab import BOS, EOS, MASK, PAD, word_id
from dllm.models.base import SpecialIds
from dllm.models.config import TransformerConfig
from dllm.models.families import family_class
from dllm.models.pretrained import TransformerLM
from dllm.registry import Registry
from dllm.train.data import MixtureConfig


@dataclass(frozen=True)
class TrainConfig:
    """Optimisation, logging and checkpointing settings (CLI flags override single fields)."""

    steps: int = 40_000  # total optimiser steps; also the cosine horizon (reference run: 40k)
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


@dataclass(frozen=True)
class Recipe:
    name: str
    family: str  # "llada" | "dream"
    model: dict[str, Any]  # TransformerConfig fields
    train: TrainConfig
    description: str = ""

    def with_overrides(self, model: dict[str, Any] | None = None, **train: Any) -> "Recipe":
        """A copy with some model fields and/or TrainConfig fields replaced (None values ignored)."""
        new_model = dict(self.model, **{k: v for k, v in (model or {}).items() if v is not None})
        new_train = replace(self.train, **{k: v for k, v in train.items() if v is not None})
        return replace(self, model=new_model, train=new_train)

    def transformer_config(self) -> TransformerConfig:
        return TransformerConfig(**self.model)


recipes: Registry[Recipe] = Registry("recipe")

_COMMON = dict(vocab_size=80, d_model=256, n_layers=6, n_heads=8, mlp_hidden=688, max_positions=128,
               rope_theta=10000.0, tie_embeddings=False)

recipes.add("tiny-llada", Recipe(
    "tiny-llada", "llada",
    dict(_COMMON, n_kv_heads=8, rms_eps=1e-5, qkv_bias=False, rope_fp32=True),
    TrainConfig(),
    "LLaDA-format 4.8M model on all PB-mini tasks (40k steps, batch 64, lr 1e-3)",
), description="LLaDA-format 4.8M model on all PB-mini tasks")
recipes.add("tiny-dream", Recipe(
    "tiny-dream", "dream",
    dict(_COMMON, n_kv_heads=2, rms_eps=1e-6, qkv_bias=True, rope_fp32=False),
    TrainConfig(),
    "Dream-format 4.2M model (GQA 8/2, shifted logits) on all PB-mini tasks (40k steps)",
), description="Dream-format 4.2M model (GQA 8/2, shifted logits) on all PB-mini tasks")


def get_recipe(name: str) -> Recipe:
    return recipes.get(name)


def task_special_ids() -> SpecialIds:
    """Special ids of the task vocabulary (the same for both families)."""
    return SpecialIds(mask_id=word_id(MASK), eos_id=word_id(EOS), pad_id=word_id(PAD), eot_id=None,
                      bos_id=word_id(BOS))


def init_for_training(model: TransformerLM, seed: int, std: float = 0.02) -> None:
    """GPT-2 style init from a private generator: weights and embeddings ~ N(0, std^2), residual
    output projections (o_proj, down_proj) ~ N(0, (std / sqrt(2 n_layers))^2), biases 0, norms 1."""
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
                p.copy_(torch.randn(p.shape, generator=gen) * s)


def build_model(recipe: Recipe, seed: int | None = None, attn_backend: str = "auto") -> TransformerLM:
    """A freshly initialised float32 model of the recipe, carrying the task tokenizer."""
    config = recipe.transformer_config()
    tok = task_tokenizer()
    if config.vocab_size < len(tok.get_vocab()):
        raise ValueError(f"recipe {recipe.name!r}: vocab_size {config.vocab_size} < task vocabulary "
                         f"{len(tok.get_vocab())}")
    cls = family_class(recipe.family)
    model = cls(config, task_special_ids(), tokenizer=tok, attn_backend=attn_backend)
    init_for_training(model, recipe.train.seed if seed is None else seed)
    return model


def count_parameters(model: torch.nn.Module) -> int:
    return sum(p.numel() for p in model.parameters())


__all__ = ["Recipe", "TrainConfig", "build_model", "count_parameters", "get_recipe",
           "init_for_training", "recipes", "task_special_ids"]
