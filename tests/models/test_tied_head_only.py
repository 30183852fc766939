"""A ``tie_word_embeddings`` checkpoint that stores ONLY ``lm_head.weight`` (no embedding) loads as
transformers loads it: the stored head is the tied weight, read as the embedding too.

transformers 5.x ``PreTrainedModel.tie_weights(missing_keys=...)`` (``modeling_utils.py``): "if the
mapping says tie target -> source but source is missing in the checkpoint while target exists, we swap
source and target", so ``model.embed_tokens.weight`` becomes the stored ``lm_head.weight``.
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


def _head_only_checkpoint(path, family: str, noise: float = 0.0) -> torch.Tensor:
    """A tiny tied ``family`` model saved, then its embedding stored under ``lm_head.weight`` only
    (plus ``noise`` * N(0, 1), so the loaded weights are not the saved model's); returns the stored head."""
    tiny(family, seed=4, tie_embeddings=True).save_pretrained(path)
    assert json.loads((path / "config.json").read_text())["tie_word_embeddings"] is True
    f = path / "model.safetensors"
    tensors = load_file(str(f))
    embed = tensors.pop(EMBED[family])
    gen = torch.Generator().manual_seed(9)
    tensors[HEAD] = (embed + noise * torch.randn(embed.shape, generator=gen)).contiguous()
    save_file(tensors, str(f), metadata={"format": "pt"})
    return tensors[HEAD]


@pytest.mark.parametrize("family", ["dream", "sdar", "llada2"])
def test_stored_head_without_embedding_loads_as_the_tied_weight(tmp_path, family):
    stored = _head_only_checkpoint(tmp_path, family, noise=0.0)
    ref = tiny(family, seed=4, tie_embeddings=True)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # transformers swaps silently; so does dllm
        model = load(tmp_path, dtype="float32")
    assert model.config.tie_embeddings and model.transformer.lm_head is None
    assert torch.equal(model.transformer.embed.weight, stored)
    ids = random_ids(ref, 2, 8)
    with torch.no_grad():
        torch.testing.assert_close(model.raw_logits(ids), ref.raw_logits(ids), rtol=0, atol=0)


def test_dream_head_only_logits_match_transformers_qwen2(tmp_path):
    """Dream is Qwen2 with bidirectional attention: transformers' ``Qwen2ForCausalLM.from_pretrained`` on
    the same files, given an all-zero additive 4-D mask, is the reference (as test_hf_equivalence.py)."""
    transformers = pytest.importorskip("transformers")
    from .families.test_hf_equivalence import qwen2_config

    stored = _head_only_checkpoint(tmp_path, "dream", noise=0.5)
    model = load(tmp_path, dtype="float32")
    qwen = transformers.Qwen2ForCausalLM.from_pretrained(tmp_path, config=qwen2_config(tmp_path),
                                                         dtype=torch.float32).eval()
    assert torch.equal(qwen.model.embed_tokens.weight, stored)  # transformers ties to the stored head
    ids = random_ids(model, 2, 8)
    b, t = ids.shape
    with torch.no_grad():
        mine = model.raw_logits(ids)
        theirs = qwen(input_ids=ids, attention_mask=torch.zeros(b, 1, t, t)).logits
        torch.testing.assert_close(mine, theirs, rtol=0, atol=1e-4)
        assert not torch.allclose(mine, tiny("dream", seed=4, tie_embeddings=True).raw_logits(ids), atol=1e-3)


def test_head_only_checkpoint_without_tying_is_still_refused(tmp_path):
    """Untied (tie_word_embeddings false): the embedding is missing, as transformers reports it."""
    _head_only_checkpoint(tmp_path, "dream")
    cfg = json.loads((tmp_path / "config.json").read_text())
    (tmp_path / "config.json").write_text(json.dumps({**cfg, "tie_word_embeddings": False}))
    with pytest.raises(CheckpointError, match=f"missing keys \\(1\\): {EMBED['dream']}"):
        load(tmp_path, dtype="float32")


def test_misshaped_head_only_is_refused_naming_the_stored_key(tmp_path):
    """A stored head that cannot be the embedding is not read as one: the error names the key the file holds."""
    _head_only_checkpoint(tmp_path, "dream")
    f = tmp_path / "model.safetensors"
    save_file({**load_file(str(f)), HEAD: torch.zeros(5, 3)}, str(f), metadata={"format": "pt"})
    with pytest.raises(CheckpointError) as info:
        load(tmp_path, dtype="float32")
    assert f"missing keys (1): {EMBED['dream']}" in str(info.value)
    assert f"unexpected keys (1): {HEAD}" in str(info.value) and "mis-shaped" not in str(info.value)


def test_head_only_in_a_sharded_checkpoint(tmp_path):
    """The index's weight_map names the stored head; the reader serves it as the embedding from its shard."""
    model = tiny("dream", seed=4, tie_embeddings=True)
    model.save_pretrained(tmp_path, max_shard_size=20_000)
    index = json.loads((tmp_path / "model.safetensors.index.json").read_text())
    shard = tmp_path / index["weight_map"].pop(EMBED["dream"])
    tensors = load_file(str(shard))
    tensors[HEAD] = tensors.pop(EMBED["dream"])
    save_file(tensors, str(shard), metadata={"format": "pt"})
    index["weight_map"][HEAD] = shard.name
    (tmp_path / "model.safetensors.index.json").write_text(json.dumps(index))
    loaded = load(tmp_path, dtype="float32")
    ids = random_ids(model, 2, 8)
    with torch.no_grad():
        torch.testing.assert_close(loaded.raw_logits(ids), model.raw_logits(ids), rtol=0, atol=0)
