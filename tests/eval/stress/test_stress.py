"""``dllm stress`` on the oracle: ParallelBench's theory (arXiv 2510.04767), per-sample forwards,
resuming, and the command."""

import json

import pytest

import dllm.eval.stress.sweep as stress_mod
from dllm import tasks as T
from dllm.cli import main
from dllm.scoring.exact_match import c0_tasks, eval_examples
from dllm.eval.stress.sweep import StressConfig, StressStore, decode_cell, run_stress
from dllm.eval.stress.grid import build_grid
from dllm.models.oracle import OracleLM

KS = (1, 2, 4, 8, 32)  # 32: every answer region in one step


def _run(tmp_path, grid, tasks, per_size=1, model=None, name="r.json", **kw):
    config = StressConfig("oracle", grid=grid, tasks=tasks, per_size=per_size, **kw)
    return config, run_stress(model or OracleLM(), config, tmp_path / name, progress=False)


def test_c_zero_tasks_stay_exact_at_every_k(tmp_path):
    tasks = c0_tasks()
    assert {"copy", "reverse", "sort", "sudoku4"} <= set(tasks)
    config, res = _run(tmp_path, (f"low_confidence:k={','.join(map(str, KS))}",), tasks)
    for task in tasks:
        cells = [res.cell(s, task) for s in config.settings]
        assert all(c.accuracy == 1.0 for c in cells), (task, [c.accuracy for c in cells])
        tps = [c.tps for c in cells]
        assert tps == sorted(tps) and tps[0] == 1.0 and cells[-1].mean_nfe == 1.0  # one step at k = 32


def test_replace_random_collapses_beyond_two_tokens_per_step(tmp_path):
    assert "replace_random" in T.tasks.names()
    config, res = _run(tmp_path, ("low_confidence:k=1,2,4,8", "threshold:threshold=0.5,0.9"), ("replace_random",),
                       per_size=4)
    acc = {s.label: res.cell(s, "replace_random").accuracy for s in config.settings}
    assert acc["low_confidence:k=1"] == 1.0
    # exact marginals, the EOS slot decoded too: EOS (confidence 1) joins the first group, so at k = 2
    # and even n the last group is a single position and always right (tests/oracle: parity note)
    assert acc["low_confidence:k=2"] == 1.0
    assert acc["low_confidence:k=4"] <= 0.5 and acc["low_confidence:k=8"] <= 0.25
    # threshold: every original has confidence (n-1)/n <= 7/8, so 0.9 goes one at a time, 0.5 fails
    assert acc["threshold:threshold=0.9"] == 1.0 and acc["threshold:threshold=0.5"] == 0.0


def test_per_sample_forwards_are_those_of_a_lone_decode():
    model = OracleLM()
    checked_varying = False
    for spec in ("threshold:threshold=0.7", "factor:factor=1.0", "fast"):
        (setting,) = build_grid([spec], [0])
        for task in ("remove_random", "insert_random", "replace_random"):
            exs = eval_examples([task], 3)
            batched = decode_cell(model, setting, task, exs, max_batch=64)
            alone = decode_cell(model, setting, task, exs, max_batch=1)
            assert batched.nfe == alone.nfe and batched.correct == alone.correct, (spec, task)
            checked_varying |= len(set(batched.nfe)) > 1
    assert checked_varying  # some batch mixes rows that need different numbers of forwards


def test_one_position_per_block_is_left_to_right(tmp_path):
    config, res = _run(tmp_path, ("low_confidence:k=1",), ("copy", "shuffle"), block_lengths=(1,))
    cells = [res.cell(config.settings[0], t) for t in config.tasks]
    assert all(tau == 1.0 for c in cells for tau in c.tau)


def _noisy():
    return OracleLM(noise_std=0.05, seed=3)  # random tie-breaking: results depend on the seeds


GRID = ("low_confidence:k=1,2,4", "threshold:threshold=0.5,0.9")
TASKS = ("copy", "shuffle")


