"""``dllm eval-tasks``: exact match of a model on the stress-task test split at k tokens per step.

Each example is decoded as one block of its answer length with a fixed-step sampler
(``low_confidence`` by default, i.e. top-k confidence) and ``steps = ceil(L_ans / k)``; the table
has one row per task and one column per k, plus the mean over the C(Y|X) = 0 tasks (``c0``, see
``dllm.scoring.exact_match``). An adaptive sampler chooses its own steps: it gets one column,
``adaptive``, and no k.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Optional, Sequence, Union

from dllm import tasks as T
from dllm.eval.interrupt import finished, until_interrupted
from dllm.scoring.exact_match import c0_of, check_test_range, eval_examples, evaluate, load_model
from dllm.settings import DecodeSettings

Column = Union[int, str]  # k, or "adaptive"


def columns(sampler: str, ks: Optional[Sequence[int]]) -> list[Column]:
    """The table's columns: ``ks`` (default [1]) for a fixed-step sampler, ["adaptive"] for an
    adaptive one; raises ValueError (before any decoding) for a k that does not apply, or a k written
    in the sampler spec (the columns' k come from ``--k``)."""
    from dllm.samplers import samplers

    setting = DecodeSettings.parse(sampler)
    if setting.tokens_per_step is not None:
        raise ValueError(f"sampler spec {sampler!r} sets k={setting.tokens_per_step}; give tokens per step with --k "
                         f"(one column per value), e.g. --k {setting.tokens_per_step}")
    setting.check()
    for k in ks or ():
        setting.replace(tokens_per_step=k).check()
    if not samplers.get(setting.name).fixed_steps:
        return ["adaptive"]
    return list(ks or [1])


def check_json_path(path: Optional[str]) -> None:
    """ValueError (before the model loads) unless ``path`` is None or names a file that can be written:
    not a directory, and its parent, where it exists, a directory."""
    if path is None:
        return
    out = Path(path)
    if out.is_dir():
        raise ValueError(f"--json {str(out)!r} is a directory; give a file path, e.g. {str(out / 'eval-tasks.json')!r}")
    parent = next((q for q in out.parents if q.exists()), None)
    if parent is not None and not parent.is_dir():
        raise ValueError(f"--json {str(out)!r}: {str(parent)!r} is a file, not a directory")


def evaluate_task_table(model, task_names: Optional[Sequence[str]], ks: Sequence[Column], per_size: int,
                        sampler: str = "low_confidence", skip: int = 0, into: Optional[dict] = None) -> dict:
    """The table, one column per k. ``into``: a dict filled column by column as each one ends (so a
    caller interrupted midway keeps the finished columns); returned."""
    examples = eval_examples(task_names, per_size=per_size, skip=skip)
    result = into if into is not None else {}
    result.update({"tasks": {}, "summary": {}, "c0": [], "examples": len(examples), "per_size": per_size,
                   "skip": skip, "sampler": sampler})
    for k in ks:
        res = evaluate(model, examples, tokens_per_step=None if k == "adaptive" else k, sampler=sampler)
        for task, acc in res.accuracy.items():
            result["tasks"].setdefault(task, {})[k] = acc
        result["summary"][k] = {"mean": res.mean, "mean_c0": res.mean_c0, "forwards": res.forwards,
                                "seconds": res.seconds}
        result["c0"] = list(c0_of(result["tasks"]))
    return result


def format_table(result: dict, ks: Sequence[Column]) -> str:
    c0 = set(result["c0"])
    names = ("mean C(Y|X)=0", "mean all")
    width = max(len(t) for t in (*result["tasks"], *names)) + 2
    labels = [f"k={k}" if isinstance(k, int) else str(k) for k in ks]
    cols = [max(6, len(label)) for label in labels]  # each column as wide as its label or a 6.1f cell
    head = f"{'task':<{width}}C=0  " + "  ".join(f"{label:>{c}}" for label, c in zip(labels, cols))
    lines = [head, "-" * len(head)]
    for task in sorted(result["tasks"]):
        cells = "  ".join(f"{100 * result['tasks'][task][k]:{c}.1f}" for k, c in zip(ks, cols))
        lines.append(f"{task:<{width}}{'yes' if task in c0 else '   '}  {cells}")
    lines.append("-" * len(head))
    for key, name in zip(("mean_c0", "mean"), names):
        cells = "  ".join(f"{100 * result['summary'][k][key]:{c}.1f}" for k, c in zip(ks, cols))
        lines.append(f"{name:<{width}}     {cells}")
    return "\n".join(lines)


def run_eval_tasks(args) -> int:
    """``dllm eval tasks``: the table (and ``--json``); Ctrl-C keeps the finished k columns (exit 130)."""
    ks = columns(args.sampler, args.k)
    check_test_range(args.per_size, args.skip)  # a bad range fails before the model loads
    check_json_path(args.json)
    result: dict = {"model": args.model}

    def save(done: Sequence[Column], interrupted: bool = False) -> None:
        print(format_table(result, done))
        if args.json:
            Path(args.json).parent.mkdir(parents=True, exist_ok=True)
            with open(args.json, "w") as f:
                json.dump({**result, "interrupted": interrupted}, f, indent=2)

    def body() -> int:
        model = load_model(args.model, args.dtype, args.device)
        evaluate_task_table(model, args.tasks, ks, args.per_size, args.sampler, args.skip, into=result)
        save(ks)
        return 0

    def finish() -> str:
        done = [k for k in ks if k in result.get("summary", {})]
        if not done:
            return "no k column finished; nothing written"
        save(done, interrupted=True)
        return finished(len(done), "column", args.json, "" if args.json else "")

    return until_interrupted(body, finish)


def list_task_rows() -> list[tuple[str, str, str]]:
    """(name, size range, description) for every registered task."""
    rows = []
    for entry in T.tasks:
        task = entry.obj
        rows.append((entry.name, f"{task.min_size}..{task.max_size}", entry.description))
    return rows
