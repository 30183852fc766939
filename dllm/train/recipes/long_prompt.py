"""The first stage of ``tiny-llada-long`` / ``tiny-dream-long``: the PB-mini models warm-started on the
long-prompt suite (the chains that continue it: ``llada_long.py``, ``dream_long.py``).

The two PB-mini models (``tiny-llada``, ``tiny-dream``) embed the first 80 vocabulary words and were
trained on sequences of <= 64 tokens; they cannot read the long-prompt task tokens. These recipes
start from their weights (``Recipe.init_from``; the embedding and LM head grow to 88 rows for the
87-word task vocabulary, the new rows freshly initialised) and train on the long-prompt suite
(``dllm/tasks/long_prompt.py``) with the same objective and trainer; :func:`first_long_recipe` builds it
(the stage ``length`` of ``python -m dllm.train --recipe tiny-llada-long``).

Model: the base model's architecture unchanged (6 layers, d_model 128, 4 heads, SwiGLU 344,
max_positions 2048; LLaDA or Dream conventions), ~1.2M parameters.

Data: a length curriculum (``CURRICULUM``) over the suite's tasks, the C(Y|X) = 0 tasks at weight 1
and ``lookup_any`` at ``ANY_WEIGHT`` (its loss is that of a uniform choice among m values). Each
phase allows prompts twice as long and halves the batch, so a step costs ~4-5k tokens throughout;
every phase draws uniformly over ALL sizes up to its longest prompt (the short ones included):

============  ==============  ==================  =====
phase         steps           prompts (words)     batch
============  ==============  ==================  =====
0             0 - 1,500       <= 100              64
1             1,500 - 2,300   <= 260              32
2             2,300 - 2,800   <= 520              16
3             2,800 - 3,300   <= 1,040            8
4             3,300 - 3,550   <= 2,048            4
============  ==============  ==================  =====

Why it is warm-started, and what this stage alone learns: docs/results/models.md ("How the
long-prompt models were trained").
"""

from __future__ import annotations

from dllm import tasks as T
from dllm.tasks.kinds.long_prompt import LONG_PROMPT_SUITE
from dllm.train.data import MixtureConfig
from dllm.train.recipes.base import Recipe, TrainConfig, recipes
from dllm.train.schedule import Phase

ANY_WEIGHT = 0.5  # lookup_any's weight in the mixture (the C = 0 tasks weigh 1)
LONG_VOCAB_SIZE = 88  # the 87 task words (long-answer and long-prompt tokens included), rounded up to 8


def sizes_up_to(task: str, max_prompt: int) -> tuple[int, ...]:
    """The sizes of ``task`` whose prompt has at most ``max_prompt`` words (``ValueError`` if none)."""
    t = T.get_task(task)
    sizes = tuple(s for s in t.sizes if T.prompt_length(t, s) <= max_prompt)
    if not sizes:
        shortest = T.prompt_length(t, t.min_size)
        raise ValueError(f"task {task!r} has no size with a prompt of <= {max_prompt} words "
                         f"(its shortest prompt has {shortest})")
    return sizes


def long_prompt_mixture(max_prompt: int, any_weight: float = ANY_WEIGHT) -> MixtureConfig:
    """The long-prompt suite at every size whose prompt fits ``max_prompt`` words (the short sizes
    below the default ones included: the length curriculum)."""
    names = T.suite_task_names(LONG_PROMPT_SUITE)
    weights = tuple(any_weight if n == "lookup_any" else 1.0 for n in names)  # the one C > 0 task
    return MixtureConfig(tasks=names, weights=weights, sizes=tuple(sizes_up_to(n, max_prompt) for n in names))


# (first step, longest prompt in words, batch size): ~4-5k tokens per step in every phase
CURRICULUM = ((0, 100, 64), (1_500, 260, 32), (2_300, 520, 16), (2_800, 1_040, 8), (3_300, 2_048, 4))
STEPS = 3_550


def curriculum(lr: float = 1e-3) -> TrainConfig:
    """The length curriculum: short tables and lists first (the retrieval heads form there), then
    prompts twice as long per phase up to the 2,048 positions, the batch halved each time."""
    (_, first, batch), *later = CURRICULUM
    return TrainConfig(steps=STEPS, batch_size=batch, lr=lr, warmup=100, eval_every=0, eval_per_size=2,
                       save_every=250, log_every=25, threads=1, mixture=long_prompt_mixture(first),
                       phases=tuple(Phase(start=s, mixture=long_prompt_mixture(m), lr=0.6 * lr, warmup=50,
                                          batch_size=b) for s, m, b in later))


def long_model(base: Recipe) -> dict:
    """``base``'s model fields with the whole task vocabulary (the long-prompt task words)."""
    return dict(base.model, vocab_size=LONG_VOCAB_SIZE)


def first_long_recipe(base: str) -> Recipe:
    """``<base>-long``'s first stage: the embedded ``base`` model (``init_from``; the chain replaces it by
    its own earlier stage) warm-started on the long-prompt length curriculum."""
    r = recipes.get(base)
    return Recipe(base + "-long", r.family, long_model(r), curriculum(),
                  f"{base} warm-started on the long-prompt suite (prompts up to 2,048 words)", init_from=base)


__all__ = ["ANY_WEIGHT", "CURRICULUM", "LONG_VOCAB_SIZE", "STEPS", "curriculum", "first_long_recipe", "long_model",
           "long_prompt_mixture", "sizes_up_to"]
