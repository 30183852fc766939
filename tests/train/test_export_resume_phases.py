"""Fixes from a review of ``dllm train``: an export that fails keeps the old one, a resume keeps best/'s
score, and the per-run ``--lr`` / ``--warmup`` / ``--batch-size`` reach every phase of a stage."""

import json

import pytest

from dllm.models import tiny
from dllm.train import get_recipe
from dllm.train.export import export
from dllm.train.trainer import Trainer
from tests.train.helpers import small_recipe


def test_an_export_whose_checkpoint_fails_to_load_keeps_the_old_export(tmp_path):
    """The old export was removed before the checkpoint was loaded: a checkpoint that failed to load
    left no model at all. The new export is written aside and replaces the old one only when complete."""
    run, root = tmp_path / "run", tmp_path / "embedded"
    tiny("llada", seed=2).save_pretrained(run / "checkpoint-0000010")
    old = export(run, "tiny-test", dtype="float32", root=root)
    before = {f.name: f.read_bytes() for f in old.iterdir()}
    (run / "checkpoint-0000020").mkdir()
    (run / "checkpoint-0000020" / "config.json").write_text('{"model_type": "llada", "d_model": "broken"}')
    with pytest.raises(Exception):
        export(run, "tiny-test", dtype="float32", root=root)
    assert {f.name: f.read_bytes() for f in old.iterdir()} == before  # the old export, untouched
    assert sorted(p.name for p in root.iterdir()) == ["tiny-test"]  # no half-written directory left
    out = export(run, "tiny-test", checkpoint="checkpoint-0000010", dtype="bfloat16", root=root)
    assert json.loads((out / "training.json").read_text())["dtype"] == "bfloat16"  # a good one replaces it
    assert sorted(p.name for p in root.iterdir()) == ["tiny-test"]


def test_a_resume_keeps_the_score_of_a_best_written_after_its_checkpoint(tmp_path):
    """best/ written after the newest checkpoint (the run stopped before the next one): the resume took the
    checkpoint's best score, so a later evaluation better than that but worse than best/'s replaced best/."""
    recipe = small_recipe("llada", steps=3, save_every=1, eval_every=0)
    first = Trainer(recipe, tmp_path, progress=False)
    first.train(stop_at=1)  # checkpoint-0000001, saved with no best score
    first.run_eval()  # best/ written after that checkpoint; say that its score was perfect
    info = json.loads((tmp_path / "best" / "best.json").read_text())
    (tmp_path / "best" / "best.json").write_text(json.dumps({**info, "eval_mean_c0": 1.0}))
    resumed = Trainer(recipe, tmp_path, resume=True, progress=False)
    assert resumed.step == 1 and resumed.best == 1.0
    resumed.run_eval()  # at most 1.0: not better, best/ stays
    assert json.loads((tmp_path / "best" / "best.json").read_text())["eval_mean_c0"] == 1.0


def _stage_train(recipe: str, stage: str, *flags: str):
    from dllm.train.__main__ import build_parser, overrides
    from dllm.train.recipes import curricula

    args = build_parser().parse_args(["--recipe", recipe, *flags])
    return overrides(args)(curricula.get(recipe).stage(stage).recipe).train


def test_lr_warmup_and_batch_size_reach_every_phase_of_a_stage():
    """``--lr`` / ``--warmup`` / ``--batch-size`` set only a stage's first phase: tiny-llada's focus phase kept
    lr 6e-4 under --lr 0.01, and the length curriculum's second phase batch 32 under --batch-size 16. Now each
    phase keeps its ratio to the stage's lr and batch, and warms up --warmup steps."""
    plain = _stage_train("tiny-llada-long", "length")
    given = _stage_train("tiny-llada-long", "length", "--lr", "0.01", "--warmup", "3", "--batch-size", "16")
    assert (given.lr, given.warmup, given.batch_size) == (0.01, 3, 16)
    assert [p.batch_size for p in plain.phases] == [32, 16, 8, 4] and plain.batch_size == 64
    assert [p.batch_size for p in given.phases] == [8, 4, 2, 1]  # a quarter of each, as --batch-size 16 of 64
    for p, q in zip(plain.phases, given.phases):
        assert q.lr == pytest.approx(p.lr * 0.01 / plain.lr) and q.warmup == 3
        assert (q.start, q.mixture, q.horizon) == (p.start, p.mixture, p.horizon)
    focus = _stage_train("tiny-llada", "tiny-llada", "--lr", "0.01").phases[0]
    assert focus.lr == pytest.approx(0.006) and focus.warmup == 200  # 0.6 x the stage's lr; its own warm-up
    assert _stage_train("tiny-llada", "tiny-llada").phases == get_recipe("tiny-llada").train.phases  # no flag: as is
