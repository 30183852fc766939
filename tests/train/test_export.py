import json

import torch

from dllm.models import load, tiny
from dllm.train.export import export


def test_export_latest_checkpoint_as_bf16(tmp_path):
    run = tmp_path / "run"
    model = tiny("llada", seed=2)
    model.save_pretrained(run / "checkpoint-0000010")
    (run / "log.jsonl").write_text(json.dumps({"step": 10, "eval_mean_c0": 0.5}) + "\n")
    out = export(run, "tiny-test", checkpoint="best", dtype="bfloat16", root=tmp_path / "embedded")
    info = json.loads((out / "training.json").read_text())
    assert info["source"].endswith("checkpoint-0000010") and info["evaluation"]["eval_mean_c0"] == 0.5
    assert "note" not in info
    out = export(run, "tiny-test", dtype="float32", root=tmp_path / "embedded", note="continues stage A")
    assert json.loads((out / "training.json").read_text())["note"] == "continues stage A"
    out = export(run, "tiny-test", checkpoint="best", dtype="bfloat16", root=tmp_path / "embedded")
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
