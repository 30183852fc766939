"""What a forward of the embedded models costs on this machine, as a function of the tokens it forwards.

    python benchmarks/forward_cost.py [MODEL] [--threads 2] [--repeats 20] [--rows 8 16 24] [--cols 4 12 23 36]

Times full forwards (no cache, logits for the last 4 columns only, as a block-reading sampler asks;
3 for the 4-column Dream case, whose shifted logits start at column 1)
over a grid of rows x columns covering what the short suite's steps forward (Fast-dLLM's ``dual``
step: a batch of 8 rows x a 4-column block; a full forward: 8 x ~23 columns; ``fast``'s LoPA step:
up to 3 variants per row over the whole short canvas), and fits ``t = c0 + c1 * tokens`` by least
squares. ``c0`` is the per-call cost, ``c1`` the per-token cost: where ``c1 * tokens`` is not small
against ``c0``, forwarding 2x the tokens costs real time, which is why ``fast`` + ``auto`` is slower
than ``threshold`` + ``dual`` on this CPU (benchmarks/e2e-2026-12-02f). Median of ``--repeats``
calls per cell, the cells in interleaved rounds.
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch

from dllm.scoring.exact_match import load_model

GRID_ROWS = (8, 16, 24)
GRID_COLS = (4, 12, 23, 36)


def _rows(ids: torch.Tensor) -> tuple[int, int]:
    return max(1, ids.shape[1] - 4), ids.shape[1]


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("model", nargs="?", default="tiny-llada")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--repeats", type=int, default=20)
    ap.add_argument("--rows", type=int, nargs="+", default=list(GRID_ROWS), help="the grid's rows per forward")
    ap.add_argument("--cols", type=int, nargs="+", default=list(GRID_COLS), help="the grid's columns per forward")
    args = ap.parse_args()
    if min(args.rows + args.cols) < 1:
        ap.error(f"--rows and --cols must be >= 1, got {args.rows} and {args.cols}")
    if args.threads < 1 or args.repeats < 1:
        ap.error(f"--threads and --repeats must be >= 1, got {args.threads} and {args.repeats}")
    torch.set_num_threads(args.threads)
    model = load_model(args.model).eval()
    vocab = model.config.vocab_size if hasattr(model, "config") else 64
    g = torch.Generator().manual_seed(0)
    cells = {(r, c): torch.randint(5, min(vocab, 60), (r, c), generator=g) for r in args.rows for c in args.cols}
    times: dict[tuple[int, int], list[float]] = {k: [] for k in cells}
    with torch.inference_mode():
        for ids in cells.values():  # warm-up
            model(ids, logits_rows=_rows(ids))
        for _ in range(args.repeats):
            for key, ids in cells.items():
                t0 = time.perf_counter()
                model(ids, logits_rows=_rows(ids))
                times[key].append(time.perf_counter() - t0)
    med = {k: statistics.median(v) for k, v in times.items()}
    tokens = torch.tensor([float(r * c) for r, c in med], dtype=torch.float64)
    secs = torch.tensor(list(med.values()), dtype=torch.float64)
    design = torch.stack([torch.ones_like(tokens), tokens], dim=1)
    c0, c1 = torch.linalg.lstsq(design, secs[:, None]).solution[:, 0].tolist()
    print(f"{args.model}: one forward, {args.threads} thread(s), median of {args.repeats} (ms)")
    print("rows \\ cols" + "".join(f"{c:>9}" for c in args.cols))
    for r in args.rows:
        print(f"{r:>11}" + "".join(f"{1e3 * med[(r, c)]:9.2f}" for c in args.cols))
    print(f"fit: t = {1e3 * c0:.3f} ms + {1e6 * c1:.2f} us x tokens  "
          f"(a call of 32 tokens: {1e3 * (c0 + 32 * c1):.2f} ms; of 552 tokens: {1e3 * (c0 + 552 * c1):.2f} ms)")


if __name__ == "__main__":
    main()
