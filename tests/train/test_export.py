import json

import pytest
import torch

from dllm.models import load, tiny
from dllm.train.export import export


def test_export_latest_checkpoint_as_bf16(tmp_path):
    run = tmp_path / "run"
    model = tiny("llada", seed=2)
    model.save_pretrained(run / "checkpoint-0000010")
    (run / "log.jsonl").write_text(json.dumps({"step": 10, "eval_mean_c0": 0.5}) + "\n")
    out = export(run, "tiny-test", dtype="bfloat16", root=tmp_path / "embedded")
    info = json.loads((out / "training.json").read_text())
    assert info["source"].endswith("checkpoint-0000010") and info["evaluation"]["eval_mean_c0"] == 0.5
    assert "note" not in info
    out = export(run, "tiny-test", dtype="float32", root=tmp_path / "embedded", note="continues stage A")
    assert json.loads((out / "training.json").read_text())["note"] == "continues stage A"
    out = export(run, "tiny-test", dtype="bfloat16", root=tmp_path / "embedded")
    loaded = load(str(out))
    assert loaded.dtype == torch.bfloat16
    ids = torch.tensor([[5, 6, 7, loaded.mask_id]])
    ref = model(ids).logits
    assert torch.allclose(loaded(ids).logits.float(), ref, atol=0.1 * ref.abs().max().item())


def test_training_json_keeps_scalar_lists_on_one_line():
    from dllm.train.export import readable_json

    info = {"recipe": {"sizes": [[4, 8], [16]], "tasks": ["a,b", "c]"], "lr": 0.001, "empty": [], "none": {}},
            "steps": [1, 2, 3]}
    text = readable_json(info)
    assert json.loads(text) == info  # same content, commas and brackets inside strings kept
    assert '"steps": [1, 2, 3]' in text and '"tasks": ["a,b", "c]"]' in text
    assert "[\n      [4, 8],\n      [16]\n    ]" in text  # nested lists: one inner list per line
    assert text == readable_json(json.loads(text))


def test_export_an_ar_run_copies_its_final_directory(tmp_path):
    """An AR run (dllm/train/ar.py) ends in final/, already in the shipped layout: copied as it is,
    loadable by load_target, the note added to its training.json."""
    from dllm.models.targets import load_target
    from dllm.train.ar import ar_recipes, build_ar_model, save_ar

    recipe = ar_recipes.get("tiny-ar-draft")
    save_ar(build_ar_model(recipe), tmp_path / "run" / "final", extra={"recipe": {"name": recipe.name}})
    out = export(tmp_path / "run", "tiny-ar-test", root=tmp_path / "embedded", note="from a test")
    info = json.loads((out / "training.json").read_text())
    assert info == {"recipe": {"name": "tiny-ar-draft"}, "note": "from a test"}
    model, tok = load_target(str(out))
    assert type(model).__name__ == "Qwen3ForCausalLM" and tok is not None


def _run_with_evals(run):
    """A trainer-like run: evaluations at steps 1..3 (0.1, 0.3, 0.2), best/ at step 2, checkpoint-2 and -3."""
    model = tiny("llada", seed=2)
    for name in ("best", "checkpoint-0000002", "checkpoint-0000003"):
        model.save_pretrained(run / name)
    (run / "best" / "best.json").write_text(json.dumps({"step": 2, "eval_mean_c0": 0.3}))
    lines = [{"step": s, "eval_mean_c0": v, "eval_examples": 13} for s, v in ((1, 0.1), (2, 0.3), (3, 0.2))]
    lines.insert(2, {"event": "best", "step": 2, "eval_mean_c0": 0.3})
    (run / "log.jsonl").write_text("".join(json.dumps(line) + "\n" for line in lines))


def test_training_json_holds_the_exported_checkpoints_own_evaluation(tmp_path):
    run = tmp_path / "run"
    _run_with_evals(run)
    for checkpoint, step, score in (("best", 2, 0.3), ("checkpoint-0000002", 2, 0.3), ("checkpoint-0000003", 3, 0.2)):
        out = export(run, "tiny-test", checkpoint=checkpoint, dtype="float32", root=tmp_path / "embedded")
        evaluation = json.loads((out / "training.json").read_text())["evaluation"]
        assert (evaluation["step"], evaluation["eval_mean_c0"], evaluation["eval_examples"]) == (step, score, 13), checkpoint


