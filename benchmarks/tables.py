"""Markdown tables for the docs from the JSON that ``embedded-models.sh`` writes under ``benchmarks/results/``.

    python benchmarks/tables.py     # prints every table
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

HERE = Path(__file__).parent / "results"
MODELS = ("tiny-llada", "tiny-dream")


def _load(name: str):
    return json.loads((HERE / name).read_text())


def eval_tasks_table() -> str:
    runs = {m: _load(f"eval-tasks-{m}.json") for m in MODELS}
    first = runs[MODELS[0]]
    c0 = set(first["c0"] if "c0" in first else first["zero_tc"])  # the 2026-11-30 files say "zero_tc"
    lines = ["| task | C=0 | llada k=1 | k=2 | k=4 | dream k=1 | k=2 | k=4 |", "|---|---|---|---|---|---|---|---|"]
    for task in sorted(first["tasks"]):
        cells = [f"{100 * runs[m]['tasks'][task][k]:.0f}" for m in MODELS for k in ("1", "2", "4")]
        lines.append(f"| {task} | {'yes' if task in c0 else ''} | " + " | ".join(cells) + " |")
    for key, label in (("mean_c0", "**mean C(Y\\|X)=0**"), ("mean", "**mean all**")):
        cells = [f"{100 * runs[m]['summary'][k][key]:.1f}" for m in MODELS for k in ("1", "2", "4")]
        lines.append(f"| {label} | | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def compare_table(prefix: str, fwd: bool = True, speed: bool = True) -> str:
    runs = {m: {r["label"]: r for r in _load(f"{prefix}-{m}/compare.json")["results"]} for m in MODELS}
    head = ["sampler"]
    for m in MODELS:
        short = m.removeprefix("tiny-")
        head += [f"{short} acc %", "TPF"] + (["fwd tokens"] if fwd else []) + (["tok/s"] if speed else [])
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for label in runs[MODELS[0]]:
        cells = [f"`{label}`"]
        for m in MODELS:
            r = runs[m][label]
            cells += [f"{100 * r['accuracy']:.1f}", f"{r['tokens_per_forward']:.2f}"]
            cells += [f"{r['forwarded_tokens']:,}"] if fwd else []
            cells += [f"{r['tokens_per_second']:.0f}"] if speed else []
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def long_prompt_table() -> str:
    lines = ["| model | policy | sampler | wall s | speedup vs none | NFE | forwarded tokens | tokens/s | peak MB | "
             "KV MB | tokens equal to `none` |", "|" + "---|" * 11]
    for m in MODELS:
        for r in _load(f"bench-caches-{m}.json")["rows"]:
            lines.append(f"| {m} | {r['policy']} | {r['sampler']} | {r['wall_s']:.1f} | {r.get('speedup') or 0:.1f} | "
                         f"{r['nfe']} | {r['forwarded_tokens']:,} | {r['tokens_per_s']:.1f} | "
                         f"{r['peak_memory_mb'] or 0:.0f} | {r['kv_cache_mb']:.1f} | {100 * (r.get('match_none') or 0):.1f}% |")
    return "\n".join(lines)


def main() -> None:
    print("## eval-tasks\n" + eval_tasks_table())
    print("\n## compare\n" + compare_table("compare"))
    print("\n## caches (block 4)\n" + compare_table("caches", speed=False))
    print("\n## long prompt\n" + long_prompt_table())


if __name__ == "__main__":
    main()
