"""The JetSpec recipe (``dllm/train/drafters/jetspec_train.py``): its training mask, a short run that
saves a loadable head in the authors' layout, and the shipped head's record."""

import json
from dataclasses import asdict

import pytest
import torch

from dllm.drafters.jetspec.io import load_jetspec
from dllm.models.loading import locate
from dllm.train.drafters.dflash_train import block_layout
from dllm.train.drafters.jetspec_train import causal_layout, jetspec_recipes, train_jetspec


def test_the_training_mask_is_dflashs_with_causal_blocks():
    anchors = torch.tensor([[3, 7], [2, 9]])
    positions, mask = causal_layout(anchors, context=12, block=4)
    base_positions, base = block_layout(anchors, 12, 4)
    assert torch.equal(positions, base_positions)
    assert torch.equal(mask[..., :12], base[..., :12])  # the context part: keys before each block's anchor
    inner = mask[0, 0, :, 12:]  # [A*block, A*block]
    assert torch.equal(inner[:4, :4], torch.tril(torch.ones(4, 4, dtype=torch.bool)))  # causal in a block
    assert not inner[:4, 4:].any() and not inner[4:, :4].any()  # blocks never see each other
    assert torch.equal(inner, base[0, 0, :, 12:] & torch.tril(torch.ones(8, 8, dtype=torch.bool)))


def test_the_shipped_head_records_its_recipe():
    info = json.loads((locate("tiny-ar-jetspec") / "training.json").read_text())
    recorded = json.loads(json.dumps(asdict(jetspec_recipes.get("tiny-ar-jetspec")), default=str))
    assert info["recipe"] == recorded
    assert info["evaluation"]["tau_teacher_forced"] > 3 * info["evaluation"]["tau_teacher_forced_at_init"]


@pytest.mark.slow
def test_a_short_run_saves_a_head_in_the_authors_layout(tmp_path):
    recipe = jetspec_recipes.get("tiny-ar-jetspec").with_overrides(steps=3, pool=16, eval_examples=1, log_every=1)
    result = train_jetspec(recipe, tmp_path, threads=1, progress=False)
    assert result["step"] == 3 and result["tau_teacher_forced"] >= 1.0
    hf = json.loads((tmp_path / "final" / "config.json").read_text())
    assert hf["dflash_config"]["causal_head"] is True
    assert load_jetspec(tmp_path / "final").config.is_causal is True
    assert len((tmp_path / "log.jsonl").read_text().splitlines()) == 3 + 2  # regenerated, 3 steps, result
