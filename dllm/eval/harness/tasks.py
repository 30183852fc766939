"""The stress tasks as offline lm-evaluation-harness tasks: local JSONL files and the YAMLs that read them.

Every registered stress task ``<task>`` is the lm-eval task ``stress_<task>``
(``dllm/eval/harness/lm_tasks/stress_<task>.yaml``); the groups ``stress_pb_mini`` and
``stress_long_answer`` hold the tasks of each suite (``dllm.tasks.SUITES``) and report the mean over
their tasks, each task weighing the same (as ``dllm eval-tasks``' "mean all").

Data: ``write_task_files(directory, per_size)`` writes ``<task>.jsonl`` (the first ``per_size`` test
instances of every default size: the examples ``dllm eval-tasks --per-size N`` decodes) and a
``manifest.json``. The YAMLs name the files relatively (``dataset_path: json``, ``data_files``);
``resolve_data_files`` finds them in ``data_dir()`` = ``$DLLM_TASK_DATA``, else
``$XDG_CACHE_HOME/dllm/lm_tasks`` (``~/.cache/dllm/lm_tasks``). Write them with

    dllm eval harness-tasks --per-size 4 [--dir DIR]

A document holds the prompt text (``[BOS] <task> <args...> [SEP]``, words joined by spaces), the
reference answer (for the logs), and ``answer_length`` = L_ans: the request's ``max_gen_toks``, so
each example is decoded as exactly L_ans positions, as ``dllm eval-tasks`` does. The model returns the
whole generated region with its special tokens (``keep_special_tokens``), and ``score_region``
scores it with the task's own exact scorer ``dllm.tasks.score`` (EOS cut, EOS-only padding, validity).

The YAMLs are generated (``render_lm_tasks``); ``tests/eval/harness/test_harness_tasks.py`` checks that the
committed ones are up to date. This module imports no lm-eval (``lm_tasks/stress_utils.py`` does).
"""

from __future__ import annotations

import argparse
import json
import os
from pathlib import Path
from typing import Any, Optional, Sequence, Union

from dllm import tasks as T
from dllm.flags import POSITIVE, Distinct
from dllm.options import check_int

LM_TASKS_DIR = Path(__file__).resolve().parent / "lm_tasks"  # the include_path of the stress tasks
DATA_ENV = "DLLM_TASK_DATA"
MANIFEST = "manifest.json"
TASK_PREFIX = "stress_"
WRITE_COMMAND = "dllm eval harness-tasks --per-size 4"


def lm_task_name(task: str) -> str:
    """Registered stress task -> lm-eval task name (``copy`` -> ``stress_copy``)."""
    return TASK_PREFIX + T.get_task(task).name


def group_name(suite: str) -> str:
    """Suite -> lm-eval group name (``pb-mini`` -> ``stress_pb_mini``)."""
    if suite not in T.SUITES:
        raise ValueError(f"unknown task suite {suite!r}; valid suites: {list(T.SUITES)}")
    return TASK_PREFIX + suite.replace("-", "_")


def data_dir() -> Path:
    """Where the JSONL files live: ``$DLLM_TASK_DATA``, else ``$XDG_CACHE_HOME/dllm/lm_tasks``."""
    if os.environ.get(DATA_ENV):
        return Path(os.environ[DATA_ENV]).expanduser()
    cache = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(cache).expanduser() / "dllm" / "lm_tasks"


def task_docs(task: str, per_size: int) -> list[dict[str, Any]]:
    """The lm-eval documents of one task: the first ``per_size`` test instances of every default size."""
    from dllm.scoring.exact_match import eval_examples

    check_int("per_size", per_size, 1)
    name = T.get_task(task).name
    docs = []
    for ex in eval_examples([name], per_size):  # the examples `dllm eval-tasks --per-size` decodes
        docs.append({
            "task": name, "size": ex.size, "index": len(docs) % per_size,
            "prompt": " ".join(T.prompt_words(ex)), "answer": " ".join(ex.answer),
            "answer_length": T.answer_length(name, ex.size),
        })
    return docs


def suite_entries() -> list:
    """The registered tasks of the suites (``T.SUITES``); training-only curriculum variants, registered
    when a training recipe loads them (``dllm.train.recipes.narrow_tasks``), are not lm-eval tasks."""
    return [e for e in T.tasks if e.obj.suite in T.SUITES]


