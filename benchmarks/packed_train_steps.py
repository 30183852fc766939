"""Training steps of tiny-llada-long on cc-9's mixture (benchmarks/long-count.sh) with the models' full
forward per group of rows (``packs_padded_rows``, dllm.models.core.packed_rows) and without it, the two in
turn on the same batches (right-padded, as training builds them; batch 8; 2 threads).

    python benchmarks/packed_train_steps.py [--steps 8]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))

from dllm.train.recipes.narrow_tasks import curriculum_task  # noqa: E402
from dllm.train.data import MixtureConfig  # noqa: E402
from dllm.train.recipes import Recipe, TrainConfig, curricula  # noqa: E402
from dllm.train.trainer import Trainer  # noqa: E402

CC9 = ("count_c16:1:16:2040", "count_c8:0.25:8:2040", "lookup_long:0.5:4:339", "lookup_any:0.25:4:339",
       "span_copy_far:0.5:16:2039")


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--steps", type=int, default=8)
    ap.add_argument("--out", default="runs/packed-train-steps")
    args = ap.parse_args()
    if args.steps < 1:
        ap.error(f"--steps must be >= 1, got {args.steps}")
    torch.set_num_threads(2)
    names, weights, sizes = [], [], []
    for spec in CC9:
        name, weight, lo, hi = spec.split(":")
        names.append(curriculum_task(name))
        weights.append(float(weight))
        sizes.append(tuple(range(int(lo), int(hi) + 1)))
    mix = MixtureConfig(tasks=tuple(names), weights=tuple(weights), sizes=tuple(sizes))
    base = curricula.get("tiny-llada-long").stages[-1].recipe  # the shipped model's last stage
    cfg = TrainConfig(steps=100, batch_size=8, lr=1e-4, warmup=5, eval_every=0, save_every=0, mixture=mix)
    trainer = Trainer(Recipe("packed-train-steps", base.family, base.model, cfg, "", init_from="tiny-llada-long"),
                      args.out, progress=False)
    times: dict[bool, list[float]] = {True: [], False: []}
    for step in range(args.steps):
        batch = trainer.mixtures[0].batch(step, 8)
        for packs in (True, False):
            trainer.model.packs_padded_rows = packs
            t0 = time.perf_counter()
            trainer.train_step(batch, step)
            times[packs].append(time.perf_counter() - t0)
        print(f"step {step}: {tuple(batch.input_ids.shape)}, grouped rows {times[True][-1]:.2f} s, "
              f"padded {times[False][-1]:.2f} s", flush=True)
    total = {k: sum(v) for k, v in times.items()}
    print(f"total: grouped rows {total[True]:.2f} s, padded {total[False]:.2f} s ({total[False] / total[True]:.2f}x); "
          f"median step {statistics.median(times[True]):.2f} vs {statistics.median(times[False]):.2f} s")


if __name__ == "__main__":
    main()
