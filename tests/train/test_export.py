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
    loaded = load(str(out))
    assert loaded.dtype == torch.bfloat16
    ids = torch.tensor([[5, 6, 7, loaded.mask_id]])
    ref = model(ids).logits
    assert torch.allclose(loaded(ids).logits.float(), ref, atol=0.1 * ref.abs().max().item())
