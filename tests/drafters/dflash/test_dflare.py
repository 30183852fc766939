"""DFlare (arXiv 2606.02091; Tencent/AngelSlim ``QwenDFlareDraftModel``): the model against the
transcribed reference (``tests/reference/modelling/dflare_modeling.py``), checkpoints in the authors'
layout both ways, dispatch through ``load_any_dflash`` / the registered ``dflash`` drafter, and greedy
speculative decoding equal to ``target.generate``."""

from __future__ import annotations

import json

import pytest
import torch
from safetensors.torch import load_file
from transformers import DynamicCache

from dllm.drafters.dflash.cache import DraftKVCache
from dllm.drafters.dflash.dflare.io import (config_from_hf_dflare, load_dflare, random_dflare, save_dflare)
from dllm.drafters.dflash.dflare.model import DFlareConfig, DFlareDrafter, fuse_layers, fusion_init
from dllm.drafters.dflash.dflash2.io import load_any_dflash
from dllm.drafters.dflash.io import load_dflash, random_dflash, save_dflash
from dllm.drafters.dflash.model import DFlashDrafter, draft_block, make_block
from dllm.models.checkpoint import CheckpointError
from tests.drafters.speculative_helpers import dflash_target
from tests.reference.modelling.dflare_modeling import QwenDFlareDraftModel, ref_crop, ref_spec_generate

VOCAB, MASK, BLOCK = 101, 100, 6
TAPS = (0, 1, 2, 3, 4, 5)  # every layer of the 6-layer target: many taps, more than draft layers


@pytest.fixture(scope="module")
def target():
    """The tiny random Qwen3 target; one dominant hidden dimension in its head, so that its arg-max is
    mostly one of a few tokens and random drafts are sometimes accepted (rounds commit several tokens)."""
    model = dflash_target(VOCAB)
    with torch.no_grad():
        model.lm_head.weight[:, 0] += 3.0 * torch.randn(VOCAB, generator=torch.Generator().manual_seed(7))
    return model


def perturbed(target, seed: int = 3, layers: int = 2, block: int = BLOCK, taps=TAPS) -> DFlareDrafter:
    """A random DFlare drafter moved away from its init (fusion logits included), so every weight matters."""
    drafter = random_dflare(target.config, layers, block, MASK, seed=seed, target_layer_ids=taps)
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in drafter.parameters():
            p.add_(torch.randn(p.shape, generator=gen) * 0.1)
        drafter.layer_fusion_weights.add_(torch.randn(drafter.layer_fusion_weights.shape, generator=gen))
    return drafter


def full_rounds(lengths: list[int], block: int, max_new: int) -> int:
    """How many rounds of the reference verify a whole block: ours trims a block that would pass
    ``max_new`` (as ``dflash_generate`` does), the AngelSlim loop does not, so later rounds may differ."""
    offset, n = 0, 0
    while n < len(lengths) and offset + block <= max_new:
        offset, n = offset + lengths[n], n + 1
    return n


def reference(path) -> QwenDFlareDraftModel:
    model, info = QwenDFlareDraftModel.from_pretrained(path, dtype=torch.float32, output_loading_info=True)
    assert not any(info[k] for k in ("missing_keys", "unexpected_keys", "mismatched_keys")), info
    return model.eval()


# ---- the model ------------------------------------------------------------------------------------------


def test_fusion_init_and_mixture():
    assert fusion_init(2, 4).tolist() == [[2, 0, 0, 0], [0, 0, 2, 0]]
    assert fusion_init(7, 9).argmax(dim=1).tolist() == [0, 1, 2, 3, 5, 6, 7]  # the authors' 7 layers x 9 taps
    assert fusion_init(3, 2).argmax(dim=1).tolist() == [0, 0, 1]  # more layers than taps
    feats = torch.randn(2, 5, 3 * 4)
    logits = torch.randn(2, 3)
    mixed = fuse_layers(feats, logits)  # [2, 5, 2, 4]
    w = logits.softmax(dim=1)
    for layer in range(2):
        want = sum(w[layer, t] * feats[..., 4 * t:4 * (t + 1)] for t in range(3))
        torch.testing.assert_close(mixed[:, :, layer], want)


