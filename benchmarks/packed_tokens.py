"""A short ragged batch without a cache, its real tokens packed (``dllm.models.core.views.packed``) against
the padded forward (``model.packs_padded_rows = False``), the two in turn on one thread:

1. one forward of B left-padded rows of random lengths, at several padding shares (ms, best of rounds);
2. ``dllm.generate`` of ragged prompts (``low_confidence``, no cache): wall time and whether the tokens
   are the same.

    python benchmarks/packed_tokens.py [--model tiny-llada] [--rounds 5] [--out FILE]
"""

from __future__ import annotations

import argparse
import sys
import time

import torch

import dllm

SHAPES = ((24, 27, 26), (24, 27, 23), (8, 27, 20), (32, 40, 15))  # rows, padded length, shortest row
PROMPTS = ["[BOS] sort D A C B [SEP]", "[BOS] reverse K J I H G F E D [SEP]", "[BOS] copy A B C [SEP]",
           "[BOS] sort G F E D C B A [SEP]", "[BOS] copy P O N M L K J I H G [SEP]", "[BOS] reverse A B [SEP]",
           "[BOS] sort H C E A F B [SEP]", "[BOS] copy F [SEP]"]


def timed(model, packs: bool, run) -> float:
    model.packs_padded_rows = packs
    t0 = time.perf_counter()
    run()
    return time.perf_counter() - t0


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", default="tiny-llada")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--out", default=None, help="also write the table here")
    args = ap.parse_args()
    if args.rounds < 1:
        ap.error(f"--rounds must be >= 1, got {args.rounds}")
    torch.set_num_threads(1)
    model = dllm.load(args.model)
    lines = [f"# python benchmarks/packed_tokens.py --model {args.model} --rounds {args.rounds}",
             f"# torch {torch.__version__}, one thread; best of {args.rounds} interleaved rounds",
             f"{'forward of':<26}{'pad share':>10}{'packed ms':>11}{'padded ms':>11}{'x padded':>10}"]
    g = torch.Generator().manual_seed(0)
    with torch.inference_mode():
        for b, t, shortest in SHAPES:
            lengths = torch.randint(shortest, t + 1, (b,), generator=g)
            ids = torch.randint(10, 60, (b, t), generator=g)
            real = torch.arange(t)[None, :] >= (t - lengths)[:, None]
            best = {True: float("inf"), False: float("inf")}
            for _ in range(args.rounds):
                for packs in (True, False):
                    best[packs] = min(best[packs], timed(model, packs, lambda: [
                        model(ids, key_padding_mask=real) for _ in range(10)]) / 10)
            pad = 1 - real.float().mean().item()
            lines.append(f"{f'{b} rows of {shortest}-{t}':<26}{pad:>10.3f}{best[True] * 1e3:>11.2f}"
                         f"{best[False] * 1e3:>11.2f}{best[True] / best[False]:>9.2f}x")
            print(lines[-1], flush=True)
        outs, best = {}, {True: float("inf"), False: float("inf")}
        for packs in (True, False):  # untimed: the first call of each path warms it up
            timed(model, packs, lambda: dllm.generate(model, PROMPTS, sampler="low_confidence", gen_length=16, steps=16))
        for _ in range(args.rounds):
            for packs in (True, False):
                best[packs] = min(best[packs], timed(model, packs, lambda: outs.__setitem__(packs, dllm.generate(
                    model, PROMPTS, sampler="low_confidence", gen_length=16, steps=16))))
    same = outs[True].texts == outs[False].texts
    lines.append(f"generate, {len(PROMPTS)} ragged prompts, low_confidence, no cache: packed {best[True] * 1e3:.1f} ms, "
                 f"padded {best[False] * 1e3:.1f} ms ({best[True] / best[False]:.2f}x), same texts: {same}")
    print(lines[-1])
    if args.out:
        with open(args.out, "w") as f:
            f.write("\n".join(lines) + "\n")
    if not same:
        sys.exit("the packed and padded forwards decoded different texts")


if __name__ == "__main__":
    main()
