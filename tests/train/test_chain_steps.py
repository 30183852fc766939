"""``--steps N`` in a chain (``dllm/train/runner.py``): every stage's schedule horizon, so a stage trains to N (or
to its own ``stop_at`` when that comes first) and is finished there: stage.json written, the chain goes on, a
resume keeps it. Not a time limit."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from dllm.train.__main__ import build_parser, main, overrides
from dllm.train.recipes import curricula
from dllm.train.runner import RunOptions, stage_end


def _end(recipe: str, stage: str, *flags: str) -> int:
    args = build_parser().parse_args(["--recipe", recipe, *flags])
    opts = RunOptions(out=Path("unused"), max_steps=args.max_steps)
    return stage_end(curricula.get(recipe).stage(stage), opts, overrides(args))


def test_steps_sets_where_each_stage_ends():
    assert _end("tiny-llada-long", "kc-k1b") == 600  # its stop_at, horizon 2000
    assert _end("tiny-llada-long", "kc-k1b", "--steps", "100") == 100  # the horizon comes first
    assert _end("tiny-llada-long", "kc-k1b", "--steps", "1000") == 600  # the stop_at comes first
    assert _end("tiny-llada-long", "kc-k1b", "--steps", "100", "--max-steps", "7") == 7
    assert _end("tiny-llada", "tiny-llada", "--steps", "30000") == 30000  # a longer horizon: trained to it


def test_dry_run_plans_the_steps_horizon(capsys: pytest.CaptureFixture[str]):
    assert main(["--recipe", "tiny-llada-long", "--from-stage", "kc-k1a", "--until-stage", "kc-k1b", "--init-from",
                 "tiny-llada-long", "--steps", "3", "--dry-run", "--out", "unused"]) == 0
    out = capsys.readouterr().out
    assert "kc-k1a: from tiny-llada-long; steps 3, " in out
    assert "kc-k1b: from kc-k1a/checkpoint-0000003; steps 3, " in out
    assert "export: kc-k1b/checkpoint-0000003 ->" in out


def test_chain_stages_finish_at_the_steps_horizon(tmp_path: Path, capsys: pytest.CaptureFixture[str]):
    argv = ["--recipe", "tiny-llada-long", "--from-stage", "kc-k1a", "--until-stage", "kc-k1b", "--init-from",
            "tiny-llada-long", "--steps", "2", "--batch-size", "4", "--out", str(tmp_path), "--no-progress",
            "--threads", "1", "--no-export"]
    assert main(argv) == 0
    captured = capsys.readouterr()
    summary = json.loads(captured.out.strip().splitlines()[-1])
    assert summary["finished"] == ["kc-k1a", "kc-k1b"] and summary["step"] == 2
    assert "time limit" not in captured.err
    assert "kc-k1a: steps 2 (horizon 2 set by --steps; the stage's own: steps 600)" in captured.err
    first = json.loads((tmp_path / "kc-k1a" / "stage.json").read_text())
    second = json.loads((tmp_path / "kc-k1b" / "stage.json").read_text())
    assert first["step"] == 2 and first["taken"] == str(tmp_path / "kc-k1a" / "checkpoint-0000002")
    assert second["step"] == 2 and second["init_from"] == first["taken"]
    assert main([*argv, "--resume"]) == 0  # both finished: kept, nothing retrained
    err = capsys.readouterr().err
    assert "kc-k1a: finished (kept)" in err and "kc-k1b: finished (kept)" in err
    assert [p.name for p in sorted((tmp_path / "kc-k1b").glob("checkpoint-*"))] == ["checkpoint-0000002"]
