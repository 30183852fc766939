"""A ``tie_word_embeddings`` checkpoint that also stores ``lm_head.weight`` loads as transformers loads it.

transformers' ``from_pretrained`` (``PreTrainedModel.tie_weights(missing_keys=...)``, transformers 5.x
``modeling_utils.py``) ties the head to the embedding when the stored head equals it, and keeps the
stored head untied (with a warning) when it differs. ``dllm.load`` does the same; any other extra
tensor is still refused as an unexpected key.
"""

import json
import warnings

import pytest
import torch
from safetensors.torch import load_file, save_file

from dllm.models import CheckpointError, load, tiny

from .helpers import random_ids

HEAD = "lm_head.weight"
EMBED = {"dream": "model.embed_tokens.weight", "sdar": "model.embed_tokens.weight",
         "llada2": "model.word_embeddings.weight"}


def _tied_checkpoint(path, family: str, seed: int = 3):
    """A tiny tied model of ``family`` saved in its official layout (no lm_head.weight stored)."""
    model = tiny(family, seed=seed, tie_embeddings=True)
    model.save_pretrained(path)
    assert json.loads((path / "config.json").read_text())["tie_word_embeddings"] is True
    assert HEAD not in load_file(str(path / "model.safetensors"))
    return model


def _edit_weights(path, fn) -> dict:
    f = path / "model.safetensors"
    tensors = load_file(str(f))
    fn(tensors)
    save_file(tensors, str(f), metadata={"format": "pt"})
    return tensors


def _store_head(path, family: str, noise: float) -> torch.Tensor:
    """Add lm_head.weight = embedding + noise * N(0, 1) to the checkpoint; returns the stored head."""
    def add(t):
        gen = torch.Generator().manual_seed(7)
        embed = t[EMBED[family]]
        t[HEAD] = (embed + noise * torch.randn(embed.shape, generator=gen)).contiguous()

    return _edit_weights(path, add)[HEAD]


def _load_quietly(path):
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        model = load(path, dtype="float32")
    return model, [str(w.message) for w in caught]


@pytest.mark.parametrize("family", ["dream", "sdar", "llada2"])
def test_stored_head_equal_to_the_embedding_loads_tied(tmp_path, family):
    ref = _tied_checkpoint(tmp_path, family)
    _store_head(tmp_path, family, noise=0.0)
    model, messages = _load_quietly(tmp_path)
    assert model.config.tie_embeddings and model.transformer.lm_head is None
    assert not [m for m in messages if HEAD in m], messages
    ids = random_ids(ref, 2, 8)
    with torch.no_grad():
        torch.testing.assert_close(model.raw_logits(ids), ref.raw_logits(ids), rtol=0, atol=0)


@pytest.mark.parametrize("family", ["dream", "sdar", "llada2"])
def test_stored_head_that_differs_is_kept_untied_with_a_warning(tmp_path, family):
    tied = _tied_checkpoint(tmp_path, family)
    stored = _store_head(tmp_path, family, noise=0.5)
    with pytest.warns(UserWarning, match=f"stored '{HEAD}' differs from '{EMBED[family]}'"):
        model = load(tmp_path, dtype="float32")
    assert not model.config.tie_embeddings
    assert torch.equal(model.transformer.lm_head.weight, stored)
    # the same files with tie_word_embeddings false: the untied model transformers builds
    untied_dir = tmp_path / "untied"
    untied_dir.mkdir()
    for f in tmp_path.iterdir():
        if f.is_file():
            (untied_dir / f.name).write_bytes(f.read_bytes())
    cfg = json.loads((untied_dir / "config.json").read_text())
    (untied_dir / "config.json").write_text(json.dumps({**cfg, "tie_word_embeddings": False}))
    untied = load(untied_dir, dtype="float32")
    ids = random_ids(tied, 2, 8)
    with torch.no_grad():
        mine = model.raw_logits(ids)
        torch.testing.assert_close(mine, untied.raw_logits(ids), rtol=0, atol=0)
        assert not torch.allclose(mine, tied.raw_logits(ids), atol=1e-3)  # the stored head is used


@pytest.mark.parametrize("family", ["dream", "llada2"])
def test_other_unexpected_keys_are_still_refused(tmp_path, family):
    _tied_checkpoint(tmp_path, family)

    def add(t):
        t[HEAD] = t[EMBED[family]].clone()
        t["model.extra.weight"] = torch.zeros(2)

    _edit_weights(tmp_path, add)
    with pytest.raises(CheckpointError) as info:
        load(tmp_path, dtype="float32")
    assert "unexpected keys (1): model.extra.weight" in str(info.value)


def test_misshaped_stored_head_is_refused(tmp_path):
    _tied_checkpoint(tmp_path, "dream")
    _edit_weights(tmp_path, lambda t: t.update({HEAD: torch.zeros(5, 3)}))
    with pytest.warns(UserWarning, match=HEAD), pytest.raises(CheckpointError) as info:
        load(tmp_path, dtype="float32")
    assert f"mis-shaped key {HEAD}" in str(info.value) and "found [5, 3]" in str(info.value)


def _qwen2_from_pretrained(path):
    """transformers' own Qwen2 (Dream's architecture) loaded from the same files by ``from_pretrained``."""
    transformers = pytest.importorskip("transformers")
    from .families.test_hf_equivalence import qwen2_config

    return transformers.Qwen2ForCausalLM.from_pretrained(path, config=qwen2_config(path), dtype=torch.float32).eval()


@pytest.mark.parametrize("noise", [0.0, 0.5])
def test_dream_logits_match_transformers_on_the_same_files(tmp_path, noise):
    """Dream is Qwen2 with bidirectional attention: an all-zero additive 4-D mask makes transformers'
    Qwen2 attend to every key (as tests/models/families/test_hf_equivalence.py does)."""
    _tied_checkpoint(tmp_path, "dream")
    _store_head(tmp_path, "dream", noise=noise)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        model = load(tmp_path, dtype="float32")
    qwen = _qwen2_from_pretrained(tmp_path)
    ids = random_ids(model, 2, 8)
    b, t = ids.shape
    with torch.no_grad():
        mine = model.raw_logits(ids)
        ref = qwen(input_ids=ids, attention_mask=torch.zeros(b, 1, t, t)).logits
    torch.testing.assert_close(mine, ref, rtol=0, atol=1e-4)
