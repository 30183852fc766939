"""DFlash checkpoints: save -> load round trips (single file and shards), the official z-lab layout
(transformers-4.57-era config.json, bf16 shards, auto_map) loaded unchanged, directories written by
the reference package loaded here and ours loaded by it, and clear errors for bad checkpoints."""

from __future__ import annotations

import json

import pytest
import torch
from safetensors.torch import load_file, save_file
from transformers import Qwen3Config, Qwen3ForCausalLM

from dllm.drafters.dflash.io import check_target, config_from_hf, load_dflash, random_dflash, save_dflash
from dllm.drafters.dflash.model import DraftKVCache, draft_block, make_block
from dllm.models.checkpoint import CheckpointError, write_safetensors
from dllm.models.loading import ModelNotFoundError

from tests.drafters.speculative_helpers import dflash_target

VOCAB, MASK, BLOCK = 101, 100, 4
NEEDS_REFERENCE = "the reference package `dflash` is not installed (pip install --no-deps dflash==0.1.0)"


@pytest.fixture(scope="module")
def target() -> Qwen3ForCausalLM:
    return dflash_target(VOCAB)


@pytest.fixture(scope="module")
def features(target) -> torch.Tensor:
    ids = torch.randint(0, MASK, (1, 10), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        out = target(ids, output_hidden_states=True)
    return torch.cat([out.hidden_states[2], out.hidden_states[4]], dim=-1)  # taps (1, 3): [1, 10, 128]


def perturbed(target, seed: int = 3):
    drafter = random_dflash(target.config, 2, BLOCK, MASK, seed=seed)
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in drafter.parameters():
            p.add_(torch.randn(p.shape, generator=gen) * 0.1)
    return drafter


def two_rounds(drafter, target, features) -> torch.Tensor:
    cache, out = DraftKVCache(drafter.config.num_layers), []
    for lo, hi in ((0, 7), (7, 10)):
        out.append(draft_block(drafter, cache, features[:, lo:hi].to(drafter.fc.weight.dtype),
                               make_block(torch.tensor([5]), BLOCK, MASK),
                               embed_tokens=target.model.embed_tokens, lm_head=target.lm_head).logits)
    return torch.cat(out, dim=1)


def assert_same_weights(a: dict, b: dict) -> None:
    assert sorted(a) == sorted(b)
    for k in a:
        assert torch.equal(a[k], b[k]), k


@pytest.mark.parametrize("shard", [None, 20_000])
def test_save_load_round_trip(shard, target, features, tmp_path):
    drafter = perturbed(target)
    save_dflash(drafter, tmp_path, max_shard_size=shard)
    assert (tmp_path / ("model.safetensors" if shard is None else "model.safetensors.index.json")).is_file()
    loaded = load_dflash(tmp_path)
    assert loaded.config == drafter.config
    assert_same_weights(loaded.state_dict(), drafter.state_dict())
    torch.testing.assert_close(two_rounds(loaded, target, features), two_rounds(drafter, target, features),
                               atol=0, rtol=0)


def official_config() -> dict:
    """A config.json as the z-lab checkpoints ship it (transformers 4.57 era), shrunk."""
    return {
        "architectures": ["DFlashDraftModel"], "attention_bias": False, "attention_dropout": 0.0,
        "auto_map": {"AutoModel": "dflash.DFlashDraftModel"}, "block_size": BLOCK, "bos_token_id": 1,
        "dflash_config": {"mask_token_id": MASK, "target_layer_ids": [1, 3]}, "eos_token_id": 2,
        "head_dim": 16, "hidden_act": "silu", "hidden_size": 64, "initializer_range": 0.02,
        "intermediate_size": 128, "layer_types": ["full_attention", "full_attention"],
        "max_position_embeddings": 40960, "max_window_layers": 2, "model_type": "qwen3",
        "num_attention_heads": 4, "num_hidden_layers": 2, "num_key_value_heads": 2, "num_target_layers": 6,
        "rms_norm_eps": 1e-06, "rope_scaling": None, "rope_theta": 1000000, "sliding_window": None,
        "tie_word_embeddings": False, "torch_dtype": "bfloat16", "transformers_version": "4.57.1",
        "use_cache": True, "use_sliding_window": False, "vocab_size": VOCAB,
    }


def write_official(directory, weights: dict, config: dict, shard=None) -> None:
    write_safetensors(weights, directory, shard)
    (directory / "config.json").write_text(json.dumps(config))


def test_official_layout_loads_unchanged_and_saves_back(target, features, tmp_path):
    weights = {k: v.to(torch.bfloat16) for k, v in perturbed(target).state_dict().items()}
    write_official(tmp_path / "official", weights, official_config(), shard=15_000)
    drafter = load_dflash(tmp_path / "official", target=target)
    assert drafter.fc.weight.dtype == torch.bfloat16  # the config's torch_dtype
    cfg = drafter.config
    assert (cfg.rope_theta, cfg.block_size, cfg.mask_token_id, cfg.target_layer_ids) == (1e6, BLOCK, MASK, (1, 3))
    assert_same_weights(drafter.state_dict(), weights)
    save_dflash(drafter, tmp_path / "again")
    hf = json.loads((tmp_path / "again" / "config.json").read_text())
    assert hf["auto_map"] == {"AutoModel": "dflash.DFlashDraftModel"} and hf["eos_token_id"] == 2
    assert hf["torch_dtype"] == hf["dtype"] == "bfloat16"
    assert config_from_hf(hf) == cfg
    again = load_dflash(tmp_path / "again", dtype="float32")
    official32 = load_dflash(tmp_path / "official", dtype=torch.float32)
    torch.testing.assert_close(two_rounds(again, target, features), two_rounds(official32, target, features),
                               atol=0, rtol=0)
    reference = pytest.importorskip("dflash.model", reason=NEEDS_REFERENCE)
    ref = reference.DFlashDraftModel.from_pretrained(tmp_path / "official", dtype=torch.float32)
    assert_same_weights(ref.state_dict(), official32.state_dict())
    assert ref.block_size == BLOCK and ref.target_layer_ids == [1, 3] and ref.mask_token_id == MASK


def test_directory_saved_by_reference_loads_here(target, features, tmp_path):
    reference = pytest.importorskip("dflash.model", reason=NEEDS_REFERENCE)
    cfg = Qwen3Config(vocab_size=VOCAB, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                      num_attention_heads=4, num_key_value_heads=2, head_dim=16, rope_theta=1e6)
    cfg.architectures, cfg.block_size, cfg.num_target_layers = ["DFlashDraftModel"], BLOCK, 6
    cfg.dflash_config = {"mask_token_id": MASK, "target_layer_ids": [1, 3]}
    torch.manual_seed(5)
    ref = reference.DFlashDraftModel(cfg).eval()
    with torch.no_grad():
        for p in ref.parameters():
            p.add_(torch.randn_like(p) * 0.1)
    ref.save_pretrained(tmp_path)
    ours = load_dflash(tmp_path)
    assert_same_weights(ours.state_dict(), ref.state_dict())
    assert ours.config.rope_theta == 1e6 and ours.config.target_layer_ids == (1, 3)
    block = make_block(torch.tensor([5]), BLOCK, MASK)
    with torch.no_grad():
        hidden = ref(target_hidden=features[:, :7], noise_embedding=target.model.embed_tokens(block),
                     position_ids=torch.arange(7 + BLOCK)[None])[:, 1:]
        expected = ref.compute_logits(hidden, target.lm_head)
    got = draft_block(ours, DraftKVCache(2), features[:, :7], block, embed_tokens=target.model.embed_tokens,
                      lm_head=target.lm_head).logits
    torch.testing.assert_close(got, expected, atol=1e-5, rtol=1e-5)


def test_ours_loads_in_reference(target, tmp_path):
    reference = pytest.importorskip("dflash.model", reason=NEEDS_REFERENCE)
    drafter = perturbed(target)
    save_dflash(drafter, tmp_path)
    ref = reference.DFlashDraftModel.from_pretrained(tmp_path, dtype=torch.float32)
    assert_same_weights(ref.state_dict(), drafter.state_dict())
    assert (ref.block_size, ref.mask_token_id, ref.target_layer_ids) == (BLOCK, MASK, [1, 3])


# ----------------------------------------------------------------------------------------------
# Bad checkpoints


def test_plain_qwen3_checkpoint_is_not_a_drafter(target, tmp_path):
    target.save_pretrained(tmp_path)
    with pytest.raises(ValueError, match="is not a DFlash drafter config") as err:
        load_dflash(tmp_path)
    msg = str(err.value)
    assert "architectures is ['Qwen3ForCausalLM']" in msg
    assert "missing num_target_layers, dflash_config.mask_token_id" in msg


def test_the_v1_loader_points_a_dflash2_checkpoint_to_its_loader(target, tmp_path):
    write_official(tmp_path, perturbed(target).state_dict(),
                   dict(official_config(), architectures=["DFlash2DraftModel"]))
    with pytest.raises(ValueError, match=r"a DFlash 2 checkpoint \(DFlash2DraftModel.*load_dflash2"):
        load_dflash(tmp_path)


@pytest.mark.parametrize("edit, message", [
    (lambda w: w.pop("hidden_norm.weight"), r"missing keys \(1\): hidden_norm.weight"),
    (lambda w: w.update({"lm_head.weight": torch.zeros(VOCAB, 64)}), r"unexpected keys \(1\): lm_head.weight"),
    (lambda w: w.update({"fc.weight": torch.zeros(64, 192)}), r"mis-shaped key fc.weight: expected \[64, 128\]"),
])
def test_key_mismatch_lists_the_keys(edit, message, target, tmp_path):
    save_dflash(perturbed(target), tmp_path)
    weights = load_file(tmp_path / "model.safetensors")
    edit(weights)
    save_file(weights, tmp_path / "model.safetensors")
    with pytest.raises(CheckpointError, match=message):
        load_dflash(tmp_path)


@pytest.mark.parametrize("change, message", [
    ({"dflash_config": {"mask_token_id": VOCAB, "target_layer_ids": [1, 3]}},
     r"mask_token_id must be an integer in \[0, 100\] \(a row of the target's embedding"),
    ({"block_size": 1}, "block_size must be an integer >= 2"),
    ({"dflash_config": {"mask_token_id": MASK, "target_layer_ids": [1, 9]}},
     r"target_layer_ids must be an integer in \[0, 5\]"),
    ({"dflash_config": {"target_layer_ids": [1, 3]}}, "missing dflash_config.mask_token_id"),
    ({"hidden_size": 64.5}, "not a valid Qwen3 config"),
])
def test_bad_config_fields(change, message, target, tmp_path):
    write_official(tmp_path, perturbed(target).state_dict(), dict(official_config(), **change))
    with pytest.raises(ValueError, match=message):
        load_dflash(tmp_path)


def test_non_finite_weights_and_missing_files(target, tmp_path):
    drafter = perturbed(target)
    with torch.no_grad():
        drafter.fc.weight[0, 0] = float("nan")
    save_dflash(drafter, tmp_path / "nan")
    with pytest.raises(CheckpointError, match=r"non-finite weights: fc.weight \(1 NaN, 0 inf\)"):
        load_dflash(tmp_path / "nan")
    (tmp_path / "empty").mkdir()
    (tmp_path / "empty" / "config.json").write_text(json.dumps(official_config()))
    with pytest.raises(CheckpointError, match="no weights in"):
        load_dflash(tmp_path / "empty")
    with pytest.raises(ModelNotFoundError):
        load_dflash(tmp_path / "nowhere")


def test_target_checks(target, tmp_path):
    with pytest.raises(ValueError, match=r"mask_token_id must be an integer in \[0, 100\]"):
        random_dflash(target.config, 2, BLOCK, VOCAB)
    with pytest.raises(ValueError, match="block_size must be an integer >= 2"):
        random_dflash(target.config, 2, 1, MASK)
    drafter = random_dflash(target.config, 2, BLOCK, MASK)
    check_target(drafter, target)  # fits (a drafter or its config)
    small = Qwen3Config(vocab_size=90, hidden_size=32, intermediate_size=64, num_hidden_layers=3,
                        num_attention_heads=4, num_key_value_heads=2, head_dim=8)
    with pytest.raises(ValueError, match="does not fit the target") as err:
        check_target(drafter.config, small)
    for part in ("hidden size 32", "3 layers", "no layer 3 to tap",
                 "90 embedding rows, so no row for mask_token_id 100"):
        assert part in str(err.value)
    save_dflash(drafter, tmp_path)
    with pytest.raises(ValueError, match="90 embedding rows"):
        load_dflash(tmp_path, target=small)