def write_task_files(directory: Union[str, Path, None] = None, per_size: int = 4,
                     tasks: Optional[Sequence[str]] = None) -> list[Path]:
    """Write ``<task>.jsonl`` for each task (default: every task of the suites) and ``manifest.json``
    into ``directory`` (default ``data_dir()``); returns the JSONL paths. The manifest lists every task
    file of the directory: one written before with the same ``per_size`` and split version is kept
    beside the new ones; a write that would leave files of another ``per_size`` or split version
    (``_check_consistent``) is refused before anything is written, as is a task listed twice."""
    check_int("per_size", per_size, 1)
    out_dir = Path(directory).expanduser() if directory is not None else data_dir()
    names = [T.get_task(t).name for t in tasks] if tasks else [e.name for e in suite_entries()]
    again = [n for i, n in enumerate(names) if n in names[:i]]
    if again:
        raise ValueError(f"tasks list {again[0]!r} twice: {list(tasks or names)}; give each task once")
    kept = _check_consistent(out_dir, per_size, names)
    out_dir.mkdir(parents=True, exist_ok=True)
    paths = []
    for name in names:
        path = out_dir / f"{name}.jsonl"
        path.write_text("".join(json.dumps(d) + "\n" for d in task_docs(name, per_size)))
        paths.append(path)
    manifest = {"split_version": T.SPLIT_VERSION, "per_size": per_size, "tasks": kept + names}
    (out_dir / MANIFEST).write_text(json.dumps(manifest, indent=2) + "\n")
    return paths


def _check_consistent(folder: Path, per_size: int, names: Sequence[str]) -> list[str]:
    """The tasks of ``folder``'s manifest that a write of ``names`` keeps (same ``per_size`` and split
    version; not among ``names``). ValueError when the folder's files were written with another
    ``per_size`` or split version and ``names`` does not rewrite them all: the lm-eval groups would mix
    example sets (a task's mean over other examples than ``dllm eval-tasks --per-size`` decodes)."""
    path = folder / MANIFEST
    if not path.is_file():
        return []
    try:
        old = json.loads(path.read_text())
        old_tasks = [str(t) for t in old["tasks"]]
    except (ValueError, KeyError, TypeError):
        raise ValueError(f"{str(path)!r} is not a manifest this command wrote (a JSON object with 'tasks'); "
                         f"remove it or give another --dir") from None
    left = [t for t in dict.fromkeys(old_tasks) if t not in names and (folder / f"{t}.jsonl").is_file()]
    if old.get("per_size") == per_size and old.get("split_version") == T.SPLIT_VERSION:
        return left
    if not left:
        return []
    raise ValueError(f"{str(folder)!r} holds task files written with --per-size {old.get('per_size')!r} "
                     f"(split version {old.get('split_version')!r}) that this write (--per-size {per_size}, split "
                     f"version {T.SPLIT_VERSION!r}) would not rewrite: {', '.join(left)}. Give --per-size "
                     f"{old.get('per_size')!r}, write them again too (leave --tasks out for every task), "
                     f"or give another --dir")


def resolve_data_files(dataset_kwargs: Optional[dict[str, Any]], task: str) -> dict[str, Any]:
    """``dataset_kwargs`` with each relative ``data_files`` entry made a path in ``data_dir()``; a
    missing file or a file written for another split version is an error naming the path and the
    command that writes it."""
    kwargs = dict(dataset_kwargs or {})
    files = kwargs.get("data_files")
    if not isinstance(files, dict) or not files:
        raise ValueError(f"lm-eval task {task!r}: dataset_kwargs.data_files must map split -> file, got {files!r}")
    folder = data_dir()
    resolved = {}
    for split, name in files.items():
        path = Path(name).expanduser()
        path = path if path.is_absolute() else folder / path
        if not path.is_file():
            raise FileNotFoundError(
                f"lm-eval task {task!r}: the data file {str(path)!r} does not exist. Write the stress-task "
                f"files with `{WRITE_COMMAND} --dir {path.parent}` (the data directory is ${DATA_ENV}, "
                f"default $XDG_CACHE_HOME/dllm/lm_tasks or ~/.cache/dllm/lm_tasks)"
            )
        _check_manifest(path.parent, task)
        resolved[split] = str(path)
    kwargs["data_files"] = resolved
    return kwargs


