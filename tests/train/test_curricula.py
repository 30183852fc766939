"""The shipped models' recipes (dllm/train/recipes/): every chain plans, its last stage is what the shipped
checkpoint's training.json records, and the runner trains, resumes, exports and stops cleanly."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from dataclasses import asdict, fields
from pathlib import Path

import pytest

from dllm.models import load
from dllm.train.__main__ import main
from dllm.train.runner import RunOptions, stage_recipe

EMBEDDED = Path(__file__).resolve().parents[2] / "dllm" / "models" / "embedded"
SHIPPED = ("tiny-llada", "tiny-dream", "tiny-llada-long", "tiny-dream-long", "tiny-sdar")
ALL = (*SHIPPED, "tiny-llada-long-gpu", "tiny-dream-long-gpu")


def chains():
    """The registry, loaded inside the tests: loading it registers the training-only tasks, which the
    task tests collected before these must not see."""
    from dllm.train.recipes import curricula

    return curricula
AS_RUN = ("threads", "device")  # execution settings, not the recipe (float sums differ by thread count)


def recorded(name: str) -> dict:
    return json.loads((EMBEDDED / name / "training.json").read_text())


def same(ours, theirs, where: str = "") -> list[str]:
    """Differences between our record and the shipped one; a key the shipped record lacks (a field added
    after it was trained) must hold its default (None)."""
    if isinstance(ours, dict) and isinstance(theirs, dict):
        out = []
        for k in ours.keys() | theirs.keys():
            if k not in theirs and ours[k] is None:
                continue
            out += same(ours.get(k), theirs.get(k), f"{where}.{k}")
        return out
    if isinstance(ours, list) and isinstance(theirs, list) and len(ours) == len(theirs):
        return [d for i, (a, b) in enumerate(zip(ours, theirs)) for d in same(a, b, f"{where}[{i}]")]
    return [] if ours == theirs else [f"{where}: ours {str(ours)[:60]} != shipped {str(theirs)[:60]}"]


@pytest.mark.slow  # seconds: the default run leaves it to -m slow (CI runs both)
def test_import_registers_no_task_and_every_recipe_is_listed():
    code = ("import re, dllm.train, dllm.train.runner, dllm.train.__main__, dllm.tasks as T; "
            "print([n for n in T.tasks.names() if re.fullmatch('(lookup_k|count_c)[0-9]+', n)])")
    done = subprocess.run([sys.executable, "-c", code],
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0 and done.stdout.strip() == "[]", done.stderr[-2000:]
    assert sorted(chains().names()) == sorted(ALL)


@pytest.mark.parametrize("name", ALL)
def test_every_recipe_plans(name: str, capsys: pytest.CaptureFixture[str]):
    assert main(["--recipe", name, "--dry-run", "--out", "unused"]) == 0
    lines = capsys.readouterr().out.splitlines()
    cur = chains().get(name)
    numbered = [line for line in lines if re.match(r"\s*\d+\. ", line)]
    assert [line.split(".", 1)[1].split(":")[0].strip() for line in numbered] == [s.name for s in cur.stages]
    assert lines[-1].startswith(f"export: {cur.stages[-1].name}/{cur.stages[-1].source()} -> unused/export/{name}")


@pytest.mark.parametrize("name", SHIPPED)
def test_plan_matches_the_shipped_training_record(name: str):
    """The last stage as the runner trains it (its recipe, its take) is the shipped checkpoint's record;
    where the record names the run directories (``runs/<stage>/checkpoint-N``), the stage names and steps
    of the chain are those."""
    cur, info = chains().get(name), recorded(name)
    last = cur.stages[-1]
    recipe = stage_recipe(last, RunOptions(out=Path("unused")), init=None)
    ours = json.loads(json.dumps({"family": recipe.family, "model": recipe.model, "train": asdict(recipe.train)}))
    theirs = {k: info["recipe"][k] for k in ("family", "model", "train")}
    for key in AS_RUN:
        ours["train"].pop(key), theirs["train"].pop(key)
    assert same(ours, theirs) == []
    run_dir, taken = info["source"].split("/")[-2:]
    assert taken == last.source()
    if name.endswith("-long"):  # runs/<stage>/checkpoint-N
        assert run_dir == last.name
        init = re.fullmatch(r"(?:.*/)?([^/]+)/(checkpoint-\d+)", info["recipe"]["init_from"] or "")
        if init:  # the previous stage and the step it was taken at
            assert (cur.stages[-2].name, cur.stages[-2].source()) == init.groups()
    assert info["dtype"] == cur.export_dtype


@pytest.mark.parametrize("name", ["tiny-ar", "tiny-ar-draft", "tiny-ar-dflash", "tiny-ar-dflash-mixed",
                                  "tiny-ar-dflash-wide", "tiny-ar-dflare", "tiny-ar-jetspec", "tiny-ar-dspark"])
def test_speculative_recipes_match_their_shipped_record(name: str, capsys: pytest.CaptureFixture[str]):
    assert main(["--recipe", name, "--dry-run"]) == 0
    ours = json.loads(capsys.readouterr().out.splitlines()[-1])
    theirs = recorded(name)["recipe"]
    assert {k: ours[k] for k in theirs} == theirs  # fields added later than the run hold their defaults


def test_long_chains_continue_one_another():
    """Every stage after the first of a chain starts from the previous one (no init of its own), and the
    model changes only where the recipe says so (vocabulary at ``length``, RoPE base at rt-1 / rd-k1)."""
    for name in ("tiny-llada-long", "tiny-dream-long"):
        cur = chains().get(name)
        assert all(s.recipe.init_from is None for s in cur.stages)
        thetas = [s.recipe.model["rope_theta"] for s in cur.stages]
        assert thetas[0] == 1e4 and thetas[-1] == 1e6 and thetas == sorted(thetas)
        assert [s.recipe.model["vocab_size"] for s in cur.stages[:2]] == [80, 88]
        assert {s.recipe.family for s in cur.stages} == {cur.stages[0].recipe.family}


def test_mixture_specs_are_checked():
    from dllm.train.recipes.stages import mixture

    mix = mixture("count_c4:1:4:12", "lookup_long:0.5:4:6")
    assert mix.task_names() == ("count_c4", "lookup_long") and mix.sizes[1] == (4, 5, 6)
    with pytest.raises(ValueError, match="'copy:1:4': expected TASK:WEIGHT:LO:HI"):
        mixture("copy:1:4")
    with pytest.raises(ValueError, match="the size range 9..4 is empty"):
        mixture("count_c4:1:9:4")
    with pytest.raises(ValueError, match="lookup_k3: key width 3 has no curriculum variant"):
        mixture("lookup_k3:1:4:8")


def test_bad_options_are_refused(tmp_path: Path, capsys: pytest.CaptureFixture[str]):
    assert main(["--recipe", "tiny-llada-long", "--dry-run", "--from-stage", "nope"]) == 2
    assert "has no stage 'nope'; valid: tiny-llada, length, kc-k1a" in capsys.readouterr().err
    with pytest.raises(SystemExit) as exc:  # an argparse error: tests/train/test_cli_flags.py has the others
        main(["--recipe", "tiny-llada-long", "--dry-run", "--max-steps", "0"])
    assert exc.value.code == 2 and "--max-steps/--stop-at: must be an integer >= 1, got 0" in capsys.readouterr().err
    assert main(["--recipe", "tiny-llada-long", "--dry-run", "--from-stage", "cc-2", "--until-stage", "cc-1"]) == 2
    assert "comes before" in capsys.readouterr().err
    assert main(["--recipe", "tiny-llada-long", "--from-stage", "cc-2", "--out", str(tmp_path)]) == 2
    assert "starts from stage 'cc-1', which is not under" in capsys.readouterr().err
    assert not tmp_path.exists() or not any(tmp_path.iterdir())  # a refused start leaves nothing behind
    with pytest.raises(SystemExit):
        main(["--recipe", "no-such-recipe"])
    assert main(["--list-recipes"]) == 0
    assert set(SHIPPED) <= {line.split()[0] for line in capsys.readouterr().out.splitlines()}


def test_first_stage_smoke_run_exports_a_loadable_model(tmp_path: Path, capsys: pytest.CaptureFixture[str]):
    """tiny-llada's stage for 2 steps: a checkpoint, an export that dllm.load reads, resume rules."""
    argv = ["--recipe", "tiny-llada", "--max-steps", "2", "--out", str(tmp_path), "--no-progress", "--threads", "1"]
    assert main(argv) == 0
    summary = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert summary["step"] == 2 and summary["finished"] == ["tiny-llada"]
    ckpt = tmp_path / "tiny-llada" / "checkpoint-0000002"
    model = load(ckpt)
    assert model.family == "llada" and model.config.d_model == 128
    exported = load(summary["export"])
    assert all((a == b).all() for a, b in zip(model.state_dict().values(), exported.state_dict().values()))
    assert main(argv) == 2  # the directory holds a run: --resume or another --out
    assert "pass --resume" in capsys.readouterr().err
    assert main([*argv, "--resume"]) == 0  # finished: nothing retrained
    assert "tiny-llada: finished (kept)" in capsys.readouterr().err
    assert main([a for a in argv if a not in ("--max-steps", "2")] + ["--resume"]) == 2
    assert "'max_steps': 2" in capsys.readouterr().err  # a smoke run is not continued as a full one


