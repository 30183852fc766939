"""Named training recipes: a model architecture in an official checkpoint format plus the
training settings, so that ``python -m dllm.train --recipe NAME`` is the whole reproduction.

Both recipes train one multi-task model on every PB-mini task (``dllm.tasks``) with the LLaDA SFT
objective and the task tokenizer (80 words = 80 embedding rows, already a multiple of 8). Special
ids point at the task vocabulary: mask = ``[MASK]`` (1), eos = ``[EOS]`` (4), pad = ``[PAD]`` (0),
bos = ``[BOS]`` (2), no end-of-turn token. The family conventions kept are the checkpoint format
(key names, config.json), the logit shift (Dream), q/k/v biases and bf16 RoPE (Dream), GQA (Dream:
2 KV heads; LLaDA: full multi-head), RMSNorm eps. RoPE theta is 10000 for both (the official 5e5 /
1e6 leave most rotary frequencies unused on sequences of <= 64 tokens).

- Sizes: d_model 128, 6 layers, 4 heads of 32, SwiGLU width 344 (~2.7 d): LLaDA ~1.2M parameters,
  Dream ~1.1M.
- Init (``init_for_training``): linear layers N(0, 0.02^2), the input embedding N(0, 1).
- Positions: ``max_positions`` 2048 is the declared capacity (config.json), not a trained length
  (training sequences have at most ~40 tokens and RoPE has no table); it lets the long-prompt
  cache benchmark run on the embedded models. Accuracy is only measured on the stress tasks.

Schedule, in phases (``dllm/train/schedule.py``), batch 64:

1. steps 0-10,000: every task, the 17 C(Y|X) = 0 tasks (``C0_TASKS``) drawn twice as often as the
   others (``weighted_mixture``); warm-up 200, peak lr 1e-3, cosine to 1e-4 at step 10,000.
2. steps 10,000-23,000 (focus): the same tasks with ``FOCUS_TASKS`` drawn 5x as often as the other
   C = 0 tasks (57% of the examples); the schedule restarts: warm-up 200 to 6e-4, cosine to 6e-5
   at step 23,000.
3. tiny-dream only, steps 17,000-24,000: ``sort_num`` drawn at 34% of the examples; warm-up 100 to
   5e-4, cosine to 5e-5 at step 24,000. Phase 2 keeps its horizon (23,000), so tiny-dream's steps
   before 17,000 are tiny-llada's schedule.

Phase 1 is bit-identical with or without the later phases, so a run can be continued from its
step-10,000 checkpoint (``--resume`` in a directory holding it). Run it in the background with
``--resume`` (see ``dllm/train/__main__.py``); the float32 checkpoint of the best evaluation is
exported as the shipped artifact (``python -m dllm.train.export``).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, replace
from typing import Any, Optional

import torch

from dllm.models.task_tokenizer import task_tokenizer
from dllm.tasks.vocab import BOS, EOS, MASK, PAD, word_id
from dllm.models.base import SpecialIds
from dllm.models.config import TransformerConfig
from dllm.models.families import family_class
from dllm.models.pretrained import TransformerLM
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

_COMMON = dict(vocab_size=80, d_model=128, n_layers=6, n_heads=4, mlp_hidden=344, max_positions=2048,
               rope_theta=10000.0, tie_embeddings=False)

# the C(Y|X) = 0 tasks of the test split (``dllm.eval.exact_match.c0_tasks()``; a test checks it)
C0_TASKS = (
    "add_lsb", "add_msb", "copy", "copy_2tok", "cumsum", "insert_index", "insert_index_2tok",
    "remove_index", "remove_index_2tok", "replace_index", "replace_index_2tok", "reverse",
    "reverse_2tok", "sort", "sort_2tok", "sort_num", "sudoku4",
)  # fmt: skip


def weighted_mixture(c0_weight: float = 2.0) -> MixtureConfig:
    """Every registered task; the C(Y|X) = 0 tasks drawn ``c0_weight`` times as often."""
    from dllm import tasks as T

    names = T.suite_task_names()
    return MixtureConfig(tasks=names, weights=tuple(c0_weight if n in C0_TASKS else 1.0
                                                    for n in names))


# Phase 2 (from step 10,000): the tasks the 10k models still failed, drawn 5x as often as the
# other C = 0 tasks, with a restarted schedule (peak 6e-4, cosine to 6e-5 at ``steps``).
FOCUS_TASKS = ("add_lsb", "add_msb", "cumsum", "sort_num", "sort_2tok")
PHASE1_STEPS = 10_000


def reweighted(mixture: MixtureConfig, weights: dict[str, float]) -> MixtureConfig:
    """``mixture`` with the raw weights of the tasks in ``weights`` replaced."""
    names = mixture.task_names()
    return replace(mixture, weights=tuple(weights.get(n, w) for n, w in zip(names, mixture.weights)))


def focus_mixture(focus_weight: float = 10.0) -> MixtureConfig:
    """:func:`weighted_mixture` with the :data:`FOCUS_TASKS` drawn at ``focus_weight``."""
    return reweighted(weighted_mixture(), dict.fromkeys(FOCUS_TASKS, focus_weight))


def _two_phase() -> TrainConfig:
    return TrainConfig(steps=23_000, mixture=weighted_mixture(),
                       phases=(Phase(start=PHASE1_STEPS, mixture=focus_mixture(), lr=6e-4, warmup=200),))


def sort_num_mixture(weight: float = 40.0) -> MixtureConfig:
    """:func:`focus_mixture` with ``sort_num`` drawn at ``weight`` (34% of the examples)."""
    return reweighted(focus_mixture(), {"sort_num": weight})


# tiny-dream only: a third phase from step 17,000 draws sort_num at 34% (the focus phase had taught
# it every focus task but sort_num); phase 2 keeps its own cosine horizon (23,000), so its steps
# before 17,000 are unchanged.
def _three_phase() -> TrainConfig:
    return TrainConfig(steps=24_000, mixture=weighted_mixture(), phases=(
        Phase(start=PHASE1_STEPS, mixture=focus_mixture(), lr=6e-4, warmup=200, horizon=23_000),
        Phase(start=17_000, mixture=sort_num_mixture(), lr=5e-4, warmup=100),
    ))


recipes.add("tiny-llada", Recipe(
    "tiny-llada", "llada",
    dict(_COMMON, n_kv_heads=4, rms_eps=1e-5, qkv_bias=False, rope_fp32=True),
    _two_phase(),
    "LLaDA-format 1.2M model on all PB-mini tasks (10k + 13k focus steps, batch 64)",
), description="LLaDA-format 1.2M model on all PB-mini tasks")
recipes.add("tiny-dream", Recipe(
    "tiny-dream", "dream",
    dict(_COMMON, n_kv_heads=2, rms_eps=1e-6, qkv_bias=True, rope_fp32=False),
    _three_phase(),
    "Dream-format 1.1M model (GQA 4/2, shifted logits) on all PB-mini tasks (10k + 7k focus + 7k sort_num)",
), description="Dream-format 1.1M model (GQA 4/2, shifted logits) on all PB-mini tasks")


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
    is a ValueError naming the tensor."""
    from dllm.models import load

    src = load(source)
    if type(src) is not type(model):
        raise ValueError(f"init_from={source!r} is a {type(src).__name__}, the recipe builds a {type(model).__name__}")
    theirs, ours = src.state_dict(), model.state_dict()
    if set(theirs) != set(ours):
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
