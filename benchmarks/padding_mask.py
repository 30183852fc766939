"""The padding mask of a full forward: broadcast key mask [B, 1, 1, T] (what the models build since
2026-12-02) against the square ``keys | pad_queries`` mask [B, 1, T, T] it replaced, and the ``sdpa``
backend's padded-batch path (``dllm.kernels.packed``: each group of equally padded rows attends to
its real keys, unmasked) against the one masked call (``sdpa_plain``), on a left-padded batch of
long-prompt suite prompts. Same logits at every real position (the packed path: up to float
summation order; the largest difference is printed); prints the time of each.

    python benchmarks/padding_mask.py [MODEL] [--rows 4] [--repeats 5] [--threads 1]
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch

from dllm import tasks as T
from dllm.scoring.exact_match import load_model
from dllm.inputs import init_state
from dllm.models.inputs import padding_attn_mask, square_padding_mask


def padded_batch(model, rows: int, gen: int = 4):
    """The engine's canvas (``dllm.inputs.init_state``: prompts left-padded, then ``gen`` masks) for
    ``rows`` test prompts of the long-prompt suite: the tasks in turn, at their largest and
    second-largest sizes in turn (a ragged batch)."""
    from dllm.tasks.split import test_split

    names = T.suite_task_names("long-prompt")
    tasks = [T.get_task(names[i % len(names)]) for i in range(rows)]
    examples = [test_split(t.name, t.default_sizes[-1 - i % 2])[i // len(names)] for i, t in enumerate(tasks)]
    return init_state(model, [T.prompt_ids(e) for e in examples], gen, 0.0, None, torch.device("cpu"))


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("model", nargs="?", default="tiny-llada-long")
    ap.add_argument("--rows", type=int, default=4)
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--threads", type=int, default=1)
    args = ap.parse_args()
    if args.rows < 1 or args.repeats < 1 or args.threads < 1:
        ap.error(f"--rows, --repeats and --threads must be >= 1, got {args.rows}, {args.repeats}, {args.threads}")
    torch.set_num_threads(args.threads)
    model = load_model(args.model)
    state = padded_batch(model, args.rows)
    ids, real, positions = state.x, state.key_padding_mask, state.positions
    broadcast, square = padding_attn_mask(real), square_padding_mask(real)
    variants = {"broadcast, sdpa (packed)": ("sdpa", broadcast), "broadcast, sdpa_plain": ("sdpa_plain", broadcast),
                "square, sdpa_plain": ("sdpa_plain", square)}
    times: dict[str, list[float]] = {k: [] for k in variants}
    outs = {}
    with torch.inference_mode():
        for r in range(args.repeats + 1):  # the first round warms up
            for name, (backend, mask) in variants.items():
                model.set_attn_backend(backend)
                t = time.perf_counter()
                outs[name] = model._raw_forward(ids, positions, mask, (), ())[0]
                if r:
                    times[name].append(time.perf_counter() - t)
    plain = outs["broadcast, sdpa_plain"][real]
    same = torch.equal(outs["square, sdpa_plain"][real], plain)
    diff = (outs["broadcast, sdpa (packed)"][real] - plain).abs().max().item()
    print(f"{args.model}: {args.rows} rows x {ids.shape[1]} columns ({int((~real).sum())} pads), "
          f"{args.threads} thread(s), median of {args.repeats}; real positions: square = broadcast bit for bit: "
          f"{same}, packed vs plain max |diff| {diff:.1e}")
    med = {k: statistics.median(v) for k, v in times.items()}
    for k, v in med.items():
        print(f"  {k:<26} {v * 1000:8.1f} ms")
    print(f"  square / broadcast (plain): {med['square, sdpa_plain'] / med['broadcast, sdpa_plain']:.2f}x; "
          f"plain / packed: {med['broadcast, sdpa_plain'] / med['broadcast, sdpa (packed)']:.2f}x")

if __name__ == "__main__":
    main()
