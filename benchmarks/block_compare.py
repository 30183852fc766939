"""The block-diffusion model beside the bidirectional ones: tiny-sdar, tiny-llada and tiny-dream on the
same PB-mini test examples, in blocks of 4, with the same samplers, and SDAR's own rule on tiny-sdar (exact match, NFE, tokens per
forward, forwarded tokens, tokens/s). tiny-sdar decodes with its exact `block` cache and without a
cache; the bidirectional models without a cache and with Fast-dLLM's `dual` (the block cache is refused
for them, and the approximate caches for tiny-sdar).

    python benchmarks/block_compare.py --n 8 --repeats 3 --threads 1 --out benchmarks/results/block-compare

Writes block-compare.json and block-compare.md (the command inside) under --out; Ctrl-C keeps the
finished models' rows.
"""

from __future__ import annotations

import argparse
import json
import sys
from dataclasses import asdict
from pathlib import Path

SAMPLERS = ("low_confidence", "low_confidence:k=2", "threshold", "threshold:threshold=0.7")
SDAR_SAMPLERS = ("sdar", "sdar:threshold=0.7")  # SDAR's own rule: tiny-sdar only (its 4 steps per block need
# blocks of >= 4 positions; a bidirectional model's one-block answers are as short as 3)
MODELS = {"tiny-sdar": ("none", "block"), "tiny-llada": ("none", "dual"), "tiny-dream": ("none", "dual")}


def settings(caches: tuple[str, ...], samplers: tuple[str, ...] = SAMPLERS) -> list[str]:
    return [s if c == "none" else f"{s}{',' if ':' in s else ':'}cache={c}" for c in caches for s in samplers]


def c0_mean(per_task: dict[str, float]) -> float:
    """Mean exact match (%) over the C(Y|X) = 0 tasks (equal examples per task)."""
    from dllm.scoring.exact_match import c0_of

    c0 = c0_of(per_task)
    return 100 * sum(per_task[t] for t in c0) / len(c0)


def main() -> int:
    import torch

    from dllm.eval.compare import compare
    from dllm.scoring.exact_match import load_model

    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--n", type=int, default=8, help="test examples per task")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--out", default="runs/block-compare")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    rows: dict[str, list[dict]] = {}
    command = "python benchmarks/block_compare.py " + " ".join(sys.argv[1:])

    def write() -> None:
        (out / "block-compare.json").write_text(json.dumps({"command": command, "rows": rows}, indent=2))
        lines = ["# tiny-sdar beside tiny-llada and tiny-dream, blocks of 4\n", f"    {command}\n",
                 f"{args.n} PB-mini test examples per task (31 tasks); tokens/s is the median of {args.repeats} "
                 f"interleaved timed runs per model; CPU, {args.threads} thread(s), float32.\n",
                 "| model | setting | exact match % | C=0 % | NFE / example | tokens / forward | forwarded tokens | tokens/s |",
                 "|---|---|---|---|---|---|---|---|"]
        for model, results in rows.items():
            for r in results:
                lines.append(f"| {model} | `{r['label']}` | {100 * r['accuracy']:.1f} | {c0_mean(r['per_task']):.1f} | "
                             f"{r['nfe_per_example']:.2f} | {r['tokens_per_forward']:.2f} | {r['forwarded_tokens']:,} | "
                             f"{r['tokens_per_second']:.1f} |")
        (out / "block-compare.md").write_text("\n".join(lines) + "\n")

    try:
        for name, caches in MODELS.items():
            model = load_model(name)
            samplers = SAMPLERS + SDAR_SAMPLERS if name == "tiny-sdar" else SAMPLERS
            results = compare(model, settings(caches, samplers), None, args.n, block_length=None if name == "tiny-sdar" else 4,
                              repeats=args.repeats, show_progress=False)
            rows[name] = [asdict(r) for r in results]
            write()
            print(f"{name}: done", flush=True)
    except KeyboardInterrupt:
        write()
        print(f"interrupted: {len(rows)} finished models are saved in {out / 'block-compare.md'}")
        return 130
    print(f"wrote {out / 'block-compare.json'} and {out / 'block-compare.md'}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
