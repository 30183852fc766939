"""`dllm tasks` and `dllm eval-tasks` (on the weightless oracle model)."""

import json

from dllm.cli import main


def test_tasks_lists_every_task_with_sizes(capsys):
    assert main(["tasks"]) == 0
    out = capsys.readouterr().out
    assert any(line.startswith("shuffle ") and "3..8" in line for line in out.splitlines())
    assert len(out.splitlines()) >= 31


def test_eval_tasks_on_the_oracle(capsys, tmp_path):
    path = tmp_path / "r.json"
    assert main(["eval-tasks", "--model", "oracle", "--tasks", "copy", "shuffle", "--k", "1", "2",
                 "--per-size", "1", "--json", str(path)]) == 0
    out = capsys.readouterr().out
    assert "mean C(Y|X)=0" in out
    result = json.loads(path.read_text())
    # one token per step: the exact posterior solves everything; copy (C = 0) also at k = 2;
    # shuffle at k = 2 with exact (tied) marginals commits the same item twice
    assert result["tasks"]["copy"] == {"1": 1.0, "2": 1.0}
    assert result["tasks"]["shuffle"]["1"] == 1.0 and result["tasks"]["shuffle"]["2"] == 0.0


def test_eval_tasks_rejects_bad_k(capsys):
    assert main(["eval-tasks", "--model", "oracle", "--tasks", "copy", "--k", "0"]) == 2
    assert "tokens_per_step must be an integer >= 1, got 0" in capsys.readouterr().err
