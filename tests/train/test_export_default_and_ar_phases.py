"""``dllm train export --checkpoint best`` given explicitly is refused when ``best/`` is missing (only the default
falls back to ``final/``), and an AR recipe's ``--lr`` / ``--warmup`` reach its later phases
(``dllm.train.ar.overridden_ar_phases``, as ``dllm.train.schedule.overridden_phases`` for a diffusion stage)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from dllm.models import tiny
from dllm.train.__main__ import main as train_main
from dllm.train.ar import ar_recipes
from dllm.train.export import export
from dllm.train.export import main as export_main


def test_an_explicit_best_is_refused_when_missing_and_the_default_falls_back(tmp_path: Path):
    run, root = tmp_path / "run", tmp_path / "embedded"
    tiny("llada", seed=2).save_pretrained(run / "final")  # a run without evaluations: no best/
    (run / "log.jsonl").write_text("")
    with pytest.raises(FileNotFoundError, match=r"no checkpoint 'best' under .*; there: final "):
        export(run, "tiny-test", "best", root=root)
    assert not (root / "tiny-test").exists()
    out = export(run, "tiny-test", root=root)  # the default: best/, else final/
    assert json.loads((out / "training.json").read_text())["source"].endswith("final")


def test_the_refusal_lists_no_half_written_checkpoint(tmp_path: Path):
    """A ``checkpoint-N.tmp`` left by a killed save (``latest_checkpoint`` skips it) is not offered as a
    checkpoint in the refusal of a missing ``--checkpoint``."""
    run = tmp_path / "run"
    tiny("llada", seed=2).save_pretrained(run / "checkpoint-0000001")
    tiny("llada", seed=2).save_pretrained(run / "checkpoint-0000002.tmp")
    (run / "log.jsonl").write_text("")
    with pytest.raises(FileNotFoundError, match=r"; there: checkpoint-0000001 \(") as err:
        export(run, "tiny-test", "best", root=tmp_path / "embedded")
    assert ".tmp" not in str(err.value)


def test_the_cli_passes_checkpoint_none_unless_given(monkeypatch: pytest.MonkeyPatch, tmp_path: Path):
    import dllm.train.export as export_module

    given: list = []
    monkeypatch.setattr(export_module, "export", lambda run, name, checkpoint, *a, **k: given.append(checkpoint)
                        or tmp_path)  # records, writes nothing
    for flags in ([], ["--checkpoint", "best"]):
        assert export_main(["--run", str(tmp_path / "run"), "--name", "tiny-test", *flags]) == 0
    assert given == [None, "best"]


def test_lr_and_warmup_reach_every_phase_of_an_ar_recipe(capsys: pytest.CaptureFixture[str]):
    base = ar_recipes.get("tiny-ar")
    assert base.phases, "tiny-ar has a later phase"
    assert train_main(["--recipe", "tiny-ar", "--lr", str(base.lr * 2), "--warmup", "7", "--dry-run"]) == 0
    recipe = json.loads(capsys.readouterr().out.splitlines()[-1])
    assert (recipe["lr"], recipe["warmup"]) == (base.lr * 2, 7)
    assert [(p["lr"], p["warmup"]) for p in recipe["phases"]] == [(p.lr * 2, 7) for p in base.phases]
    assert train_main(["--recipe", "tiny-ar", "--dry-run"]) == 0  # no flag: the phases as the recipe has them
    recipe = json.loads(capsys.readouterr().out.splitlines()[-1])
    assert [(p["lr"], p["warmup"]) for p in recipe["phases"]] == [(p.lr, p.warmup) for p in base.phases]
