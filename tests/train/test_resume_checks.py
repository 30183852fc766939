"""``dllm train --resume`` continues the same training: the flags that change it (``TRAINING_FLAGS`` of
dllm/train/plan_file.py) are recorded in ``OUT/plan.json`` and a resume giving others is refused by name."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from dllm.train import trainer as trainer_module
from dllm.train.__main__ import main
from dllm.train.runner import PLAN_FILE

RUN = ["--recipe", "tiny-llada", "--tiny", "--max-steps", "2", "--no-export", "--no-progress", "--threads", "1"]


def interrupted_run(out: Path, monkeypatch: pytest.MonkeyPatch, *flags: str) -> None:
    """tiny-llada (2 steps, a checkpoint each step) stopped by Ctrl-C after its first step."""
    real = trainer_module.Trainer.train

    def one_step_then_ctrl_c(self, *args, **kwargs):
        real(self, stop_at=1)
        raise KeyboardInterrupt

    monkeypatch.setattr(trainer_module.Trainer, "train", one_step_then_ctrl_c)
    assert main([*RUN, "--save-every", "1", "--out", str(out), *flags]) == 130
    monkeypatch.setattr(trainer_module.Trainer, "train", real)
    assert (out / "tiny-llada" / "checkpoint-0000001").is_dir()
    assert not (out / "tiny-llada" / "stage.json").exists()


def events(out: Path) -> list[dict]:
    lines = (out / "tiny-llada" / "log.jsonl").read_text().splitlines()
    return [e for e in map(json.loads, lines) if "event" in e]


@pytest.fixture(scope="module")
def started(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A finished first run with --lr and --tasks (the refused resumes below write nothing into it)."""
    out = tmp_path_factory.mktemp("run")
    assert main([*RUN, "--lr", "0.01", "--tasks", "copy,reverse", "--out", str(out)]) == 0
    return out


@pytest.mark.parametrize("resume, message", [
    (["--lr", "0.02", "--tasks", "copy,reverse"],
     "--lr: the run was started with --lr 0.01, this resume gives --lr 0.02"),
    (["--lr", "0.01", "--tasks", "copy"], "--tasks: the run was started with --tasks copy,reverse, this resume gives "
                                          "--tasks copy"),
    (["--tasks", "copy,reverse"], "--lr: the run was started with --lr 0.01, this resume gives no --lr"),
    (["--lr", "0.01", "--tasks", "copy,reverse", "--seed", "0"],
     "--seed: the run was started with no --seed, this resume gives --seed 0"),
], ids=["lr", "tasks", "lr left out", "seed added"])
def test_a_resume_with_other_training_flags_is_refused_by_name(started: Path, resume: list[str], message: str,
                                                               capsys: pytest.CaptureFixture[str]):
    capsys.readouterr()
    plan, log = (started / PLAN_FILE).read_text(), (started / "tiny-llada" / "log.jsonl").read_text()
    assert main([*RUN, "--out", str(started), "--resume", *resume]) == 2
    err = capsys.readouterr().err
    assert message in err and str(started / PLAN_FILE) in err
    assert (started / PLAN_FILE).read_text() == plan  # nothing written, nothing trained
    assert (started / "tiny-llada" / "log.jsonl").read_text() == log


def test_leaving_out_tiny_is_refused(started: Path, capsys: pytest.CaptureFixture[str]):
    argv = [a for a in RUN if a != "--tiny"]
    assert main([*argv, "--lr", "0.01", "--tasks", "copy,reverse", "--out", str(started), "--resume"]) == 2
    assert "--tiny: the run was started with --tiny, this resume gives no --tiny" in capsys.readouterr().err


def test_a_resume_with_the_same_training_flags_continues(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                        capsys: pytest.CaptureFixture[str]):
    interrupted_run(tmp_path, monkeypatch, "--lr", "0.01", "--tasks", "copy,reverse")
    assert json.loads((tmp_path / PLAN_FILE).read_text())["flags"] == {
        "--tiny": True, "--tasks": "copy,reverse", "--lr": 0.01}
    # the same values spelled otherwise, and flags free to change on a resume (logging, checkpoints, evaluation)
    assert main([*RUN, "--out", str(tmp_path), "--resume", "--tasks", "copy, reverse", "--lr", "1e-2",
                 "--log-every", "2", "--save-every", "0", "--eval-every", "0"]) == 0
    assert json.loads(capsys.readouterr().out.strip().splitlines()[-1])["step"] == 2
    assert any(e.get("event") == "resume" and e["step"] == 1 for e in events(tmp_path))


def test_a_run_folder_without_recorded_flags_resumes_and_records_them(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                                      capsys: pytest.CaptureFixture[str]):
    interrupted_run(tmp_path, monkeypatch, "--lr", "0.01")
    plan = json.loads((tmp_path / PLAN_FILE).read_text())
    del plan["flags"]  # as dllm wrote plan.json before the flags were recorded
    (tmp_path / PLAN_FILE).write_text(json.dumps(plan))
    capsys.readouterr()
    assert main([*RUN, "--out", str(tmp_path), "--resume", "--lr", "0.02"]) == 0  # unchecked: nothing recorded
    assert "records no training flags" in capsys.readouterr().err
    assert any(e.get("event") == "resume" and e["step"] == 1 for e in events(tmp_path))
    assert json.loads((tmp_path / PLAN_FILE).read_text())["flags"] == {"--tiny": True, "--lr": 0.02}
    assert main([*RUN, "--out", str(tmp_path), "--resume", "--lr", "0.01"]) == 2  # now the next resume is checked
    assert "this resume gives --lr 0.01" in capsys.readouterr().err


def test_check_flags_tells_a_zero_from_a_flag_left_out(tmp_path: Path):
    from dllm.train.runner import check_flags

    check_flags(tmp_path, {"--seed": 0, "--bf16": True}, {"--bf16": True, "--seed": 0})
    both = ("--bf16: the run was started with --bf16, this resume gives no --bf16; "
            "--seed: the run was started with no --seed, this resume gives --seed 0)")
    with pytest.raises(ValueError, match=re.escape(both)):
        check_flags(tmp_path, {"--bf16": True}, {"--seed": 0})