def test_config_refuses_what_the_reference_does_not_run(target):
    base = random_dflare(target.config, 2, BLOCK, MASK).config
    fields = {f: getattr(base, f) for f in base.__dataclass_fields__}
    for change, word in [({"layer_types": ("sliding_attention", "full_attention"), "sliding_window": 4}, "sliding"),
                         ({"is_causal": True}, "causal"), ({"output_multiplier": 2.0}, "output_multiplier"),
                         ({"input_embedding_scale": 3.0}, "input_embedding_scale"),
                         ({"final_logit_softcapping": 30.0}, "softcapping")]:
        with pytest.raises(ValueError, match=word):
            DFlareConfig(**{**fields, **change})
    with pytest.raises(TypeError, match="DFlareDrafter needs a DFlareConfig"):
        DFlareDrafter(random_dflash(target.config, 2, BLOCK, MASK).config)


def test_layers_get_distinct_contexts_through_their_own_projections(target):
    drafter = perturbed(target)
    assert not hasattr(drafter, "fc") and "fc.weight" not in drafter.state_dict()
    feats = torch.randn(1, 4, len(TAPS) * 64)
    ctx = drafter.layer_contexts(feats)
    assert len(ctx) == 2 and ctx[0].shape == (1, 4, 64) and not torch.allclose(ctx[0], ctx[1])
    block = make_block(torch.tensor([5]), BLOCK, MASK)
    base = draft_block(drafter, DraftKVCache(2), feats, block, embed_tokens=target.model.embed_tokens,
                       lm_head=target.lm_head).logits
    with torch.no_grad():  # the context's own K projection matters; the block's k_proj is not used for it
        drafter.layers[0].self_attn.k_proj_target.weight.mul_(1.5)
    moved = draft_block(drafter, DraftKVCache(2), feats, block, embed_tokens=target.model.embed_tokens,
                        lm_head=target.lm_head).logits
    assert not torch.allclose(base, moved)
    with pytest.raises(ValueError, match="6 tapped layers x hidden size 64"):
        draft_block(drafter, DraftKVCache(2), feats[..., :64], block, embed_tokens=target.model.embed_tokens,
                    lm_head=target.lm_head)


