"""``tiny-llada`` / ``tiny-dream``: the PB-mini recipes (``python -m dllm.train --recipe tiny-llada``).

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
step-10,000 checkpoint (``--resume`` in a directory holding it). Each is also the one-stage
curriculum of its name (``python -m dllm.train --recipe tiny-llada``; ``pb_mini_stage``): the float32
checkpoint of the best evaluation is exported (``OUT/export/tiny-llada``) as the shipped artifact.
"""

from __future__ import annotations

from dataclasses import replace

from dllm.train.data import MixtureConfig
from dllm.train.recipes.base import Recipe, TrainConfig, recipes
from dllm.train.recipes.stages import Curriculum, Stage, curricula
from dllm.train.schedule import Phase

_COMMON = dict(vocab_size=80, d_model=128, n_layers=6, n_heads=4, mlp_hidden=344, max_positions=2048,
               rope_theta=10000.0, tie_embeddings=False)

# the C(Y|X) = 0 tasks of the test split (``dllm.scoring.exact_match.c0_tasks()``; a test checks it)
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


def pb_mini_stage(name: str) -> Stage:
    """The whole run of ``name`` as one stage (threads 1, as run); the shipped checkpoint is its ``best``
    (the evaluation with the best C = 0 mean: step 23,000 / 24,000, the last one)."""
    r = recipes.get(name)
    return Stage(name, replace(r, train=replace(r.train, threads=1)), take="best",
                 note="from scratch; phase 1 (steps 0-10,000) is bit-identical with or without the later phases")


for _name, _steps in (("tiny-llada", "23,000"), ("tiny-dream", "24,000")):
    curricula.add(_name, Curriculum(_name, (pb_mini_stage(_name),), recipes.get(_name).description),
                  description=f"{recipes.entry(_name).description} ({_steps} steps)")

__all__ = ["C0_TASKS", "FOCUS_TASKS", "PHASE1_STEPS", "focus_mixture", "pb_mini_stage", "reweighted",
           "sort_num_mixture", "weighted_mixture"]