def _check_manifest(folder: Path, task: str) -> None:
    path = folder / MANIFEST
    version = json.loads(path.read_text()).get("split_version") if path.is_file() else None
    if version != T.SPLIT_VERSION:
        raise ValueError(f"lm-eval task {task!r}: the data files in {str(folder)!r} were written for split "
                         f"version {version!r}, this dllm has {T.SPLIT_VERSION!r}; rewrite them with "
                         f"`{WRITE_COMMAND} --dir {folder}`")


def score_region(doc: dict[str, Any], text: str) -> bool:
    """Exact score of a generated answer region (its words separated by spaces, special tokens kept)
    for a stress-task document, with the task's own scorer."""
    ex = T.parse_prompt(doc["prompt"].split())
    if ex.task != doc["task"]:
        raise ValueError(f"document of task {doc['task']!r} has a prompt of task {ex.task!r}: {doc['prompt']!r}")
    return T.score(ex, text.split())


# ---- the YAMLs ---------------------------------------------------------------------------------------
_HEADER = "# generated by dllm.eval.harness.tasks.render_lm_tasks; do not edit\n"
TEMPLATE = "_template_yaml"
_TEMPLATE_TEXT = _HEADER + """class: !function stress_utils.StressTask
dataset_path: json
test_split: test
output_type: generate_until
doc_to_text: "{{prompt}}"
doc_to_target: "{{answer}}"
generation_kwargs:
  until: []
  keep_special_tokens: true
  do_sample: false
process_results: !function stress_utils.process_results
metric_list:
  - metric: exact_match
    aggregation: mean
    higher_is_better: true
metadata:
  version: 1.0
"""


def lm_task_files() -> dict[str, str]:
    """File name -> text of every YAML of ``lm_tasks/``: the template, one per task, one per suite."""
    files = {TEMPLATE: _TEMPLATE_TEXT}
    for entry in suite_entries():
        files[f"{lm_task_name(entry.name)}.yaml"] = (
            f"{_HEADER}include: {TEMPLATE}\ntask: {lm_task_name(entry.name)}\n"
            f"dataset_kwargs:\n  data_files:\n    test: {entry.name}.jsonl\n")
    for suite in T.SUITES:
        members = "".join(f"  - {lm_task_name(n)}\n" for n in T.suite_task_names(suite))
        files[f"{group_name(suite)}.yaml"] = (
            f"{_HEADER}group: {group_name(suite)}\ntask:\n{members}aggregate_metric_list:\n"
            f"  - metric: exact_match\n    aggregation: mean\n    weight_by_size: false\n"
            f"metadata:\n  version: 1.0\n")
    return files


def render_lm_tasks(directory: Union[str, Path] = LM_TASKS_DIR) -> list[Path]:
    """Write the YAMLs of ``lm_task_files()`` into ``directory`` (run after registering a task)."""
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    paths = []
    for name, text in lm_task_files().items():
        (directory / name).write_text(text)
        paths.append(directory / name)
    return paths


def main(argv: Optional[Sequence[str]] = None) -> list[Path]:
    p = argparse.ArgumentParser(prog="dllm eval harness-tasks",
                                description="write the stress tasks' JSONL files for lm-eval")
    p.add_argument("--dir", default=None, help=f"output directory (default: ${DATA_ENV} or {data_dir()})")
    p.add_argument("--per-size", type=POSITIVE, default=4, help="test examples per task size (as dllm eval-tasks)")
    p.add_argument("--tasks", nargs="+", action=Distinct, default=None, help="registered task names (default: all)")
    p.add_argument("--yaml", action="store_true", help="also regenerate the YAMLs in dllm/eval/harness/lm_tasks")
    args = p.parse_args(argv)
    paths = write_task_files(args.dir, args.per_size, args.tasks)
    print(f"wrote {len(paths)} task files to {paths[0].parent if paths else args.dir}")
    if args.yaml:
        print(f"wrote {len(render_lm_tasks())} YAMLs to {LM_TASKS_DIR}")
    return paths


__all__ = ["DATA_ENV", "LM_TASKS_DIR", "data_dir", "group_name", "lm_task_files", "lm_task_name", "render_lm_tasks",
           "resolve_data_files", "score_region", "task_docs", "write_task_files"]

if __name__ == "__main__":
    main()
