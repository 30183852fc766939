"""The path head's width and the taps candidate pool, teacher-forced (README "Draft trees"; 2026-12-03).

    python benchmarks/path_head_sweep.py > benchmarks/path-head-sweep-2026-12-03.txt

The trainer's data (``dllm.train.drafters.path_head_train``: 1,500 long-answer mixture prompts, the target's
greedy answers, every answer position an anchor of tiny-ar-dflash) and its held-out split (test
instances 8-11 per size); for each head width, one head is trained (3 epochs) and taps is built
with 2, 4 and 8 candidates per budget node; tau = 1 + the tree's nodes on the target's path.
"""
import time
from dataclasses import replace

import torch

from dllm import tasks as T
from dllm.drafters.dflash.io import load_dflash
from dllm.models.targets import load_target
from dllm.scoring.exact_match import eval_examples
from dllm.train.ar import LONG_MIXTURE, hf_tokenizer
from dllm.train.data import TaskMixture
from dllm.train.drafters.path_head_train import PathHeadRecipe, collect, encode, teacher_forced_taus, train_path_head


def main(argv=None) -> None:
    import argparse

    argparse.ArgumentParser(description=__doc__.split("\n\n")[0]).parse_args(argv)  # --help; no options
    torch.set_num_threads(2)
    t0 = time.time()
    target, _ = load_target("tiny-ar")
    target = target.float().eval().requires_grad_(False)
    drafter = load_dflash("tiny-ar-dflash").float().eval().requires_grad_(False)
    recipe = PathHeadRecipe()
    mix = TaskMixture(LONG_MIXTURE, seed=recipe.seed, tokenizer=hf_tokenizer())
    rng = mix.rng(-1)
    train = collect(drafter, target, *encode(target, [mix.sample(rng) for _ in range(recipe.prompts)]))
    held = collect(drafter, target, *encode(target, eval_examples(T.suite_task_names("long-answer"), per_size=4, skip=8)))
    print(f"anchors: train {train.anchor.shape[0]}, held-out {held.anchor.shape[0]} ({time.time() - t0:.0f} s)")
    budgets = (16, 32, 64)
    print("| head width | candidates per node | " + " | ".join(f"tau at {b} (ddtree)" for b in budgets) + " |")
    print("|---|---|" + "---|" * len(budgets))
    for width in (32, 64, 128, 256):
        torch.manual_seed(0)
        head = train_path_head(drafter, target, train, replace(recipe, width=width), progress=False)
        for c in (2, 4, 8):
            taus = teacher_forced_taus(head, drafter, target, held, budgets, taps=f"candidates={c}")
            cells = " | ".join(f"{taus[str(b)]['taps']:.3f} ({taus[str(b)]['ddtree']:.3f})" for b in budgets)
            print(f"| {width} | {c} | {cells} |", flush=True)
    print(f"({time.time() - t0:.0f} s)")


if __name__ == "__main__":
    main()
