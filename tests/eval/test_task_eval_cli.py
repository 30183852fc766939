"""`dllm tasks` and `dllm eval-tasks` (on the weightless oracle model)."""

import json

import pytest

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


def test_eval_tasks_table_columns_line_up():
    from dllm.eval.task_eval import format_table

    result = {"tasks": {"copy": {1: 0.5, "low_confidence": 1.0}}, "c0": ["copy"],
              "summary": {k: {"mean_c0": 0.5, "mean": 0.5} for k in (1, "low_confidence")}}
    lines = [line for line in format_table(result, [1, "low_confidence"]).splitlines() if not line.startswith("-")]
    assert len({len(line) for line in lines}) == 1  # every row ends where the header does
    head = lines[0]
    for label in ("k=1", "low_confidence"):  # each number ends under its label
        end = head.index(label) + len(label)
        assert all(line[end - 1].isdigit() and (end == len(line) or line[end] == " ") for line in lines[1:])


def test_eval_tasks_rejects_bad_k(capsys):
    assert main(["eval-tasks", "--model", "oracle", "--tasks", "copy", "--k", "0"]) == 2
    assert "k must be an integer >= 1 (tokens per step), got 0" in capsys.readouterr().err


def test_skip_gives_the_later_instances_disjoint_from_the_first():
    from dllm.scoring.exact_match import eval_examples

    tasks = ["copy", "lookup_long"]
    first, later, both = (eval_examples(tasks, per_size=p, skip=s) for p, s in ((3, 0), (2, 3), (5, 0)))
    assert len(later) == len(first) // 3 * 2
    assert not {e.prompt for e in first} & {e.prompt for e in later}
    assert sorted(e.prompt for e in first + later) == sorted(e.prompt for e in both)
    assert [e.size for e in later] == sorted(e.size for e in later)  # size by size, as without skip


def test_eval_tasks_records_skip_and_rejects_instances_outside_the_split(capsys, tmp_path):
    path = tmp_path / "r.json"
    assert main(["eval-tasks", "--model", "oracle", "--tasks", "copy", "--per-size", "1", "--skip", "49",
                 "--json", str(path)]) == 0
    assert json.loads(path.read_text())["skip"] == 49
    capsys.readouterr()
    assert main(["eval-tasks", "--model", "oracle", "--tasks", "copy", "--per-size", "2", "--skip", "49"]) == 2
    assert "test instances 49..50 (skip=49, per_size=2) are not in the test split" in capsys.readouterr().err


def test_solved_follows_the_order_of_the_examples_given():
    """decode_and_score batches by task; ``solved`` maps back to the caller's order (oracle, k = 2:
    copy is solved, shuffle with tied exact marginals never is)."""
    from dllm.scoring.exact_match import decode_and_score, eval_examples
    from dllm.models.oracle import OracleLM

    copy, shuffle = eval_examples(["copy"], per_size=1), eval_examples(["shuffle"], per_size=1)
    mixed = [ex for pair in zip(copy, shuffle) for ex in pair]
    tally = decode_and_score(OracleLM(), mixed, "low_confidence", tokens_per_step=2, by_task=True)
    assert [tally.solved[i] for i in range(len(mixed))] == [True, False] * len(mixed[::2])


def test_eval_tasks_json_on_a_directory_is_refused_before_the_model_loads(capsys, tmp_path, monkeypatch):
    import dllm.models

    def load(*args, **kwargs):
        raise AssertionError("a model was loaded before --json was checked")

    monkeypatch.setattr(dllm.models, "load", load)
    with pytest.raises(SystemExit) as exit_:  # argparse refuses it (dllm.cli.args.output_file)
        main(["eval-tasks", "--model", "oracle", "--tasks", "copy", "--json", str(tmp_path)])
    assert exit_.value.code == 2
    assert f"--json: '{tmp_path}' is a directory; give a file path" in capsys.readouterr().err
    assert list(tmp_path.iterdir()) == []


def test_eval_tasks_k_belongs_to_the_k_flag(capsys):
    assert main(["eval-tasks", "--model", "oracle", "--sampler", "low_confidence:k=2", "--tasks", "copy"]) == 2
    assert "sets k=2; give tokens per step with --k" in capsys.readouterr().err


def test_eval_tasks_json_parent_is_created(tmp_path):
    path = tmp_path / "new" / "r.json"
    assert main(["eval-tasks", "--model", "oracle", "--tasks", "copy", "--per-size", "1", "--json", str(path)]) == 0
    assert json.loads(path.read_text())["tasks"]["copy"] == {"1": 1.0}
