"""``dllm stress``: a setting listed by two grid entries, damaged resume files, a resume with another
--dtype, and the order-preference note of ``--metrics parallelbench``."""

import json

import pytest

from dllm.cli import main
from dllm.eval.stress.grid import build_grid
from dllm.eval.stress.metrics import Cell
from dllm.eval.stress.sweep import StressConfig, StressStore, run_stress
from dllm.models.oracle import OracleLM

GRID = ("low_confidence:k=1,2",)
TASKS = ("copy", "shuffle")


def test_two_entries_giving_one_setting_are_refused_before_decoding():
    # "threshold:threshold=0.9" is the family of that one setting, "threshold" the family of the sweep:
    # both give the label (the cell key) 'threshold:threshold=0.9', which the sweep decoded twice and
    # whose summary then failed with a bare KeyError after every cell had run
    with pytest.raises(ValueError, match=r"grid entries 'threshold:threshold=0.9' and 'threshold:threshold=0.5,0.9' "
                                         r"both give the setting 'threshold:threshold=0.9'"):
        build_grid(["threshold:threshold=0.9", "threshold:threshold=0.5,0.9"], [0])
    with pytest.raises(ValueError, match="both give the setting 'threshold:threshold=0.9 block=4'"):
        StressConfig("oracle", grid=("threshold:threshold=0.9", "threshold:threshold=0.5,0.9"), block_lengths=(4,),
                     tasks=("copy",), per_size=1)


@pytest.fixture
def finished(tmp_path):
    """A finished sweep's file and its config."""
    config = StressConfig("oracle", grid=GRID, tasks=TASKS, per_size=1)
    path = tmp_path / "stress.json"
    run_stress(OracleLM(), config, path, progress=False)
    return config, path


def _damage(path, edit) -> None:
    data = json.loads(path.read_text())
    edit(data)
    path.write_text(json.dumps(data))


FIRST = "low_confidence:k=1 | copy"


@pytest.mark.parametrize("edit, message", [
    (lambda d: d.update(header=[1]), "is not a stress result file"),
    (lambda d: d.pop("cells"), "is not a stress result file"),
    (lambda d: d.update(cells=list(d["cells"].values())), "its cells are a list"),
    (lambda d: d["cells"].update({"low_confidence:k=4 | copy": d["cells"][FIRST]}),
     "holds cell 'low_confidence:k=4 \\| copy', which is no cell of this sweep"),
    (lambda d: d["cells"][FIRST].pop("nfe"), "cell 'low_confidence:k=1 \\| copy' is damaged .*'nfe'"),
    (lambda d: d["cells"][FIRST].update(nfe=None), "is damaged \\(nfe must list 3 samples, got None\\)"),
    (lambda d: d["cells"][FIRST].update(nfe=d["cells"][FIRST]["nfe"][:2]), "nfe must list 3 samples"),
    (lambda d: d["cells"][FIRST].update(correct=[1, 1, 1]), "correct holds 1"),
    (lambda d: d["cells"][FIRST].update(sizes=[9, 9, 9]), "sizes \\[9, 9, 9\\], the sweep's examples have sizes"),
    (lambda d: d["cells"][FIRST].update(task="shuffle"), "it holds setting 'low_confidence:k=1' and task 'shuffle'"),
    (lambda d: d["cells"].update({FIRST: [1, 2]}), "cell 'low_confidence:k=1 \\| copy' is damaged"),
])
def test_a_damaged_file_is_refused_with_the_file_and_the_cell_named(finished, edit, message):
    config, path = finished
    _damage(path, edit)
    with pytest.raises(ValueError, match=message):
        StressStore.open(path, config.header(), resume=True, sizes=config.sample_sizes())
    with pytest.raises(ValueError, match=message):  # run_stress checks before decoding anything
        run_stress(OracleLM(), config, path, resume=True, progress=False)


def test_the_command_refuses_a_damaged_file_in_one_line(tmp_path, capsys):
    out = tmp_path / "st"
    args = ["stress", "--model", "oracle", "--grid", GRID[0], "--tasks", *TASKS, "--per-size", "1",
            "--out", str(out), "--no-progress"]
    assert main(args) == 0
    capsys.readouterr()
    _damage(out / "stress.json", lambda d: d["cells"][FIRST].update(tokens=[5]))
    assert main(args + ["--resume"]) == 2
    err = capsys.readouterr().err
    assert "cell 'low_confidence:k=1 | copy' is damaged (tokens must list 3 samples" in err
    assert "Traceback" not in err


def test_a_whole_cell_passes_its_check(finished):
    config, path = finished
    store = StressStore.open(path, config.header(), resume=True, sizes=config.sample_sizes())
    assert len(store.cells) == 4 and all(isinstance(c, Cell) for c in store.cells.values())
    assert all(c.damage(config.sample_sizes()[c.task]) is None for c in store.cells.values())


