"""The padding mask of a full forward: broadcast key mask [B, 1, 1, T] (what the models build since
2026-12-02) against the square ``keys | pad_queries`` mask [B, 1, T, T] it replaced, on a left-padded
batch of long-prompt suite prompts. Same logits at every real position; prints the time of each.

    python benchmarks/padding_mask.py [MODEL] [--rows 4] [--repeats 5] [--threads 1]
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch

from dllm import tasks as T
from dllm.eval.exact_match import load_model
from dllm.inputs import init_state
from dllm.models.base import padding_attn_mask, square_padding_mask


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
    masks = {"broadcast [B,1,1,T]": padding_attn_mask(real), "square [B,1,T,T]": square_padding_mask(real)}
    times: dict[str, list[float]] = {k: [] for k in masks}
    outs = {}
    with torch.inference_mode():
        for r in range(args.repeats + 1):  # the first round warms up
            for name, mask in masks.items():
                t = time.perf_counter()
                outs[name] = model._raw_forward(ids, positions, mask, (), ())[0]
                if r:
                    times[name].append(time.perf_counter() - t)
    a, b = outs.values()
    same = torch.equal(a[real], b[real])
    print(f"{args.model}: {args.rows} rows x {ids.shape[1]} columns ({int((~real).sum())} pads), "
          f"{args.threads} thread(s), median of {args.repeats}; real positions identical: {same}")
    med = {k: statistics.median(v) for k, v in times.items()}
    for k, v in med.items():
        print(f"  {k:<20} {v * 1000:8.1f} ms")
    print(f"  square / broadcast: {med['square [B,1,T,T]'] / med['broadcast [B,1,1,T]']:.2f}x")


if __name__ == "__main__":
    main()
