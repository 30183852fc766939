"""What the server's loop issues outside the model's forwards, counted on its thread (what a GPU's
host would issue): ATen calls and host syncs, per forward call and per request, continuous against
static, for streamed and unstreamed requests.

    python benchmarks/serve_counts.py [MODEL] [--n 64] [--settings low_confidence@none ...] [--out FILE]

``dllm bench serve``'s requests (stress-task prompts, ``max_tokens`` = the answer length), all queued
at once on a ``DiffusionBackend`` of each mode, counted on the scheduler's loop thread
(``dllm.eval.bench.counters.count_backend``); ``cont.-nojoin`` is continuous with ``join=False``
(a generate call per group of requests instead of one running decode per setting). Continuous batching merges the
decodes' forwards, so it runs fewer forward calls for the same requests: per request is the fair
unit for its own work, per forward call what a step of the loop costs.
"""

from __future__ import annotations

import argparse

import torch

from dllm.eval.bench.counters import count_backend
from dllm.eval.bench.serving.serve import parse_setting, stress_requests
from dllm.scoring.exact_match import load_model


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("model", nargs="?", default="tiny-random-llada", help="a servable model (default tiny-random-llada)")
    ap.add_argument("--n", type=int, default=64, help="requests (default 64)")
    ap.add_argument("--settings", nargs="+", type=parse_setting, default=[("low_confidence", "none")],
                    help="SAMPLER[@CACHE] items, request i takes item i mod their number (default low_confidence@none)")
    ap.add_argument("--out", default=None, help="also write the table to this file")
    args = ap.parse_args()
    torch.set_num_threads(1)
    model = load_model(args.model)
    requests = stress_requests(args.n, settings=args.settings)
    settings = " ".join(f"{s}@{c}" for s, c in args.settings)
    lines = [f"# python benchmarks/serve_counts.py {args.model} --n {args.n} --settings {settings}",
             f"# torch {torch.__version__}; counted on the loop thread; outside = not inside the model's forward",
             f"{'requests':<12}{'mode':<12}{'forwards':>9}{'ATen/call':>11}{'ATen/req':>10}{'syncs/call':>12}"
             f"{'syncs/req':>11}"]
    modes = (("continuous", True), ("continuous", False), ("static", True))  # (mode, join)
    for stream in (True, False):
        for mode, join in modes:
            c = count_backend(model, mode, requests, stream=stream, join=join).current
            aten, syncs = c.aten_outside_forwards, c.syncs_outside_forwards
            f = max(c.forward_calls, 1)
            label = mode if join or mode != "continuous" else "cont.-nojoin"
            lines.append(f"{'streamed' if stream else 'unstreamed':<12}{label:<12}{c.forward_calls:>9}{aten / f:>11.1f}"
                         f"{aten / args.n:>10.1f}{syncs / f:>12.2f}{syncs / args.n:>11.2f}")
    text = "\n".join(lines)
    print(text)
    if args.out:
        with open(args.out, "w") as fh:
            fh.write(text + "\n")


if __name__ == "__main__":
    main()