def test_chain_passes_weights_on_and_ctrl_c_keeps_finished_stages(tmp_path: Path, monkeypatch,
                                                                 capsys: pytest.CaptureFixture[str]):
    from dllm.train import trainer as trainer_module

    argv = ["--recipe", "tiny-llada-long", "--from-stage", "kc-k1a", "--until-stage", "kc-k2", "--init-from",
            "tiny-llada-long", "--max-steps", "1", "--batch-size", "4", "--out", str(tmp_path), "--no-progress",
            "--threads", "1", "--no-export"]
    real = trainer_module.Trainer.train

    def interrupt_in_kc_k2(self, *a, **kw):
        if self.recipe.name.endswith("/kc-k2"):
            raise KeyboardInterrupt
        return real(self, *a, **kw)

    monkeypatch.setattr(trainer_module.Trainer, "train", interrupt_in_kc_k2)
    assert main(argv) == 130
    err = capsys.readouterr().err.strip().splitlines()
    assert err[-1].startswith("interrupted in stage 'kc-k2' at step 0") and "kc-k1a, kc-k1b" in err[-1]
    first = json.loads((tmp_path / "kc-k1a" / "stage.json").read_text())
    second = json.loads((tmp_path / "kc-k1b" / "stage.json").read_text())
    assert first["init_from"] == "tiny-llada-long" and second["init_from"] == first["taken"]
    assert second["taken"] == str(tmp_path / "kc-k1b" / "checkpoint-0000001")
    recipe = json.loads((tmp_path / "kc-k1b" / "recipe.json").read_text())
    assert recipe["init_from"] == first["taken"] and recipe["train"]["steps"] == 2000  # the schedule as run
    monkeypatch.setattr(trainer_module.Trainer, "train", real)
    assert main([*argv, "--resume"]) == 0  # the finished stages are kept, kc-k2 runs
    err = capsys.readouterr().err
    assert "kc-k1a: finished (kept)" in err and "kc-k1b: finished (kept)" in err
    assert json.loads((tmp_path / "kc-k2" / "stage.json").read_text())["init_from"] == second["taken"]


