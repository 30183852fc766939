"""``dllm train``'s flags: every flag a recipe is given is honoured or refused by name (exit status 2,
nothing loaded or written), and bad values are argparse errors."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from dllm.train.__main__ import main
from tests.train.helpers import small_recipe


def _refused(argv: list[str], capsys: pytest.CaptureFixture[str], entry=main) -> str:
    """The argparse error ``entry(argv)`` exits with (status 2)."""
    with pytest.raises(SystemExit) as exc:
        entry(argv)
    assert exc.value.code == 2
    return capsys.readouterr().err.strip().splitlines()[-1]


def test_max_steps_stops_a_drafter_recipe(tmp_path: Path, capsys: pytest.CaptureFixture[str]):
    """--max-steps 2 of a 20-step DFlash run: 2 steps, then the drafter reached is evaluated and saved
    (--tiny: 16 regenerated rows, so it takes seconds); the schedule's horizon stays 20."""
    argv = ["--recipe", "tiny-ar-dflash", "--tiny", "--max-steps", "2", "--steps", "20", "--log-every", "1",
            "--out", str(tmp_path), "--threads", "1", "--no-progress"]
    assert main(argv) == 0
    summary = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert summary["step"] == 2 and summary["tau_teacher_forced"] >= 1.0
    lines = [json.loads(line) for line in (tmp_path / "log.jsonl").read_text().splitlines()]
    assert [r["step"] for r in lines if "loss" in r] == [1, 2]
    assert lines[0]["pool"] == 16  # --tiny
    record = json.loads((tmp_path / "final" / "training.json").read_text())
    assert record["evaluation"]["step"] == 2 and record["recipe"]["steps"] == 20 and record["recipe"]["log_every"] == 1


def test_time_limit_stops_a_drafter_run_after_one_step(tmp_path: Path):
    from dllm.train.ar import ar_recipes, build_ar_model
    from dllm.train.drafters.dflash_train import dflash_recipes, train_dflash

    base = ar_recipes.get("tiny-ar")  # a 2-layer d32 target, untrained
    target = build_ar_model(base.with_overrides(model=dict(base.model, num_hidden_layers=2, hidden_size=32,
                                                           intermediate_size=64, num_attention_heads=2,
                                                           num_key_value_heads=1, head_dim=16))).eval()
    recipe = dflash_recipes.get("tiny-ar-dflash").with_overrides(
        steps=50, pool=4, batch_size=2, eval_examples=1, log_every=10, num_layers=1, block_size=4,
        target_layer_ids=(0, 1))
    result = train_dflash(recipe, tmp_path, target=target, progress=False, time_limit=1e-9)
    assert result["step"] == 1  # the first step ends past the limit: its line is logged, the drafter saved
    lines = [json.loads(line) for line in (tmp_path / "log.jsonl").read_text().splitlines()]
    assert [r["step"] for r in lines if "loss" in r] == [1] and (tmp_path / "final" / "config.json").is_file()
    with pytest.raises(ValueError, match="stop_at must be an integer >= 1"):
        train_dflash(recipe, tmp_path / "no", target=target, stop_at=0)
    assert not (tmp_path / "no").exists()  # refused before anything is written


@pytest.mark.parametrize("recipe, flags, refused", [
    ("tiny-ar-dflash", ["--resume", "--no-export"], "--resume, --no-export"),
    ("tiny-ar-dflash", ["--save-every", "5"], "--save-every"),
    ("tiny-ar-dflash", ["--eval-every", "5"], "--eval-every"),
    ("tiny-ar-dflash", ["--init-from", "tiny-ar-dflash"], "--init-from"),
    ("tiny-ar-dflare", ["--from-stage", "x"], "--from-stage"),
    ("tiny-ar-jetspec", ["--start-phase", "1"], "--start-phase"),
    ("tiny-ar-dspark", ["--bf16"], "--bf16"),
    ("tiny-ar", ["--time-limit", "5", "--target", "tiny-ar"], "--time-limit, --target"),
    ("tiny-ar", ["--tiny"], "--tiny"),
    ("learn2pd-tiny", ["--max-steps", "2"], "--max-steps"),
    ("tiny-llada", ["--target", "tiny-ar"], "--target"),
])
def test_a_flag_a_recipe_does_not_take_is_refused(recipe: str, flags: list[str], refused: str,
                                                  capsys: pytest.CaptureFixture[str]):
    err = _refused(["--recipe", recipe, *flags, "--dry-run"], capsys)  # (without the check: a silent dry run)
    assert err.startswith(f"dllm train: error: {refused}: not taken by recipe {recipe!r}")
    assert "; it takes --" in err and "--dry-run" in err