def test_draft_rounds_equal_the_reference_forward(target, tmp_path):
    """Two rounds through the context caches: our logits equal the transcribed model's."""
    drafter = perturbed(target)
    save_dflare(drafter, tmp_path)
    ref = reference(tmp_path)
    ids = torch.randint(0, MASK, (1, 9), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        hs = target(ids, output_hidden_states=True).hidden_states
    feats = torch.cat([hs[i + 1] for i in TAPS], dim=-1)  # [1, 9, 6*64]
    ours_cache, ref_cache = DraftKVCache(2), DynamicCache()
    for lo, hi, anchor in ((0, 6, 7), (6, 9, 3)):
        block = make_block(torch.tensor([anchor]), BLOCK, MASK)
        ours = draft_block(drafter, ours_cache, feats[:, lo:hi], block, embed_tokens=target.model.embed_tokens,
                           lm_head=target.lm_head).logits
        with torch.no_grad():
            pos = torch.arange(ref_cache.get_seq_length(), hi + BLOCK)[None]
            hidden = ref(position_ids=pos, noise_embedding=target.model.embed_tokens(block),
                         target_hidden=feats[:, lo:hi], past_key_values=ref_cache, use_cache=True, is_causal=False)
            ref_crop(ref_cache, hi)
            theirs = target.lm_head(hidden[:, 1:])
        torch.testing.assert_close(ours, theirs, atol=2e-5, rtol=1e-4)


def test_static_draft_equals_the_general_path(target):
    """The batch-1 preallocated path (``static_draft.py``) drafts DFlare's per-layer contexts as the cache path."""
    from dllm.drafters.dflash.static_draft import StaticDraft, static_draft_issue

    drafter = perturbed(target)
    assert static_draft_issue(drafter) is None
    feats = torch.randn(1, 9, len(TAPS) * 64, generator=torch.Generator().manual_seed(2))
    static, cache = StaticDraft(drafter), DraftKVCache(2)
    for lo, hi, anchor in ((0, 6, 7), (6, 9, 3)):
        block = make_block(torch.tensor([anchor]), BLOCK, MASK)
        a = draft_block(drafter, static, feats[:, lo:hi], block, embed_tokens=target.model.embed_tokens,
                        lm_head=target.lm_head)
        b = draft_block(drafter, cache, feats[:, lo:hi], block, embed_tokens=target.model.embed_tokens,
                        lm_head=target.lm_head)
        torch.testing.assert_close(a.logits, b.logits, atol=2e-5, rtol=1e-4)


# ---- checkpoints -------------------------------------------------------------------------------------


def test_save_load_round_trip_in_the_authors_layout(target, tmp_path):
    drafter = perturbed(target)
    save_dflare(drafter, tmp_path / "ours")
    hf = json.loads((tmp_path / "ours" / "config.json").read_text())
    assert hf["architectures"] == ["QwenDFlareDraftModel"] and hf["dflash_config"]["target_layer_ids"] == list(TAPS)
    assert hf["block_size"] == BLOCK and hf["num_target_layers"] == 6 and hf["dflash_config"]["mask_token_id"] == MASK
    stored = load_file(tmp_path / "ours" / "model.safetensors")
    assert stored["layer_fusion_weights"].shape == (2, 6) and "fc.weight" not in stored
    assert stored["layers.1.self_attn.v_proj_target.weight"].shape == (2 * 16, 64)
    back = load_dflare(tmp_path / "ours")
    assert isinstance(back, DFlareDrafter) and back.config == drafter.config
    for k, v in drafter.state_dict().items():
        assert torch.equal(back.state_dict()[k], v), k
    # the reference reads ours (strictly: no missing / unexpected keys) with the same weights ...
    ref = reference(tmp_path / "ours")
    assert ref.target_layer_ids == list(TAPS) and ref.block_size == BLOCK and ref.mask_token_id == MASK
    for k, v in ref.state_dict().items():
        assert torch.equal(stored[k], v), k
    # ... and what the reference writes (its save_pretrained, its extra config fields) loads and saves back
    ref.config.num_anchors = 512  # a training field of the authors' config: carried through unchanged
    ref.save_pretrained(tmp_path / "theirs")
    again = load_any_dflash(tmp_path / "theirs")
    assert isinstance(again, DFlareDrafter) and again.config == drafter.config
    save_dflare(again, tmp_path / "again")
    resaved = load_file(tmp_path / "again" / "model.safetensors")
    theirs = load_file(tmp_path / "theirs" / "model.safetensors")
    assert sorted(resaved) == sorted(theirs) and all(torch.equal(resaved[k], theirs[k]) for k in theirs)
    assert json.loads((tmp_path / "again" / "config.json").read_text())["num_anchors"] == 512
    assert reference(tmp_path / "again").state_dict().keys() == ref.state_dict().keys()


def test_loader_errors_and_dispatch(target, tmp_path):
    save_dflare(perturbed(target), tmp_path / "dflare")
    with pytest.raises(ValueError, match="DFlare checkpoint.*load_dflare"):
        load_dflash(tmp_path / "dflare")
    save_dflash(random_dflash(target.config, 2, BLOCK, MASK), tmp_path / "dflash")
    with pytest.raises(ValueError, match="not a DFlare drafter config"):
        load_dflare(tmp_path / "dflash")
    assert type(load_any_dflash(tmp_path / "dflash")) is DFlashDrafter
    hf = json.loads((tmp_path / "dflare" / "config.json").read_text())
    (tmp_path / "dflash" / "config.json").write_text(json.dumps(hf))  # a DFlare config over DFlash weights
    with pytest.raises(CheckpointError, match="layer_fusion_weights"):
        load_any_dflash(tmp_path / "dflash")
    with pytest.raises(ValueError, match="sliding"):
        config_from_hf_dflare({**hf, "layer_types": ["sliding_attention"] * 2, "sliding_window": 8})
    with pytest.raises(TypeError, match="save_dflare needs a DFlareDrafter"):
        save_dflare(random_dflash(target.config, 2, BLOCK, MASK), tmp_path / "x")
    bf16 = load_dflare(tmp_path / "dflare", dtype="bfloat16")
    assert bf16.layer_fusion_weights.dtype == torch.bfloat16 and bf16.dtype == torch.bfloat16


# ---- decoding -------------------------------------------------------------------------------------------


def test_registered_dflash_drafter_serves_dflare_losslessly(target, tmp_path):
    from dllm.drafters.base import make_drafter
    from dllm.drafters.loop import speculative_generate

    save_dflare(perturbed(target), tmp_path)
    spec = make_drafter("dflash", model=str(tmp_path))
    assert isinstance(spec.model, DFlareDrafter) and spec.target_layers == TAPS
    gen = torch.Generator().manual_seed(4)
    rows = [torch.randint(0, MASK, (n,), generator=gen).tolist() for n in (9, 5, 12)]  # ragged batch
    out = speculative_generate(target, spec, rows, max_new_tokens=25, eos_token_id=[])
    for row, prompt in zip(out.generated, rows):
        ref = target.generate(torch.tensor([prompt]), max_new_tokens=25, do_sample=False, min_new_tokens=25)
        assert row == ref[0, len(prompt):].tolist()
    assert max(a for acc in out.acceptance for a in acc) > 2  # drafts were accepted: multi-token rounds
    for prompt in rows:  # batch 1 (the fast loop), and the transcribed reference loop
        one = speculative_generate(target, spec, [prompt], max_new_tokens=25, eos_token_id=[])
        theirs, lengths = ref_spec_generate(reference(tmp_path), target, torch.tensor([prompt]), 25, None)
        assert one.generated[0] == theirs[0, len(prompt):].tolist() == out.generated[rows.index(prompt)]
        n = full_rounds(lengths, BLOCK, 25)
        assert one.acceptance[0][:n] == lengths[:n] and n >= 10


def test_int8_dflare_drafter_stays_lossless(target, tmp_path):
    """Weight-only int8 (the context projections included) changes drafts, never the output."""
    from dllm.drafters.base import make_drafter
    from dllm.drafters.loop import speculative_generate

    save_dflare(perturbed(target), tmp_path)
    spec = make_drafter("dflash", model=str(tmp_path), quantization="int8")
    assert isinstance(spec.model, DFlareDrafter)
    prompt = torch.randint(0, MASK, (9,), generator=torch.Generator().manual_seed(5)).tolist()
    out = speculative_generate(target, spec, [prompt], max_new_tokens=20, eos_token_id=[])
    ref = target.generate(torch.tensor([prompt]), max_new_tokens=20, do_sample=False, min_new_tokens=20)
    assert out.generated[0] == ref[0, len(prompt):].tolist()


def test_the_authors_qwen3_4b_config_parses():
    """The fields of AngelSlim's ``configs/qwen3_dflare.json`` (Qwen3-4B target, 7 draft layers, 9 taps,
    with its training extras) read as a DFlare config, and write back with the extras kept."""
    from dllm.drafters.dflash.dflare.io import config_to_hf_dflare

    hf = {"architectures": ["QwenDFlareDraftModel"], "attention_bias": False, "attention_dropout": 0.0,
          "block_size": 16, "bos_token_id": 151643, "eos_token_id": 151645, "head_dim": 128, "hidden_act": "silu",
          "dflash_config": {"mask_token_id": 151669, "target_layer_ids": [1, 5, 9, 13, 17, 21, 25, 29, 33]},
          "dtype": "bfloat16", "torch_dtype": "bfloat16", "hidden_size": 2560, "initializer_range": 0.02,
          "intermediate_size": 9728, "layer_types": ["full_attention"] * 7, "max_position_embeddings": 40960,
          "max_window_layers": 7, "model_type": "qwen3", "num_attention_heads": 32, "num_hidden_layers": 7,
          "num_key_value_heads": 8, "num_target_layers": 36, "rms_norm_eps": 1e-06, "rope_scaling": None,
          "rope_theta": 1000000, "sliding_window": None, "tie_word_embeddings": True, "use_cache": True,
          "use_sliding_window": False, "vocab_size": 151936, "num_anchors": 512, "loss_decay_gamma": 7.0,
          "attention_backend": "flex_attention"}
    cfg = config_from_hf_dflare(hf)
    assert (cfg.num_layers, cfg.num_taps, cfg.hidden_size, cfg.num_kv_heads, cfg.head_dim) == (7, 9, 2560, 8, 128)
    assert cfg.rope_theta == 1e6 and cfg.mask_token_id == 151669 and cfg.block_size == 16
    with torch.device("meta"):
        model = DFlareDrafter(cfg)
    assert model.layer_fusion_weights.shape == (7, 9)
    assert model.layers[6].self_attn.k_proj_target.weight.shape == (8 * 128, 2560)
    out = config_to_hf_dflare(cfg, hf, torch.bfloat16)
    assert out["architectures"] == ["QwenDFlareDraftModel"] and out["attention_backend"] == "flex_attention"
    assert out["dflash_config"] == hf["dflash_config"] and config_from_hf_dflare(out) == cfg
