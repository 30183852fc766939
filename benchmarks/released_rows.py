"""What releasing finished rows saves a batched ``generate(..., stop_at_eos=True)`` call.

    python benchmarks/released_rows.py [MODEL] [--batch 64] [--gen-length 32] [--block-length 8] [--repeats 5]

One batch of stress-task prompts (``dllm bench serve``'s draw: mixed prompt and answer lengths),
decoded with ``stop_at_eos``: a row whose answer ended is released after its block (``dllm.rows``)
and later forwards skip it; the reference path (``generate(..., skip_released=False)``) forwards
every row to the call's end. Both paths run in interleaved rounds and must give the
same tokens (checked). Prints NFE, forwarded tokens, tokens per forward and the median wall time of
each path, and their ratios.
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch

import dllm
from dllm.eval.bench.serving.serve import stress_requests
from dllm.scoring.exact_match import load_model


def decode(model, prompts: list[str], args, skip: bool):
    t0 = time.perf_counter()
    out = dllm.generate(model, prompts, sampler=args.sampler, gen_length=args.gen_length,
                        block_length=args.block_length, stop_at_eos=True, skip_released=skip)
    return out, time.perf_counter() - t0


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("model", nargs="?", default="tiny-llada")
    ap.add_argument("--sampler", default="low_confidence")
    ap.add_argument("--batch", type=int, default=64)
    ap.add_argument("--gen-length", type=int, default=32)
    ap.add_argument("--block-length", type=int, default=8)
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--threads", type=int, default=1)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    model = load_model(args.model)
    prompts = [r.prompt for r in stress_requests(args.batch)]
    walls: dict[bool, list[float]] = {True: [], False: []}
    outs = {}
    for _ in range(args.repeats):  # interleaved: a drifting machine slows both paths alike
        for skip in (True, False):
            outs[skip], wall = decode(model, prompts, args, skip)
            walls[skip].append(wall)
    fast, ref = outs[True], outs[False]
    if fast.sequences.tolist() != ref.sequences.tolist():
        raise SystemExit("released rows changed the tokens: the fast path and the reference path differ")
    print(f"{args.model}, {args.sampler}, batch {args.batch}, gen_length {args.gen_length}, block_length "
          f"{args.block_length}, stop_at_eos, {args.threads} thread(s); tokens equal on both paths")
    print(f"{'path':<28}{'nfe':>6}{'forwarded':>12}{'tok/forward':>13}{'wall_s (median)':>17}")
    for name, out, skip in (("released rows skipped", fast, True), ("every row (reference)", ref, False)):
        print(f"{name:<28}{out.nfe:>6}{out.forwarded_tokens:>12}{out.content_tokens / out.nfe:>13.2f}"
              f"{statistics.median(walls[skip]):>17.3f}")
    print(f"forwarded tokens x{ref.forwarded_tokens / fast.forwarded_tokens:.2f} fewer; wall time "
          f"x{statistics.median(walls[False]) / statistics.median(walls[True]):.2f} faster "
          f"(median of {args.repeats} interleaved rounds)")


if __name__ == "__main__":
    main()