def test_the_flags_a_drafter_or_ar_recipe_takes_reach_its_recipe(capsys: pytest.CaptureFixture[str]):
    assert main(["--recipe", "tiny-ar-dflash", "--tiny", "--batch-size", "2", "--log-every", "3", "--dry-run"]) == 0
    recipe = json.loads(capsys.readouterr().out.splitlines()[-1])
    assert (recipe["pool"], recipe["batch_size"], recipe["eval_examples"], recipe["log_every"]) == (16, 2, 1, 3)
    assert main(["--recipe", "tiny-ar-jetspec", "--init-from", "some/dflash", "--dry-run"]) == 0
    assert json.loads(capsys.readouterr().out.splitlines()[-1])["init_from"] == "some/dflash"
    assert main(["--recipe", "tiny-ar-dspark", "--init-from", "some/dflash", "--dry-run"]) == 0
    assert json.loads(capsys.readouterr().out.splitlines()[-1])["init"] == "some/dflash"
    assert main(["--recipe", "tiny-ar", "--log-every", "3", "--eval-per-size", "2", "--max-steps", "2",
                 "--dry-run"]) == 0
    plan, recipe = capsys.readouterr().out.splitlines()
    assert plan == "recipe tiny-ar: one run of dllm/train/ar.py, stopped after 2 steps"
    assert (json.loads(recipe)["log_every"], json.loads(recipe)["eval_per_size"]) == (3, 2)


@pytest.mark.parametrize("flag, value, message", [
    ("--log-every", "0", "must be an integer >= 1, got 0"),
    ("--save-every", "-1", "must be an integer >= 0, got -1"),
    ("--eval-every", "-1", "must be an integer >= 0, got -1"),
    ("--steps", "-5", "must be an integer >= 1, got -5"),
    ("--steps", "0", "must be an integer >= 1, got 0"),
    ("--max-steps", "0", "must be an integer >= 1, got 0"),
    ("--threads", "-1", "must be an integer >= 0, got -1"),
    ("--start-phase", "-1", "must be an integer >= 0, got -1"),
    ("--time-limit", "0", "must be a number of seconds > 0, got '0'"),
    ("--time-limit", "nan", "must be a number of seconds > 0, got 'nan'"),
    ("--batch-size", "0", "must be an integer >= 1, got 0"),
    ("--warmup", "-5", "must be an integer >= 0, got -5"),
    ("--lr", "-1", "must be a number > 0, got '-1'"),
    ("--lr", "inf", "must be a number > 0, got 'inf'"),
    ("--eval-per-size", "0", "must be an integer >= 1, got 0"),
    ("--d-model", "0", "must be an integer >= 1, got 0"),
])
def test_bad_counts_are_argparse_errors(flag: str, value: str, message: str, capsys: pytest.CaptureFixture[str]):
    recipe = "tiny-ar" if flag == "--start-phase" else "tiny-llada"
    err = _refused(["--recipe", recipe, flag, value, "--dry-run"], capsys)
    assert err == f"dllm train: error: argument {flag}{'/--stop-at' if flag == '--max-steps' else ''}: {message}"


def test_zero_keeps_its_documented_meaning(capsys: pytest.CaptureFixture[str]):
    assert main(["--recipe", "tiny-llada", "--save-every", "0", "--eval-every", "0", "--threads", "0",
                 "--dry-run"]) == 0  # 0: at the end / never / torch's default


def test_a_bad_device_is_refused_before_anything_is_written(tmp_path: Path, capsys: pytest.CaptureFixture[str]):
    out = tmp_path / "run"
    argv = ["--recipe", "tiny-llada", "--tiny", "--max-steps", "2", "--out", str(out), "--no-progress"]
    err = _refused([*argv, "--device", "bogus"], capsys)
    assert err.startswith("dllm train: error: argument --device: device 'bogus' is not a device name; "
                          "available devices: cpu")
    assert not out.exists()  # no plan.json: the next run into --out is not refused
    from dllm.train.recipes import curricula
    from dllm.train.runner import RunOptions, run

    with pytest.raises(ValueError, match="device 'bogus' is not a device name"):
        run(curricula.get("tiny-llada"), RunOptions(out=out, device="bogus"))
    assert not out.exists()


def test_a_cpu_only_recipe_refuses_another_device(monkeypatch, capsys: pytest.CaptureFixture[str]):
    import dllm.models.loading as loading

    monkeypatch.setattr(loading, "resolve_device", torch.device)  # as if this machine had a GPU
    err = _refused(["--recipe", "tiny-ar-dflash", "--device", "cuda:0", "--dry-run"], capsys)
    assert err == ("dllm train: error: --device cuda:0: recipe 'tiny-ar-dflash' (a drafter run) trains on the CPU "
                   "only; pass --device cpu or leave it out")
    assert main(["--recipe", "tiny-ar-dflash", "--device", "cpu", "--dry-run"]) == 0


def test_the_trainer_and_the_runner_refuse_intervals_below_one(tmp_path: Path):
    from dllm.train.recipes import curricula
    from dllm.train.runner import RunOptions, run
    from dllm.train.trainer import Trainer

    for field, value, low in (("log_every", 0, 1), ("steps", 0, 1), ("save_every", -1, 0)):
        with pytest.raises(ValueError, match=f"{field} must be an integer >= {low}, got {value}"):
            Trainer(small_recipe(**{field: value}), "unused", progress=False)
    with pytest.raises(ValueError, match="log_every must be an integer >= 1, got 0"):
        run(curricula.get("tiny-llada"), RunOptions(out=tmp_path / "run"), lambda r: r.with_overrides(log_every=0))
    assert not (tmp_path / "run").exists()  # refused before plan.json


