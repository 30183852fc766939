"""Per-request block size on the tiny pair: how much could choosing B per prompt gain?

    python benchmarks/block_choice.py [DRAFTER ...]      # default: tiny-ar-dflash tiny-ar-dflash-mixed

Greedy, batch 1, 1 thread, the reported split of ``dllm bench spec --trees`` (test instances 0-1
per default size of the long-answer suite, 18 prompts) and the held-out one (instances 2-3). For
every drafter, block sizes 4 / 8 / 12 / 16 decode every prompt in turn, 3 passes, the first a
warm-up. Prints tau and tokens/s per block size, per task, and the upper bound of any
per-request rule: each prompt decoded at the block size that was fastest FOR IT (chosen on the
held-out passes of the same prompt's task, or with hindsight on the prompt itself), against the
best fixed block size.
"""

import sys
import time
from collections import defaultdict

import torch

from dllm import tasks as T
from dllm.drafters.base import make_drafter
from dllm.drafters.loading import load_target
from dllm.drafters.loop import speculative_generate

BLOCKS = (4, 8, 12, 16)


def prompts_of(lo: int, hi: int, vocab) -> list[tuple[str, list[int]]]:
    return [(n, [vocab[w] for w in T.prompt_words(ex)]) for n in T.suite_task_names("long-answer")
            for s in T.get_task(n).default_sizes for ex in T.test_split(n, s, n=hi)[lo:]]


def measure(target, tok, drafter, prompts) -> dict:
    """(prompt index, B) -> [tokens, target forwards, seconds] over 2 timed passes."""
    out = defaultdict(lambda: [0, 0, 0.0])
    for rep in range(3):
        for j, (_, p) in enumerate(prompts):
            for b in BLOCKS:
                t0 = time.perf_counter()
                r = speculative_generate(target, drafter, [p], max_new_tokens=66, tokenizer=tok, block_size=b)
                wall = time.perf_counter() - t0
                if rep:
                    t = out[j, b]
                    t[0] += len(r.generated[0])
                    t[1] += r.target_forwards
                    t[2] += wall
    return out


def main(names: list[str]) -> None:
    torch.set_num_threads(1)
    target, tok = load_target("tiny-ar")
    vocab = tok.get_vocab()
    reported, held = prompts_of(0, 2, vocab), prompts_of(2, 4, vocab)
    for name in names:
        drafter = make_drafter("dflash", model=name)
        rep, hel = measure(target, tok, drafter, reported), measure(target, tok, drafter, held)
        print(f"== {name} (reported split, {len(reported)} prompts)")
        for b in BLOCKS:
            tokens = sum(rep[j, b][0] for j in range(len(reported)))
            fwd = sum(rep[j, b][1] for j in range(len(reported)))
            wall = sum(rep[j, b][2] for j in range(len(reported)))
            print(f"  block {b:2d}: tau {tokens / fwd:6.3f}  {tokens / wall:7.1f} tokens/s")
        tasks = sorted({t for t, _ in reported})
        for task in tasks:
            cells = []
            for b in BLOCKS:
                js = [j for j, (t, _) in enumerate(reported) if t == task]
                tokens, fwd, wall = (sum(rep[j, b][k] for j in js) for k in range(3))
                cells.append(f"B{b} tau {tokens / fwd:5.2f} {tokens / wall:6.0f}/s")
            print(f"  {task:14s} " + " | ".join(cells))
        speed = {b: sum(rep[j, b][0] for j in range(len(reported))) / sum(rep[j, b][2] for j in range(len(reported)))
                 for b in BLOCKS}
        fixed = max(speed, key=speed.get)
        # per task, the block size fastest on the held-out prompts of that task
        by_task = {}
        for task in tasks:
            js = [j for j, (t, _) in enumerate(held) if t == task]
            by_task[task] = max(BLOCKS, key=lambda b: sum(hel[j, b][0] for j in js) / sum(hel[j, b][2] for j in js))
        hindsight = {j: max(BLOCKS, key=lambda b: rep[j, b][0] / rep[j, b][2]) for j in range(len(reported))}
        for label, pick in (("per task (held-out)", {j: by_task[t] for j, (t, _) in enumerate(reported)}),
                            ("per prompt (hindsight)", hindsight)):
            tokens = sum(rep[j, pick[j]][0] for j in range(len(reported)))
            wall = sum(rep[j, pick[j]][2] for j in range(len(reported)))
            print(f"  {label}: {tokens / wall:7.1f} tokens/s = {tokens / wall / speed[fixed]:.3f}x the best "
                  f"fixed block ({fixed}); picks {sorted(set(pick.values()))}")
        print(f"  per task picks (held-out): {by_task}")


if __name__ == "__main__":
    main(sys.argv[1:] or ["tiny-ar-dflash", "tiny-ar-dflash-mixed"])
