"""The first long-prompt stage (dllm/train/recipes/long_prompt.py): warm start from an embedded model with a grown
vocabulary, per-phase batch sizes, and the curriculum's sizes."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import pytest
import torch

from dllm import tasks as T
from dllm.train import MixtureConfig
from dllm.train.recipes.long_prompt import CURRICULUM, LONG_VOCAB_SIZE, first_long_recipe, long_prompt_mixture
from dllm.train.recipes import build_model, get_recipe, warm_start
from dllm.train.schedule import Phase
from dllm.train.trainer import Trainer
from .helpers import small_recipe


@pytest.mark.parametrize("base", ["tiny-llada", "tiny-dream"])
def test_long_recipe_starts_from_the_embedded_weights(base):
    from dllm.models import load

    recipe = first_long_recipe(base)
    base = load(recipe.init_from)
    model = build_model(recipe)
    assert model.config.vocab_size == LONG_VOCAB_SIZE > base.config.vocab_size
    ours, theirs = model.state_dict(), base.state_dict()
    for key, value in theirs.items():
        assert torch.equal(ours[key][: value.shape[0]], value), key
    assert ours["transformer.embed.weight"][base.config.vocab_size:].abs().sum() > 0  # new rows initialised
    ids = torch.tensor([T.prompt_ids(T.test_split("copy", 4, 1)[0])])
    assert torch.equal(model(ids).logits[..., :base.config.vocab_size].argmax(-1), base(ids).logits.argmax(-1))


def test_warm_start_refuses_other_shapes_and_families():
    llada = build_model(get_recipe("tiny-llada"))
    with pytest.raises(ValueError, match="init_from='tiny-dream' is a Dream, the recipe builds a LLaDA"):
        warm_start(llada, "tiny-dream")
    with pytest.raises(ValueError, match=r"init_from='tiny-llada': tensors differ: \['transformer.layers.1"):
        warm_start(build_model(small_recipe("llada")), "tiny-llada")  # one layer, the source has six
    small = build_model(get_recipe("tiny-llada").with_overrides(dict(d_model=64, n_heads=2, n_kv_heads=2)))
    with pytest.raises(ValueError, match=r"init_from='tiny-llada': .* is \(.*\), the recipe's is .*only the "
                                         r"vocabulary may grow"):
        warm_start(small, "tiny-llada")


def test_phase_batch_size(tmp_path: Path):
    copy = MixtureConfig(tasks=("copy",))
    with pytest.raises(ValueError, match="Phase.batch_size must be an int >= 1"):
        Phase(3, copy, lr=1e-3, batch_size=0)
    recipe = small_recipe("llada", steps=4, batch_size=8, phases=(Phase(2, copy, lr=1e-3, batch_size=3),))
    trainer = Trainer(recipe, tmp_path, progress=False)
    assert [trainer.batch_size(p) for p in (0, 1)] == [8, 3]
    trainer.train()
    widths = [trainer.mixtures[i].batch(s, trainer.batch_size(i)).input_ids.shape[0] for s, i in
              ((0, 0), (1, 0), (2, 1), (3, 1))]
    assert widths == [8, 8, 3, 3]
    saved = json.loads((tmp_path / "recipe.json").read_text())
    assert saved["train"]["phases"][0]["batch_size"] == 3 and saved["init_from"] is None


def test_curriculum_grows_prompts_and_shrinks_batches():
    starts, longest, batches = zip(*CURRICULUM)
    assert list(starts) == sorted(starts) and list(longest) == sorted(longest) and longest[-1] == 2048
    assert list(batches) == sorted(batches, reverse=True)
    for name in T.suite_task_names("long-prompt"):
        first = long_prompt_mixture(longest[0]).task_sizes()[long_prompt_mixture(longest[0]).task_names().index(name)]
        assert T.prompt_length(name, max(first)) <= longest[0] < T.prompt_length(name, max(first) + 1)
        last = long_prompt_mixture(longest[-1])
        sizes = last.task_sizes()[last.task_names().index(name)]
        assert set(T.get_task(name).default_sizes) <= set(sizes)  # every test size is trained at the end
    recipe = first_long_recipe("tiny-llada")
    assert [p.batch_size for p in recipe.train.phases] == list(batches[1:])
    assert replace(recipe.train, phases=()).batch_size == batches[0]