def test_export_skips_a_half_written_checkpoint(tmp_path):
    run = tmp_path / "run"
    tiny("llada", seed=2).save_pretrained(run / "checkpoint-0000010")
    (run / "checkpoint-0000020.tmp").mkdir()  # a save killed before its rename
    (run / "checkpoint-0000020.tmp" / "config.json").write_text("{}")
    (run / "log.jsonl").write_text("")
    out = export(run, "tiny-test", dtype="float32", root=tmp_path / "embedded")
    assert json.loads((out / "training.json").read_text())["source"].endswith("checkpoint-0000010")


def test_export_a_drafter_run_copies_its_final_directory(tmp_path):
    import shutil

    from dllm.drafters.dflash.io import load_dflash
    from dllm.train.export import EMBEDDED

    run = tmp_path / "run"
    shutil.copytree(EMBEDDED / "tiny-ar-dflash", run / "final")  # what train_dflash leaves in final/
    out = export(run, "tiny-test-dflash", root=tmp_path / "embedded", note="smoke")
    drafter = load_dflash(out)
    assert drafter.block_size == 16 and json.loads((out / "training.json").read_text())["note"] == "smoke"


def test_a_named_checkpoint_that_is_not_there_is_refused_not_replaced(tmp_path):
    """--checkpoint checkpoint-0000005 (a typo, or a checkpoint keep_last deleted) exported
    checkpoint-0000003 silently; it is an error naming what is there. The default (best) still falls back."""
    run = tmp_path / "run"
    _run_with_evals(run)
    with pytest.raises(FileNotFoundError, match=r"no checkpoint 'checkpoint-0000005' under .*; there: best, "
                                                r"checkpoint-0000002, checkpoint-0000003"):
        export(run, "tiny-test", checkpoint="checkpoint-0000005", dtype="float32", root=tmp_path / "embedded")
    assert not (tmp_path / "embedded").exists()
    import shutil

    shutil.rmtree(run / "best")
    out = export(run, "tiny-test", dtype="float32", root=tmp_path / "embedded")  # no best/: the newest
    assert json.loads((out / "training.json").read_text())["source"].endswith("checkpoint-0000003")


def test_a_dtype_for_a_run_copied_as_is_is_refused(tmp_path):
    """--dtype converts a diffusion checkpoint; an AR run is copied in its own dtype, so a dtype given
    for it is refused by name (before: silently ignored)."""
    from dllm.train.ar import ar_recipes, build_ar_model, save_ar

    recipe = ar_recipes.get("tiny-ar-draft")
    save_ar(build_ar_model(recipe), tmp_path / "run" / "final", extra={"recipe": {"name": recipe.name}})
    earlier = export(tmp_path / "run", "tiny-ar-test", root=tmp_path / "embedded")
    with pytest.raises(ValueError, match=r"--dtype bfloat16 applies to a diffusion run.*AR model"):
        export(tmp_path / "run", "tiny-ar-test", dtype="bfloat16", root=tmp_path / "embedded")
    assert (earlier / "config.json").is_file()  # the refused export left the earlier one alone


@pytest.mark.parametrize("family", ["sdar", "fastdllm_v2"])
def test_a_block_diffusion_run_is_exported_as_a_diffusion_model(tmp_path, family):
    """SDAR's and Fast-dLLM v2's architectures end in ForCausalLM, like an AR run's, but they are
    diffusion checkpoints: exported in the asked dtype with their training.json (before: copied as
    saved, the dtype ignored, and since the --dtype check, refused)."""
    run = tmp_path / "run"
    tiny(family, seed=2).save_pretrained(run / "checkpoint-0000002")
    out = export(run, "tiny-test", dtype="bfloat16", root=tmp_path / "embedded")
    info = json.loads((out / "training.json").read_text())
    assert info["dtype"] == "bfloat16" and info["source"].endswith("checkpoint-0000002")
    assert load(str(out)).dtype == torch.bfloat16

