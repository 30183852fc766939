"""Can more CPU steps teach tiny-llada-long the lookups? A focused continuation (an experiment;
README "Not yet here", benchmarks/training-notes-2026-12-01.md).

    python benchmarks/lookup_focus.py STEPS OUT      # e.g. 1500 runs/lookup-focus
    python benchmarks/lookup_focus.py eval MODEL     # exact match per size (tiny-llada-long, or OUT/final)

Starts from the shipped ``tiny-llada-long`` and trains on ``lookup_long`` and ``lookup_any`` only
(weights 1 and 0.5) at every size whose prompt has <= 100 words (4-16 table rows), batch 64,
lr 5e-4 (warm-up 50, cosine to 10%), 2 threads. ``eval``: exact match of ``lookup_long`` (one
token per step, 16 test instances per size) at the trained sizes 4 / 8 / 16 rows and the suite's
default sizes 42 / 85 rows (258 / 516 words).
"""

import sys

import torch

from dllm.train.data import MixtureConfig
from dllm.train.long_recipes import sizes_up_to
from dllm.train.recipes import Recipe, TrainConfig, recipes
from dllm.train.trainer import Trainer


def main(steps: int, out: str) -> None:
    torch.set_num_threads(2)
    base = recipes.get("tiny-llada-long")
    tasks = ("lookup_long", "lookup_any")
    mixture = MixtureConfig(tasks=tasks, weights=(1.0, 0.5), sizes=tuple(sizes_up_to(t, 100) for t in tasks))
    train = TrainConfig(steps=steps, batch_size=64, lr=5e-4, warmup=50, eval_every=0, save_every=500,
                        mixture=mixture)
    recipe = Recipe("lookup-focus", base.family, base.model, train, "tiny-llada-long, lookups only",
                    init_from="tiny-llada-long")
    print(Trainer(recipe, out, progress=False).train())


def evaluate(name: str) -> None:
    from dllm import tasks as T
    from dllm.scoring.exact_match import decode_and_score, load_model

    torch.set_num_threads(2)
    model = load_model(name)
    for size in (4, 8, 16, 42, 85):
        tally = decode_and_score(model, T.test_split("lookup_long", size, n=16))
        print(f"{name}: lookup_long {size} rows ({T.prompt_length(T.get_task('lookup_long'), size)} words): "
              f"{100 * sum(tally.correct.values()) / tally.examples:.1f}%", flush=True)


if __name__ == "__main__":
    if sys.argv[1] == "eval":
        evaluate(sys.argv[2])
    else:
        main(int(sys.argv[1]), sys.argv[2])
