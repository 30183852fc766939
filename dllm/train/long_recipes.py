"""``tiny-llada-long``: a third embedded diffusion model, for the long-prompt suite.

The two PB-mini models (``tiny-llada``, ``tiny-dream``) embed the first 80 vocabulary words and were
trained on sequences of <= 64 tokens; they cannot read the long-prompt task tokens. This recipe
trains a LLaDA-format model over the whole task vocabulary (87 words, 88 embedding rows) on the
long-prompt suite (``dllm/tasks/long_prompt.py``) with the same objective and trainer
(``python -m dllm.train --recipe tiny-llada-long``; importing this module registers it in
``dllm.train.recipes.recipes``).

Model: LLaDA conventions as ``tiny-llada`` (full multi-head attention, RMSNorm eps 1e-5, no q/k/v
bias, float32 RoPE, theta 10000), d_model 128, 4 layers (two suffice for marker and key-matching
heads; each layer at 2k tokens costs), 4 heads, SwiGLU 344: ~0.8M parameters.

Data: a length curriculum over the suite's tasks, the C(Y|X) = 0 tasks at weight 1 and
``lookup_any`` at ``ANY_WEIGHT`` (its loss is that of a uniform choice among m values: it adds
nothing to learn beyond ``lookup_long``). Every phase keeps batch 16, so a step's cost grows with
the longest prompt allowed:

============  ==============  ================================
phase         steps           prompts (words)
============  ==============  ================================
0             0 - 3,000       256 - 320 (the smallest sizes)
1             3,000 - 5,000   256 - 512
============  ==============  ================================

Status (2026-12-01): not trained to the bar, no checkpoint shipped. A 15-minute pilot on one
thread (shared 2-core machine) ran 490 steps of phase 0 at 0.73 steps/s (3,400 tokens/s, batch
width ~300): the loss fell from 4.7 to 1.55-1.6 nats by step ~250 and stayed there (1.56 is the
mixture's loss when every answer word is predicted from its marginal alone: digits, counts and
span items known only in distribution), and exact match stayed 0 on every task (step 250 at the
default sizes, step 450 at the 256-320-word sizes). Step costs of this model on one thread: 0.8 s
for 16 x 261 tokens, 1.25 s for 8 x 517, 1.7 s for 4 x 1,029, 2.7 s for 2 x 2,045 (1,540 tokens/s;
16 rows at full length would take ~21 s); the trainer's evaluation at every default size (4 per
size, prompts up to 2,040 words) took 190 s. The pilot gives no rising curve to extrapolate from.
Estimate: >= 90% exact match up to 2,040-word prompts needs training at that length (RoPE at
theta 10000 is not expected to extrapolate 6x beyond its training lengths), i.e. thousands of
short steps (over an hour at 0.73 steps/s) for the retrieval heads to form, then >= 500 full-length
steps (~3 hours on one thread): a GPU run, not a laptop one.

Only the C = 0 tasks' exact match counts towards the bar (one token per step), and ``Trainer``'s
best-checkpoint metric reads the PB-mini C = 0 tasks only (none here), so the checkpoint to ship
is chosen from the evaluation lines of ``log.jsonl`` (``eval``: task -> accuracy).
"""

from __future__ import annotations

from dllm import tasks as T
from dllm.tasks.long_prompt import LONG_PROMPT_SUITE
from dllm.train.data import MixtureConfig
from dllm.train.recipes import Recipe, TrainConfig, recipes
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
STEPS = 3_800


def curriculum(lr: float = 1e-3) -> TrainConfig:
    """The length curriculum: short tables and lists first (the retrieval heads form there), then
    prompts twice as long per phase up to the 2,048 positions, the batch halved each time."""
    (_, first, batch), *later = CURRICULUM
    return TrainConfig(steps=STEPS, batch_size=batch, lr=lr, warmup=100, eval_every=0, eval_per_size=2,
                       save_every=250, mixture=long_prompt_mixture(first),
                       phases=tuple(Phase(start=s, mixture=long_prompt_mixture(m), lr=0.6 * lr, warmup=50,
                                          batch_size=b) for s, m, b in later))


def long_model(base: Recipe) -> dict:
    """``base``'s model fields with the whole task vocabulary (the long-prompt task words)."""
    return dict(base.model, vocab_size=LONG_VOCAB_SIZE)


def register_long(base: str) -> Recipe:
    """``<base>-long``: the embedded ``base`` model warm-started on the long-prompt curriculum."""
    r = recipes.get(base)
    name = base + "-long"
    recipe = Recipe(name, r.family, long_model(r), curriculum(),
                    f"{base} warm-started on the long-prompt suite (prompts up to 2,048 words)", init_from=base)
    recipes.add(name, recipe, description=f"{base} + a long-prompt training phase (every task word)")
    return recipe


LONG_RECIPES = tuple(register_long(b).name for b in ("tiny-llada", "tiny-dream"))

__all__ = ["ANY_WEIGHT", "CURRICULUM", "LONG_VOCAB_SIZE", "curriculum", "long_model", "long_prompt_mixture", "sizes_up_to"]