def test_a_resume_with_another_dtype_is_refused(tmp_path, capsys):
    """Cells decoded in bfloat16 were merged into a float32 sweep: --dtype was not in the header."""
    out = tmp_path / "st"
    args = ["stress", "--model", "tiny-llada", "--grid", "low_confidence:k=1", "--tasks", "copy", "--per-size", "1",
            "--out", str(out), "--no-progress", "--threads", "1"]
    assert main(args) == 0  # float32, the default
    capsys.readouterr()
    assert main(args + ["--resume", "--dtype", "bfloat16"]) == 2
    assert "different sweep: dtype: file 'float32', this run 'bfloat16'" in capsys.readouterr().err
    assert main(args + ["--resume", "--dtype", "float32"]) == 0
    # a file from before the header recorded it was made with the CLI's default
    _damage(out / "stress.json", lambda d: d["header"].pop("dtype"))
    config = StressConfig("tiny-llada", grid=("low_confidence:k=1",), tasks=("copy",), per_size=1, dtype="float32")
    assert len(StressStore.open(out / "stress.json", config.header(), resume=True).cells) == 1


def test_a_resume_on_another_device_is_refused(tmp_path, capsys):
    """Cells decoded on CUDA (other kernels, other roundings) must not be merged into a CPU sweep: the device
    type is in the header; a file from before it was recorded was made on the CLI's default, cpu."""
    out = tmp_path / "st"
    args = ["stress", "--model", "oracle", "--grid", "low_confidence:k=1", "--tasks", "copy", "--per-size", "1",
            "--out", str(out), "--no-progress"]
    assert main(args + ["--device", "cpu"]) == 0
    capsys.readouterr()
    assert main(args + ["--resume", "--device", "cuda:1"]) == 2  # refused before anything loads
    assert "different sweep: device: file 'cpu', this run 'cuda'" in capsys.readouterr().err
    assert main(args + ["--resume"]) == 0  # the default is cpu
    _damage(out / "stress.json", lambda d: d["header"].pop("device"))
    config = StressConfig("oracle", grid=("low_confidence:k=1",), tasks=("copy",), per_size=1)
    assert len(StressStore.open(out / "stress.json", config.header(), resume=True).cells) == 1
    assert main(args + ["--resume", "--device", "gpu0"]) == 2
    assert "--device must be a torch device such as cpu, cuda or cuda:N, got 'gpu0'" in capsys.readouterr().err


def test_order_preference_note_names_the_missing_k_not_the_block_lengths(tmp_path, capsys):
    out = tmp_path / "st"
    assert main(["stress", "--model", "oracle", "--grid", "low_confidence:k=1,4", "--block-lengths", "0,4",
                 "--tasks", "copy", "--per-size", "1", "--metrics", "parallelbench", "--out", str(out),
                 "--no-progress"]) == 0
    text = capsys.readouterr().out
    assert "needs two or more --block-lengths" not in text
    assert "top-k is compared at k=2 only" in text


# ---- python -m dllm.eval.harness ------------------------------------------------------------------------
def test_harness_command_missing_task_data_is_one_line_and_status_2(tmp_path, monkeypatch, capsys):
    """A stress task whose data files are missing: one line and status 2 (as ``dllm eval harness``
    says it), not lm-eval's traceback."""
    import os
    import runpy
    import sys

    monkeypatch.setenv("HF_DATASETS_OFFLINE", "1")  # everything is local
    lm_eval_tasks = pytest.importorskip("lm_eval.tasks")
    from dllm.eval.harness.tasks import DATA_ENV

    class StressOnly(lm_eval_tasks.TaskManager):  # lm-eval's own tasks not indexed: seconds saved
        def __init__(self, *args, **kwargs):
            super().__init__(*args, **{**kwargs, "include_defaults": False})

    monkeypatch.setattr(lm_eval_tasks, "TaskManager", StressOnly)
    monkeypatch.setenv(DATA_ENV, os.fspath(tmp_path / "nothing-written"))
    monkeypatch.setattr(sys, "argv", ["python -m dllm.eval.harness", "--model", "dllm", "--model_args",
                                      "pretrained=tiny-llada,dtype=float32", "--tasks", "stress_copy",
                                      "--device", "cpu"])
    with pytest.raises(SystemExit) as stop:
        runpy.run_module("dllm.eval.harness", run_name="__main__", alter_sys=True)
    assert stop.value.code == 2
    err = capsys.readouterr().err
    assert "python -m dllm.eval.harness: error: lm-eval task 'stress_copy': the data file" in err
    assert "dllm eval harness-tasks" in err  # the command that writes the files
