"""Teacher-forced digit accuracy on ``sort_num`` (README, "Embedded models on the stress tasks").

For random 4-number lists (not from the test split), one forward with the answer digits masked
(EOS kept) scores the tens digits and the units digits; a second forward with every tens digit
revealed scores the units digits again. A model that sorts by the tens digit but cannot bind
the units digit to its number gets tens ~100% and units well below it.

    python benchmarks/sort_num_probe.py tiny-llada tiny-dream
"""

from __future__ import annotations

import random
import sys

import torch

import dllm
from dllm import tasks as T


def probe(model, n: int = 60, size: int = 4, seed: int = 5) -> dict[str, float]:
    tok = model.tokenizer
    hits = {"tens": [0, 0], "units": [0, 0], "units_given_tens": [0, 0]}
    rng = random.Random(seed)
    digits = 2 * size
    for _ in range(n):
        ex = T.generate("sort_num", rng, size)
        prompt = T.prompt_ids(ex)
        answer = tok.convert_tokens_to_ids(list(T.target_words(ex)))  # [digits + EOS ...]
        for kind, reveal_tens in (("tens", False), ("units", False), ("units_given_tens", True)):
            parity = 0 if kind == "tens" else 1
            shown = [t if j >= digits or (reveal_tens and j % 2 == 0) else model.mask_id
                     for j, t in enumerate(answer)]
            with torch.no_grad():
                logits = model(torch.tensor([prompt + shown])).logits  # [1, T, V]
            pred = logits[0, len(prompt):].argmax(-1).tolist()
            for j in range(parity, digits, 2):
                hits[kind][0] += int(pred[j] == answer[j])
                hits[kind][1] += 1
    return {k: round(h / total, 3) for k, (h, total) in hits.items()}


if __name__ == "__main__":
    torch.set_num_threads(1)
    for name in sys.argv[1:] or ["tiny-llada", "tiny-dream"]:
        print(name, probe(dllm.load(name)))
