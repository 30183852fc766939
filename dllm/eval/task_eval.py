"""``dllm eval-tasks``: exact match of a model on the stress-task test split at k tokens per step.

Each example is decoded as one block of its answer length with a fixed-step sampler
(``low_confidence`` by default, i.e. top-k confidence) and ``steps = ceil(L_ans / k)``; the table
has one row per task and one column per k, plus the mean over the C(Y|X) = 0 tasks.
"""

from __future__ import annotations

import json
from typing import Optional, Sequence

from dllm import tasks as T


def evaluate_task_table(model, task_names: Optional[Sequence[str]], ks: Sequence[int], per_size: int,
                        sampler: str = "low_confidence") -> dict:
    from dllm.eval.exact_match import eval_examples, evaluate, zero_tc_tasks

    examples = eval_examples(task_names, per_size=per_size)
    table: dict[str, dict[int, float]] = {}
    summary: dict[int, dict[str, float]] = {}
    for k in ks:
        res = evaluate(model, examples, tokens_per_step=k, sampler=sampler)
        for task, acc in res.accuracy.items():
            table.setdefault(task, {})[k] = acc
        summary[k] = {"mean": res.mean, "mean_c0": res.mean_zero_tc, "forwards": res.forwards,
                      "seconds": res.seconds}
    return {"tasks": table, "summary": summary, "zero_tc": list(zero_tc_tasks()),
            "examples": len(examples), "per_size": per_size, "sampler": sampler}


def format_table(result: dict, ks: Sequence[int]) -> str:
    zero = set(result["zero_tc"])
    width = max(len(t) for t in result["tasks"]) + 2
    head = f"{'task':<{width}}C=0  " + "  ".join(f"k={k:<5}" for k in ks)
    lines = [head, "-" * len(head)]
    for task in sorted(result["tasks"]):
        cells = "  ".join(f"{100 * result['tasks'][task][k]:6.1f}" for k in ks)
        lines.append(f"{task:<{width}}{'yes' if task in zero else '   '}  {cells}")
    lines.append("-" * len(head))
    for key, label in (("mean_c0", "mean C(Y|X)=0"), ("mean", "mean all")):
        cells = "  ".join(f"{100 * result['summary'][k][key]:6.1f}" for k in ks)
        lines.append(f"{label:<{width}}     {cells}")
    return "\n".join(lines)


def run_eval_tasks(args) -> dict:
    from dllm.models import load

    ks = args.k or [1]
    model = load(args.model, dtype=None if args.model == "oracle" else args.dtype, device=args.device)
    result = evaluate_task_table(model, args.tasks, ks, args.per_size, args.sampler)
    result["model"] = args.model
    print(format_table(result, ks))
    if args.json:
        with open(args.json, "w") as f:
            json.dump(result, f, indent=2)
    return result


def list_task_rows() -> list[tuple[str, str, str]]:
    """(name, size range, description) for every registered task."""
    rows = []
    for entry in T.tasks:
        task = entry.obj
        rows.append((entry.name, f"{task.min_size}..{task.max_size}", entry.description))
    return rows