@pytest.mark.parametrize("field, value, message", [
    ("batch_size", 0, "batch_size must be an integer >= 1, got 0"),
    ("warmup", -5, "warmup must be an integer >= 0, got -5"),
    ("lr", -1.0, "lr must be a finite number > 0, got -1.0"),
    ("min_lr_ratio", 1.5, "min_lr_ratio must be"),
    ("mask_eps", 0.0, "mask_eps must be"),
])
def test_the_trainer_and_the_plan_refuse_bad_rates_and_sizes(tmp_path: Path, field: str, value, message: str):
    from dllm.train.recipes import curricula
    from dllm.train.runner import RunOptions, plan, run
    from dllm.train.trainer import Trainer

    with pytest.raises(ValueError, match=message):
        Trainer(small_recipe(**{field: value}), tmp_path / "trainer", progress=False)
    override = lambda r: r.with_overrides(**{field: value})  # noqa: E731
    with pytest.raises(ValueError, match=message):  # the dry run's plan too, not only the run
        plan(curricula.get("tiny-llada"), RunOptions(out=tmp_path / "run"), override)
    with pytest.raises(ValueError, match=message):
        run(curricula.get("tiny-llada"), RunOptions(out=tmp_path / "run"), override)
    assert not (tmp_path / "run").exists() and not (tmp_path / "trainer").exists()


@pytest.mark.parametrize("command", ["path_head_train", "block_head_train"])
@pytest.mark.parametrize("threads", ["0", "-1"])
def test_head_trainers_refuse_threads_below_one(command: str, threads: str, capsys: pytest.CaptureFixture[str]):
    import importlib

    entry = importlib.import_module(f"dllm.train.drafters.{command}").main
    err = _refused(["--threads", threads], capsys, entry)
    assert err.endswith(f"error: argument --threads: must be an integer >= 1, got {threads}")


def _overridden(argv: list[str]):
    """tiny-dream's recipe (three phases) as ``argv``'s overrides make it."""
    from dllm.train.__main__ import build_parser, overrides
    from dllm.train.recipes import get_recipe

    return overrides(build_parser().parse_args(["--recipe", "tiny-dream", *argv]))(get_recipe("tiny-dream"))


def test_tasks_restricts_every_phase_and_keeps_the_schedule():
    """--tasks copy,sort_num on tiny-dream: its two later phases stay (their start, lr, warm-up, horizon),
    each phase trains the two tasks at that phase's weights (the old code dropped the phases: the run
    trained 24,000 steps at phase 0's cosine)."""
    full, r = _overridden([]), _overridden(["--tasks", "copy, sort_num"])
    assert len(full.train.phases) == 2
    assert [(p.start, p.lr, p.warmup, p.horizon) for p in r.train.phases] == \
        [(p.start, p.lr, p.warmup, p.horizon) for p in full.train.phases]
    for mine, theirs in zip((r.train.mixture, *(p.mixture for p in r.train.phases)),
                            (full.train.mixture, *(p.mixture for p in full.train.phases))):
        assert mine.task_names() == ("copy", "sort_num")
        weight = dict(zip(theirs.task_names(), theirs.weights))
        assert mine.weights == (weight["copy"], weight["sort_num"])
    assert r.train.phases[1].mixture.weights[1] > r.train.mixture.weights[1]  # the sort_num phase is kept
    assert len(_overridden(["--tasks", "copy", "--steps", "12000"]).train.phases) == 1  # --steps still cuts


def test_tasks_a_phase_cannot_train_is_refused_by_name(capsys: pytest.CaptureFixture[str]):
    from dllm.train.recipes.base import Recipe
    from dllm.train.__main__ import build_parser, overrides
    from dllm.train.data import MixtureConfig
    from dllm.train.schedule import Phase

    recipe: Recipe = small_recipe(steps=20, phases=(Phase(10, MixtureConfig(tasks=("sort",)), lr=1e-3),))
    apply = overrides(build_parser().parse_args(["--recipe", "tiny-llada", "--tasks", "copy"]))
    with pytest.raises(ValueError, match=r"--tasks copy: recipe 'tiny-llada', its phase from step 10, trains none "
                                         r"of them \(its tasks: sort\); .* or --steps 10 to end before this phase"):
        apply(recipe)
    assert main(["--recipe", "tiny-llada", "--tasks", "lookup_long", "--dry-run"]) == 2
    assert "error: --tasks lookup_long: recipe 'tiny-llada' trains none of them" in capsys.readouterr().err
    assert main(["--recipe", "tiny-llada", "--tasks", "nope", "--dry-run"]) == 2
    assert "Unknown task 'nope'" in capsys.readouterr().err