def test_interrupted_sweep_resumes_without_recomputing(tmp_path):
    config = StressConfig("oracle:noise_std=0.05", grid=GRID, tasks=TASKS, per_size=2)
    total = len(config.settings) * len(TASKS)
    full = run_stress(_noisy(), config, tmp_path / "full.json", progress=False)
    assert full.computed == total
    path, seen = tmp_path / "part.json", []

    def stop_after_three(cell):
        seen.append(cell)
        if len(seen) == 3:
            raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        run_stress(_noisy(), config, path, progress=False, on_cell=stop_after_three)
    saved = json.loads(path.read_text())["cells"]
    assert len(saved) == 3
    again = []
    res = run_stress(_noisy(), config, path, resume=True, progress=False, on_cell=again.append)
    assert res.computed == total - 3 == len(again)
    assert not {(c.setting, c.task) for c in again} & {(c["setting"], c["task"]) for c in saved.values()}
    assert set(res.cells) == set(full.cells)
    assert all(res.cells[k].same_outcome(full.cells[k]) for k in full.cells)
    assert any(not all(c.correct) for c in full.cells.values())  # the comparison is not all-trivial
    assert run_stress(_noisy(), config, path, resume=True, progress=False).computed == 0


class _Interrupting(OracleLM):
    """Raises KeyboardInterrupt in the middle of a decode, at the given forward."""

    def __init__(self, at: int) -> None:
        super().__init__()
        self.calls, self.at = 0, at

    def _raw_forward(self, *args):
        self.calls += 1
        if self.calls == self.at:
            raise KeyboardInterrupt
        return super()._raw_forward(*args)


def test_interrupt_inside_a_cell_keeps_the_finished_ones(tmp_path):
    config = StressConfig("oracle", grid=GRID, tasks=TASKS, per_size=1)
    path, finished = tmp_path / "r.json", []
    with pytest.raises(KeyboardInterrupt):
        run_stress(_Interrupting(at=40), config, path, progress=False, on_cell=finished.append)
    assert 0 < len(finished) < len(config.settings) * len(TASKS)
    saved = json.loads(path.read_text())["cells"]  # a complete JSON file, never a torn one
    assert len(saved) == len(finished)
    assert not list(tmp_path.glob("*.tmp"))


def test_a_different_sweep_cannot_resume(tmp_path):
    config = StressConfig("oracle", grid=("low_confidence:k=1,2",), tasks=("copy",), per_size=1)
    path = tmp_path / "r.json"
    run_stress(OracleLM(), config, path, progress=False)
    with pytest.raises(ValueError, match="exists; pass --resume"):
        run_stress(OracleLM(), config, path, progress=False)
    for other, message in [
        (StressConfig("oracle", grid=("low_confidence:k=1,4",), tasks=("copy",), per_size=1),
         r"settings differ \(only in the file: \['low_confidence:k=2'\]; only in this run: \['low_confidence:k=4'\]\)"),
        (StressConfig("tiny-llada", grid=("low_confidence:k=1,2",), tasks=("copy",), per_size=1),
         "model: file 'oracle', this run 'tiny-llada'"),
        (StressConfig("oracle", grid=("low_confidence:k=1,2",), tasks=("copy", "sort"), per_size=1), "tasks differ"),
        (StressConfig("oracle", grid=("low_confidence:k=1,2",), tasks=("copy",), per_size=2), "per_size: file 1"),
    ]:
        with pytest.raises(ValueError, match="different sweep: " + message):
            StressStore.open(path, other.header(), resume=True)


def test_command_writes_tables_json_and_plots_and_resumes(tmp_path, capsys):
    out = tmp_path / "st"
    args = ["stress", "--model", "oracle", "--grid", "low_confidence:k=1,2", "--grid", "fast", "--tasks", "copy",
            "shuffle", "--per-size", "1", "--out", str(out), "--no-progress"]
    assert main(args) == 0
    text = capsys.readouterr().out
    assert "Leaderboard" in text and "TPS@80" in text and "Accuracy % per task vs parallelism" in text
    data = json.loads((out / "stress.json").read_text())
    assert len(data["cells"]) == 3 * 2 and {e["family"] for e in data["summary"]["leaderboard"]} == {
        "low_confidence", "fast"}
    assert (out / "stress.txt").read_text().strip() == text.split("\nwrote ")[0].strip()
    brief = json.loads((out / "stress-summary.json").read_text())
    assert brief["header"] == data["header"] and brief["levels"] == ["80", "75", "70"]
    assert brief["leaderboard"][0]["family"] == "low_confidence"
    for png in ("stress-curves.png", "stress-heatmap.png"):
        assert (out / png).stat().st_size > 1000
    assert main(args) == 2 and "pass --resume" in capsys.readouterr().err
    assert main(args + ["--resume"]) == 0
    assert "Leaderboard" in capsys.readouterr().out


