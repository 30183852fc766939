"""Where ``dllm train --resume`` starts a chain (``dllm/train/plan_file.py``): ``plan.json`` records the first
run's ``--from-stage`` / ``--init-from``, so ``--resume`` alone continues a chain started part-way, and another
``--init-from`` at that start is refused; and the line that ends a run the time limit stopped."""

from __future__ import annotations

import json
import shlex
from pathlib import Path

import pytest

from dllm.models.loading import locate
from dllm.train.__main__ import main
from dllm.train.runner import PLAN_FILE

RUN = ["--max-steps", "1", "--batch-size", "4", "--no-progress", "--threads", "1", "--no-export"]
CHAIN = ["--recipe", "tiny-llada-long", "--until-stage", "kc-k1b", *RUN]
PART_WAY = [*CHAIN, "--from-stage", "kc-k1a"]
NO_STEP = ["--time-limit", "1e-9"]  # out of time before the first step: stopped, nothing trained


def started_part_way(out: Path, init: str = "tiny-llada-long") -> None:
    """A chain started at kc-k1a from ``init`` and stopped by the time limit before its first step."""
    assert main([*PART_WAY, "--init-from", init, "--out", str(out), *NO_STEP]) == 0


def test_resume_alone_continues_a_chain_started_part_way_from_its_init(tmp_path: Path,
                                                                       capsys: pytest.CaptureFixture[str]):
    out = tmp_path / "run"
    started_part_way(out)
    capsys.readouterr()
    assert main([*CHAIN, "--out", str(out), "--resume"]) == 0  # no --from-stage, no --init-from: both from plan.json
    assert "[3/28] kc-k1a: steps 1 of 600, from tiny-llada-long" in capsys.readouterr().err
    assert json.loads((out / "kc-k1a" / "stage.json").read_text())["init_from"] == "tiny-llada-long"
    assert not (out / "tiny-llada").exists()  # the stages before the start are not trained


def test_a_directory_init_is_recorded_so_a_resume_from_elsewhere_finds_it(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]):
    first, elsewhere = tmp_path / "first", tmp_path / "elsewhere"
    first.mkdir(), elsewhere.mkdir()
    (first / "init").symlink_to(locate("tiny-llada-long"), target_is_directory=True)
    monkeypatch.chdir(first)
    started_part_way(first / "run", init="init")  # relative to the first run's working directory
    assert json.loads((first / "run" / PLAN_FILE).read_text())["init_from"] == str((first / "init").resolve())
    monkeypatch.chdir(elsewhere)
    capsys.readouterr()
    assert main(["--recipe", "tiny-llada-long", "--until-stage", "kc-k1a", *RUN, "--out", str(first / "run"),
                 "--resume"]) == 0
    assert f"kc-k1a: steps 1 of 600, from {(first / 'init').resolve()}" in capsys.readouterr().err


def test_a_resume_at_the_recorded_start_with_another_init_is_refused_naming_both(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]):
    out = tmp_path / "run"
    started_part_way(out)
    plan = (out / PLAN_FILE).read_text()
    capsys.readouterr()
    for argv in (CHAIN, PART_WAY):  # the start recorded, or given as recorded
        assert main([*argv, "--init-from", "tiny-llada", "--out", str(out), "--resume"]) == 2
        err = capsys.readouterr().err
        assert "started at stage 'kc-k1a' with --init-from tiny-llada-long" in err
        assert "this resume gives --init-from tiny-llada:" in err
    assert (out / PLAN_FILE).read_text() == plan and not (out / "kc-k1a" / "stage.json").exists()
    # the recorded init given again, or another start, is not refused
    assert main([*PART_WAY, "--init-from", "tiny-llada-long", "--out", str(out), "--resume", "--dry-run"]) == 0
    argv = [*CHAIN, "--from-stage", "kc-k1b", "--init-from", "tiny-llada", "--out", str(out), "--resume"]
    assert main([*argv, "--dry-run"]) == 0
    assert "kc-k1b: from tiny-llada;" in capsys.readouterr().out


def test_a_plan_json_without_the_start_resumes_as_before(tmp_path: Path, capsys: pytest.CaptureFixture[str]):
    out = tmp_path / "run"
    started_part_way(out)
    plan = json.loads((out / PLAN_FILE).read_text())
    del plan["from_stage"], plan["init_from"]  # as an older dllm wrote it
    (out / PLAN_FILE).write_text(json.dumps(plan))
    capsys.readouterr()
    assert main(["--recipe", "tiny-llada-long", *RUN, "--out", str(out), "--resume", "--dry-run"]) == 0
    assert "  1. tiny-llada: from a fresh init" in capsys.readouterr().out  # the whole chain, as before
    assert main([*PART_WAY, "--init-from", "tiny-llada", "--out", str(out), "--resume", "--dry-run"]) == 0
    assert "kc-k1a: from tiny-llada;" in capsys.readouterr().out  # nothing recorded to refuse it by


def test_a_time_limited_chain_ends_with_a_line_saying_so_and_the_command_that_continues_it(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]):
    """Exit status 0 (a stop asked for, not an error: docs/guides/cli.md promises no other), the summary's
    ``stopped``, and a last line that says the time limit stopped the run and gives the command that finishes it."""
    out = tmp_path / "run"
    started_part_way(out)
    captured = capsys.readouterr()
    summary = json.loads(captured.out.splitlines()[-1])
    assert summary["finished"] == [] and summary["stopped"] == {"stage": "kc-k1a", "step": 0, "end": 1}
    last = captured.err.strip().splitlines()[-1]
    assert last.startswith("not finished: the time limit (1e-09 s per stage) stopped stage 'kc-k1a' at step 0 of 1")
    assert f"finished stages kept in {out}: none; continue with: dllm train " in last
    command = shlex.split(last.split("continue with: ")[1])
    assert command[:2] == ["dllm", "train"] and "--resume" in command and "--init-from" not in command
    assert main([*command[2:], "--no-progress", "--threads", "1", "--no-export"]) == 0
    captured = capsys.readouterr()
    assert json.loads(captured.out.splitlines()[-1])["finished"] == ["kc-k1a", "kc-k1b"]
    assert "not finished" not in captured.err  # a run that finished ends with its summary
