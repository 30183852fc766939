"""An explicit empty ``--tasks`` is refused (not the default suite), ``dllm eval harness-tasks`` keeps its
manifest true to the directory (no task twice, no files of another ``--per-size`` left unlisted), and the
harness's ``max_gen_toks`` errors name ``max_gen_toks``."""

import json

import pytest

from dllm.cli import main as dllm_main
from dllm.eval.harness import tasks as HT


@pytest.mark.parametrize("argv", [
    ["stress", "--model", "oracle", "--tasks", "--per-size", "1", "--threads", "1"],
    ["compare", "--model", "oracle", "--tasks", "--n", "1", "--threads", "1"],
    ["eval", "tasks", "--model", "oracle", "--tasks", "--per-size", "1", "--threads", "1"],
])
def test_empty_tasks_is_refused(argv, capsys, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)  # a run that went ahead would write runs/ here, not in the checkout
    with pytest.raises(SystemExit) as exit_info:
        dllm_main(argv)
    assert exit_info.value.code == 2
    err = capsys.readouterr().err
    assert "--tasks" in err and "at least one task name" in err and "dllm tasks" in err and "PB-mini" in err


def test_harness_tasks_refuses_a_task_twice(tmp_path, capsys):
    with pytest.raises(SystemExit) as exit_info:
        HT.main(["--dir", str(tmp_path), "--per-size", "1", "--tasks", "copy", "copy"])
    assert exit_info.value.code == 2
    assert "'copy' is given twice" in capsys.readouterr().err
    with pytest.raises(ValueError, match="'copy' twice"):
        HT.write_task_files(tmp_path, per_size=1, tasks=["copy", "copy"])
    assert not (tmp_path / HT.MANIFEST).exists()


def _manifest(folder) -> dict:
    return json.loads((folder / HT.MANIFEST).read_text())


def _lines(path) -> int:
    return len(path.read_text().splitlines())


def test_second_write_with_another_per_size_is_refused(tmp_path):
    HT.write_task_files(tmp_path, per_size=1, tasks=["copy"])
    before = (tmp_path / "copy.jsonl").read_text()
    with pytest.raises(ValueError, match=r"--per-size 1 .*would not rewrite: copy"):
        HT.write_task_files(tmp_path, per_size=2, tasks=["sort"])
    assert not (tmp_path / "sort.jsonl").exists()  # refused before anything is written
    assert (tmp_path / "copy.jsonl").read_text() == before and _manifest(tmp_path)["per_size"] == 1


def test_rewriting_every_task_with_another_per_size_is_consistent(tmp_path):
    HT.write_task_files(tmp_path, per_size=1, tasks=["copy"])
    HT.write_task_files(tmp_path, per_size=2, tasks=["sort", "copy"])
    assert _manifest(tmp_path)["per_size"] == 2 and sorted(_manifest(tmp_path)["tasks"]) == ["copy", "sort"]
    assert _lines(tmp_path / "copy.jsonl") == len(HT.task_docs("copy", 2))


def test_same_per_size_adds_to_the_manifest(tmp_path):
    HT.write_task_files(tmp_path, per_size=1, tasks=["copy"])
    HT.write_task_files(tmp_path, per_size=1, tasks=["sort"])
    assert _manifest(tmp_path) == {"split_version": HT.T.SPLIT_VERSION, "per_size": 1, "tasks": ["copy", "sort"]}


@pytest.fixture(scope="module")
def oracle_lm():
    pytest.importorskip("lm_eval")
    from dllm.eval import harness as H

    return H.DllmLM(pretrained="oracle", device="cpu")


@pytest.mark.parametrize("value", [0, -3, "many"])
def test_bad_max_gen_toks_names_max_gen_toks(oracle_lm, value):
    with pytest.raises(ValueError, match=f"max_gen_toks must be a positive integer.*got {value!r}"):
        oracle_lm.plan_generation("[BOS] copy A B [SEP]", {"until": [], "max_gen_toks": value})
    assert oracle_lm.plan_generation("[BOS] copy A B [SEP]", {"until": [], "max_gen_toks": "3"}).gen_length == 3
