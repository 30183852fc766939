"""``dllm.eval.harness.tasks``: the stress tasks' JSONL files, their YAMLs and their scorer."""

import json
import os
import tempfile

os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
os.environ.setdefault("HF_DATASETS_CACHE", os.path.join(tempfile.gettempdir(), "dllm-test-datasets-cache"))

import pytest  # noqa: E402

from dllm import tasks as T  # noqa: E402
from dllm.eval.harness import tasks as HT  # noqa: E402
from dllm.scoring.exact_match import eval_examples  # noqa: E402


def test_committed_yamls_match_the_task_registry():
    """Registering a task needs its YAML: regenerate with ``dllm eval harness-tasks --yaml``."""
    want = HT.lm_task_files()
    on_disk = {p.name for p in HT.LM_TASKS_DIR.iterdir() if p.suffix == ".yaml" or p.name == HT.TEMPLATE}
    assert on_disk == set(want), "stale or missing YAMLs: run dllm eval harness-tasks --yaml"
    for name, text in want.items():
        assert (HT.LM_TASKS_DIR / name).read_text() == text, f"stale {name}: dllm eval harness-tasks --yaml"
    assert {HT.group_name(s) + ".yaml" for s in T.SUITES} <= set(want)


def test_files_hold_the_examples_of_eval_tasks(tmp_path):
    tasks = ["copy", "pick_pair", "sudoku4"]
    paths = HT.write_task_files(tmp_path, per_size=3, tasks=tasks)
    assert [p.name for p in paths] == [f"{t}.jsonl" for t in tasks]
    for task, path in zip(tasks, paths):
        docs = [json.loads(line) for line in path.read_text().splitlines()]
        exs = eval_examples([task], per_size=3)
        assert [d["prompt"] for d in docs] == [" ".join(T.prompt_words(ex)) for ex in exs]
        assert [d["answer_length"] for d in docs] == [T.answer_length(task, ex.size) for ex in exs]
    manifest = json.loads((tmp_path / HT.MANIFEST).read_text())
    assert manifest == {"split_version": T.SPLIT_VERSION, "per_size": 3, "tasks": tasks}


def test_score_region_is_the_task_scorer():
    for task in ("copy", "shuffle", "latin4", "pick_pair"):
        for ex in T.test_split(task, None, n=2):
            doc = {"task": task, "prompt": " ".join(T.prompt_words(ex))}
            good = list(T.target_words(ex))
            assert HT.score_region(doc, " ".join(good)) and T.score(ex, good)
            for bad in (good[:-1] + ["A"], [T.EOS] + good[:-1], good[1:] + [good[0]]):
                assert HT.score_region(doc, " ".join(bad)) == T.score(ex, bad)
    with pytest.raises(ValueError, match="has a prompt of task 'copy'"):
        HT.score_region({"task": "sort", "prompt": " ".join(T.prompt_words(T.test_split("copy", 4, n=1)[0]))}, "")


def test_missing_file_names_the_path_and_the_command(tmp_path, monkeypatch):
    pytest.importorskip("lm_eval")
    from dllm.eval.harness import task_manager

    monkeypatch.setenv(HT.DATA_ENV, str(tmp_path / "nowhere"))
    with pytest.raises(FileNotFoundError) as err:
        _load(task_manager(include_defaults=False), ["stress_copy"])
    msg = str(err.value)
    assert str(tmp_path / "nowhere" / "copy.jsonl") in msg and "dllm eval harness-tasks --per-size" in msg


def test_stale_files_are_refused(tmp_path, monkeypatch):
    HT.write_task_files(tmp_path, per_size=1, tasks=["copy"])
    manifest = json.loads((tmp_path / HT.MANIFEST).read_text())
    (tmp_path / HT.MANIFEST).write_text(json.dumps({**manifest, "split_version": "old"}))
    monkeypatch.setenv(HT.DATA_ENV, str(tmp_path))
    with pytest.raises(ValueError, match="split version 'old'"):
        HT.resolve_data_files({"data_files": {"test": "copy.jsonl"}}, "stress_copy")
    with pytest.raises(ValueError, match="data_files must map split -> file"):
        HT.resolve_data_files({}, "stress_copy")


def test_command_writes_the_files(tmp_path, capsys):
    paths = HT.main(["--dir", str(tmp_path), "--per-size", "1", "--tasks", "copy", "reverse"])
    assert [p.name for p in paths] == ["copy.jsonl", "reverse.jsonl"]
    assert "wrote 2 task files" in capsys.readouterr().out
    with pytest.raises(ValueError, match="per_size must be an integer >= 1, got 0"):
        HT.write_task_files(tmp_path, per_size=0, tasks=["copy"])


def _load(manager, names):
    """Build lm-eval tasks (``TaskManager.load`` in newer lm-eval, ``get_task_dict`` in older)."""
    if hasattr(manager, "load"):
        return manager.load(names)
    from lm_eval.tasks import get_task_dict

    return get_task_dict(names, manager)


def test_training_only_tasks_are_not_lm_eval_tasks():
    """A training recipe registers curriculum variants (``lookup_k1``, ``count_c8``); they are not
    suite tasks, so the YAMLs and the default task files stay the suites' (whatever ran before)."""
    from dllm.train.recipes import narrow_tasks

    before = HT.lm_task_files()
    names = [narrow_tasks.narrow_lookup(1), narrow_tasks.narrow_count(8)]
    assert all(n in T.tasks for n in names)
    assert HT.lm_task_files() == before
    assert not {e.name for e in HT.suite_entries()} & set(names)