def test_stage_fields_are_typed_and_frozen():
    stage = chains().get("tiny-llada-long").stage("kc-k1b")
    assert stage.stop_at == 600 and stage.end == 600 and stage.recipe.train.steps == 2000
    with pytest.raises(Exception):
        stage.stop_at = 1  # frozen
    assert {f.name for f in fields(stage)} == {"name", "recipe", "stop_at", "take", "note"}


@pytest.mark.slow
def test_probe_scores_curriculum_cases(capsys: pytest.CaptureFixture[str]):
    """--probe: exact match on a narrow variant and a suite task; bad cases refused before any decoding."""
    assert main(["--probe", "tiny-llada-long", "count_c8:12", "lookup_long:4", "--n", "2"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert [line.split()[1] for line in lines] == ["count_c8:12", "lookup_long:4"]
    assert all(re.search(r": \d+\.\d% of 2$", line) for line in lines)
    for argv, message in ((["lookup_long:x"], "expected TASK:SIZE"), (["count_c8:4"], "out of range"),
                          (["nope:4"], "Unknown task 'nope'"), (["copy:4", "--n", "0"], "n must be an integer >= 1")):
        with pytest.raises(SystemExit):
            main(["--probe", "tiny-llada-long", *argv])
        assert message in capsys.readouterr().err


@pytest.mark.slow  # seconds: the default run leaves it to -m slow (CI runs both)
def test_time_limit_checkpoints_and_exports(tmp_path: Path, capsys: pytest.CaptureFixture[str]):
    """--time-limit: the step reached is checkpointed, the chain stops there and exports it."""
    assert main(["--recipe", "tiny-llada", "--tiny", "--eval-every", "0", "--time-limit", "2", "--out",
                 str(tmp_path), "--no-progress", "--threads", "1"]) == 0
    summary = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert summary["finished"] == [] and not (tmp_path / "tiny-llada" / "stage.json").exists()
    ckpt = sorted((tmp_path / "tiny-llada").glob("checkpoint-*"))[-1]
    assert 0 < summary["step"] < 23_000 and ckpt.name == f"checkpoint-{summary['step']:07d}"
    assert load(summary["export"]).config.d_model == 32


@pytest.mark.slow
def test_ctrl_c_in_a_subprocess(tmp_path: Path):
    """A real SIGINT: exit status 130, one line saying what is kept, the checkpoints stay."""
    import os
    import signal
    import time

    out = tmp_path / "run"
    cmd = [sys.executable, "-m", "dllm.train", "--recipe", "tiny-llada", "--tiny", "--eval-every", "0", "--save-every",
           "1", "--out", str(out), "--no-progress", "--threads", "1"]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env=dict(os.environ, HF_HUB_OFFLINE="1"),  # SIGINT as in a foreground terminal
                            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    try:
        deadline = time.monotonic() + 120
        def saved_two() -> bool:  # older checkpoints rotate out quickly: any of step >= 2 will do
            steps = [re.fullmatch(r"checkpoint-(\d+)", p.name) for p in (out / "tiny-llada").glob("checkpoint-*")]
            return any(m is not None and int(m.group(1)) >= 2 for m in steps)

        while not saved_two() and time.monotonic() < deadline:
            time.sleep(0.2)
        proc.send_signal(signal.SIGINT)
        _, err = proc.communicate(timeout=60)
    finally:
        proc.kill()
    assert proc.returncode == 130, err[-2000:]
    last = err.strip().splitlines()[-1]
    assert last.startswith("interrupted in stage 'tiny-llada' at step ") and last.endswith("continue with --resume")
    assert "Traceback" not in err
    assert list((out / "tiny-llada").glob("checkpoint-*"))


@pytest.mark.parametrize("drafter", ["tiny-ar-dflash", "tiny-ar-dflash-wide"])
def test_shipped_heads_match_their_trainers_recipes(drafter: str):
    """The path / block heads are single runs of python -m dllm.train.drafters.path_head_train / block_head_train:
    their recorded recipes are the trainers' defaults for that drafter (the block head: with the tree
    plans of its recorded command line)."""
    from dllm.train.drafters.block_head_train import HeadRecipe
    from dllm.train.drafters.path_head_train import PathHeadRecipe

    meta = json.loads((EMBEDDED / drafter / "path_head.json").read_text())["meta"]
    assert json.loads(json.dumps(asdict(PathHeadRecipe(drafter=drafter)))) == meta["recipe"]
    block = EMBEDDED / drafter / "block_head.json"
    if block.is_file():
        info = json.loads(block.read_text())
        trees = re.search(r"--trees ((?:\S+/\S+ ?)+)", info["made_by"]).group(1).split()
        plans = tuple((int(t.split("/")[0]), t.split("/", 1)[1]) for t in trees)
        assert f"--drafter {drafter}" in info["made_by"]
        assert json.loads(json.dumps(asdict(HeadRecipe(drafter=drafter, tree_plans=plans)))) == info["recipe"]