def test_command_reports_an_interruption(tmp_path, capsys, monkeypatch):
    real, calls = stress_mod.decode_cell, []

    def interrupt_third(*args, **kw):
        calls.append(1)
        if len(calls) == 4:  # the warm-up, two cells, then stop
            raise KeyboardInterrupt
        return real(*args, **kw)

    monkeypatch.setattr(stress_mod, "decode_cell", interrupt_third)
    out = tmp_path / "st"
    assert main(["stress", "--model", "oracle", "--grid", "low_confidence:k=1,2,4", "--tasks", "copy",
                 "--per-size", "1", "--out", str(out), "--no-progress"]) == 130
    assert "interrupted: 2 finished cells are saved" in capsys.readouterr().out


def test_a_sampler_the_model_cannot_run_is_refused_before_decoding(tmp_path):
    config = StressConfig(model="oracle", grid=("dawn",), block_lengths=(0,), tasks=("copy",), per_size=1)
    with pytest.raises(ValueError, match="cannot run: dawn: dawn reads attention"):
        run_stress(OracleLM(), config, tmp_path / "stress.json", progress=False)
    assert not (tmp_path / "stress.json").exists()


def test_per_size_past_the_test_split_is_refused_before_the_model_loads(tmp_path, capsys, monkeypatch):
    with pytest.raises(ValueError, match=r"test instances 0\.\.50 .* holds instances 0\.\.49"):
        StressConfig("oracle", grid=("low_confidence:k=1",), tasks=("copy",), per_size=51)

    def no_load(*args, **kw):
        raise AssertionError("the model was loaded before the bad --per-size was refused")

    monkeypatch.setattr(stress_mod, "load_stress_model", no_load)
    assert main(["stress", "--model", "oracle", "--grid", "low_confidence:k=1", "--tasks", "copy",
                 "--per-size", "51", "--out", str(tmp_path / "st"), "--no-progress"]) == 2
    assert "test instances 0..50" in capsys.readouterr().err
    assert not (tmp_path / "st").exists()


def test_rows_per_call_change_random_draws_so_a_resume_must_match_them(tmp_path):
    # the random order is drawn per generate call: the same cell in batches of 3 and of 64 differs
    (setting,) = build_grid(["random:k=2"], [0])
    exs = eval_examples(["shuffle"], 8)
    wide = decode_cell(OracleLM(), setting, "shuffle", exs, max_batch=64, seed=5)
    narrow = decode_cell(OracleLM(), setting, "shuffle", exs, max_batch=3, seed=5)
    assert wide.tau != narrow.tau  # other positions drawn, so another unmasking order
    config = StressConfig("oracle", grid=("low_confidence:k=1",), tasks=("copy",), per_size=1)
    path = tmp_path / "r.json"
    run_stress(OracleLM(), config, path, progress=False)
    other = StressConfig("oracle", grid=("low_confidence:k=1",), tasks=("copy",), per_size=1, max_batch=3)
    with pytest.raises(ValueError, match="different sweep: max_batch: file 64, this run 3"):
        StressStore.open(path, other.header(), resume=True)
    # a file written before the header recorded it was made with the default, the only CLI value
    data = json.loads(path.read_text())
    del data["header"]["max_batch"]
    path.write_text(json.dumps(data))
    assert len(StressStore.open(path, config.header(), resume=True).cells) == 1
    with pytest.raises(ValueError, match="max_batch: file 64, this run 3"):
        StressStore.open(path, other.header(), resume=True)
