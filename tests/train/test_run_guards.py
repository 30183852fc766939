"""Fixes found reviewing the training package: the export's destination (``dllm/train/export.py``), the
evaluation's test instances (``--eval-per-size``), bad input to the single-run recipes (exit status 2, as the
chains), and where a chain's stage starts (``--from-stage``, ``--init-from``, a resume from another directory)."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

from dllm.train.__main__ import main
from dllm.train.export import export
from dllm.train.recipes import build_model, curricula
from dllm.train.runner import PLAN_FILE, RunOptions, first_init
from dllm.train.trainer import STATE_FILE

from tests.train.helpers import small_recipe

RUN = ["--no-progress", "--threads", "1", "--no-export"]
CHAIN = ["--recipe", "tiny-llada-long", "--max-steps", "2", "--batch-size", "4", *RUN]


def saved_checkpoint(directory: Path) -> Path:
    """A small llada model saved as ``directory`` (the official files a trainer checkpoint holds)."""
    build_model(small_recipe()).save_pretrained(directory)
    return directory


@pytest.mark.parametrize("name", ["", ".", "..", "a/b", "../elsewhere"])
def test_export_refuses_a_name_that_is_not_one_directory(tmp_path: Path, name: str):
    run = tmp_path / "run"
    saved_checkpoint(run / "checkpoint-0000001")
    root = tmp_path / "package" / "embedded"
    (root / "tiny-llada").mkdir(parents=True)  # an exported model the old code removed with the root
    with pytest.raises(ValueError, match="must be one directory name"):
        export(run, name, "checkpoint-0000001", root=root)
    assert (root / "tiny-llada").is_dir() and not (tmp_path / "package" / "a").exists()
    assert not (tmp_path / "elsewhere").exists()


def test_export_refuses_a_checkpoint_inside_the_model_it_replaces(tmp_path: Path):
    run = tmp_path / "embedded" / "mine"
    src = saved_checkpoint(run / "checkpoint-0000001")
    with pytest.raises(ValueError, match="which the export replaces"):
        export(run, "mine", "checkpoint-0000001", root=tmp_path / "embedded")
    assert (src / "model.safetensors").is_file()  # not removed before it was read


def test_eval_per_size_past_the_test_split_is_refused_before_anything_is_written(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]):
    argv = ["--recipe", "tiny-llada", "--tiny", "--max-steps", "2", "--eval-every", "1", "--tasks", "copy",
            "--eval-per-size", "51", "--out", str(tmp_path / "run"), *RUN]
    assert main([*argv, "--dry-run"]) == 2
    assert main(argv) == 2
    assert "eval_per_size must be an integer in [1, 50]" in capsys.readouterr().err
    assert not (tmp_path / "run" / PLAN_FILE).exists()  # refused before plan.json and the first step
    # the AR recipes scored instances 50.. of each size, prompts their training may draw
    with pytest.raises(ValueError, match=re.escape("eval_per_size must be an integer in [1, 50]")):
        main(["--recipe", "tiny-ar", "--eval-per-size", "51", "--dry-run"])
    assert main(["--recipe", "tiny-ar", "--eval-per-size", "50", "--dry-run"]) == 0


def test_python_m_dllm_train_refuses_bad_input_as_dllm_train_does():
    """``python -m dllm.train`` is ``dllm train recipe``: one error line and exit status 2, not a traceback."""
    done = subprocess.run([sys.executable, "-m", "dllm.train", "--recipe", "tiny-ar", "--start-phase", "5",
                           "--dry-run"], capture_output=True, text=True, timeout=120)
    assert done.returncode == 2 and "Traceback" not in done.stderr
    assert "python -m dllm.train: error: start_phase must be an integer in [0, 1]" in done.stderr


def test_an_init_from_that_names_no_model_is_refused_before_plan_json(tmp_path: Path,
                                                                        capsys: pytest.CaptureFixture[str]):
    out = tmp_path / "run"
    argv = [*CHAIN, "--from-stage", "kc-k1a", "--until-stage", "kc-k1a", "--out", str(out)]
    assert main([*argv, "--init-from", str(tmp_path / "typo")]) == 2
    assert "(--init-from): cannot load" in capsys.readouterr().err
    assert not (out / PLAN_FILE).exists()  # so the corrected run needs no --resume


def test_from_stage_starts_only_from_a_finished_previous_stage(tmp_path: Path,
                                                               capsys: pytest.CaptureFixture[str]):
    out = tmp_path / "run"
    unfinished = out / "kc-k1a" / "checkpoint-0000001"  # stage kc-k1a stopped after 1 of its 2 steps
    unfinished.mkdir(parents=True)
    (unfinished / STATE_FILE).write_bytes(b"")
    assert main([*CHAIN, "--from-stage", "kc-k1b", "--until-stage", "kc-k1b", "--out", str(out)]) == 2
    err = capsys.readouterr().err
    assert "starts from stage 'kc-k1a', which is not finished" in err and "checkpoint-0000001 of 2 steps" in err
    assert not (out / PLAN_FILE).exists()
    end = out / "kc-k1a" / "checkpoint-0000002"  # finished: stage.json (written in another directory)
    end.mkdir()
    (end / STATE_FILE).write_bytes(b"")
    (out / "kc-k1a" / "stage.json").write_text(json.dumps({"step": 2, "taken": "old/kc-k1a/checkpoint-0000002"}))
    opts = RunOptions(out=out, max_steps=2, from_stage="kc-k1b")
    assert first_init(curricula.get("tiny-llada-long"), opts) == str(end)


def test_dry_run_names_the_checkpoint_the_previous_stage_ends_at(capsys: pytest.CaptureFixture[str]):
    assert main(["--recipe", "tiny-llada-long", "--from-stage", "kc-k1b", "--until-stage", "kc-k1b",
                 "--max-steps", "3", "--dry-run", "--out", "unused"]) == 0
    assert "kc-k1b: from kc-k1a/checkpoint-0000003; steps 3 of 2000" in capsys.readouterr().out


def test_dry_run_from_stage_names_the_checkpoint_the_run_starts_from(tmp_path: Path,
                                                                     capsys: pytest.CaptureFixture[str]):
    """tiny-llada takes ``best``; a 1-step stage has none, so the run takes its newest checkpoint: the dry run
    of the next stage named ``tiny-llada/best``."""
    argv = ["--recipe", "tiny-llada-long", "--tiny", "--max-steps", "1", *RUN, "--out", str(tmp_path)]
    assert main([*argv, "--until-stage", "tiny-llada"]) == 0
    capsys.readouterr()
    later = [*argv, "--from-stage", "length", "--until-stage", "length", "--resume"]
    assert main([*later, "--dry-run"]) == 0
    planned = re.search(r" length: from (\S+);", capsys.readouterr().out)
    assert main(later) == 0
    used = re.search(r"\] length: steps .*, from (\S+)$", capsys.readouterr().err, re.M)
    assert planned is not None and used is not None
    assert planned.group(1) == used.group(1) == str(tmp_path / "tiny-llada" / "checkpoint-0000001")


def test_a_resume_from_another_working_directory_continues_from_the_finished_stage(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]):
    first, elsewhere = tmp_path / "first", tmp_path / "elsewhere"
    first.mkdir(), elsewhere.mkdir()
    argv = [*CHAIN, "--from-stage", "kc-k1a", "--init-from", "tiny-llada-long"]
    monkeypatch.chdir(first)
    assert main([*argv, "--until-stage", "kc-k1a", "--out", "rel"]) == 0  # stage.json: taken 'rel/kc-k1a/...'
    monkeypatch.chdir(elsewhere)
    assert main([*argv, "--until-stage", "kc-k1b", "--out", str(first / "rel"), "--resume"]) == 0
    assert "kc-k1a: finished (kept)" in capsys.readouterr().err
    record = json.loads((first / "rel" / "kc-k1b" / "stage.json").read_text())
    assert record["init_from"] == str(first / "rel" / "kc-k1a" / "checkpoint-0000002")
