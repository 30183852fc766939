"""DFlash 2 drafters (z-lab/dflash ``dflash/model.py``, ``DFlash2DraftModel``): the block convolution and
the candidate selector equal the reference package's on the same weights, checkpoints move both ways
between us and the reference, a batch-1 greedy loop equals ``dflash_generate`` and ``target.generate``,
and bad configs / checkpoints fail with errors naming the problem."""

from __future__ import annotations

import dataclasses
import json

import pytest
import torch
from safetensors.torch import load_file
from transformers import DynamicCache, Qwen3Config, Qwen3ForCausalLM

from dllm.drafters.dflash.dflash2.io import (config_from_hf2, config_to_hf2, dflash_version, load_any_dflash,
                                             load_dflash2, random_dflash2, save_dflash2)
from dllm.drafters.dflash.dflash2.model import (DFlash2Config, DFlash2Drafter, causal_windows, draft_block2,
                                                grouped_dynamic_conv)
from dllm.drafters.dflash.io import random_dflash, save_dflash
from dllm.drafters.dflash.model import (DFlashDrafter, DraftKVCache, extract_context_feature, make_block,
                                        target_embedding, target_head)
from dllm.drafters.target import crop_to
from dllm.models.checkpoint import CheckpointError

from tests.drafters.speculative_helpers import dflash_target

NEEDS_REFERENCE = "the reference package `dflash` is not installed (pip install --no-deps dflash==0.1.0)"
VOCAB, MASK, BLOCK = 101, 100, 4
V2 = dict(conv_kernel_size=3, conv_group_size=16, selector_top_k=8, selector_rank=8)
ROUNDS = [((0, 7), BLOCK), ((7, 10), BLOCK), ((10, 11), BLOCK), ((11, 13), 3)]  # (features [lo, hi), block size)


@pytest.fixture(scope="module")
def target() -> Qwen3ForCausalLM:
    return dflash_target(VOCAB)


@pytest.fixture(scope="module")
def features(target) -> torch.Tensor:
    """Tapped hidden states (layers 1 and 3) of one row of 16 tokens: [1, 16, 128]."""
    ids = torch.randint(0, MASK, (1, 16), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        out = target(ids, output_hidden_states=True)
    return extract_context_feature(out.hidden_states, (1, 3))


def perturb(drafter, seed: int, scale: float = 0.2):
    """Move every weight away from the init (identity conv kernels, unit norms) so each one matters."""
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in drafter.parameters():
            p.add_(torch.randn(p.shape, generator=gen) * scale)
    return drafter.eval()


def make_drafter(target, seed: int = 3, **changes) -> DFlash2Drafter:
    base = random_dflash2(target.config, 2, BLOCK, MASK, seed=seed, **V2)
    drafter = DFlash2Drafter(dataclasses.replace(base.config, **changes))
    drafter.init_weights(generator=torch.Generator().manual_seed(seed))
    return perturb(drafter, seed)


def embed_block(target, block: torch.Tensor, scale: float) -> torch.Tensor:
    return torch.nn.functional.embedding(block, target_embedding(target)) * scale


def reference_rounds(ref, target, feats, temperature: float = 0.0):
    """Per round of ROUNDS: (logits, propose's (tokens, candidates, q)) of the reference model, driven as
    its ``dflash_generate`` drives it (anchor 5)."""
    from dflash.model import _crop_to, _draft_value, _make_cache

    cache, out = _make_cache(ref.config), []
    scale = float(_draft_value(ref.config, "input_embedding_scale", 1.0))
    for (lo, hi), size in ROUNDS:
        block = make_block(torch.tensor([5]), size, MASK)
        with torch.no_grad():
            hidden = ref(target_hidden=feats[:, lo:hi], noise_embedding=embed_block(target, block, scale),
                         position_ids=torch.arange(lo, hi + size)[None], past_key_values=cache,
                         use_cache=True)[:, 1 - size:]
            _crop_to(cache, hi)
            out.append((ref.compute_logits(hidden, target.lm_head),
                        ref.propose(hidden, block[:, 0], target.lm_head, temperature)))
    return out


def our_rounds(drafter, target, feats, temperature: float = 0.0):
    cache = DraftKVCache(drafter.config.num_layers)
    return [draft_block2(drafter, cache, feats[:, lo:hi], make_block(torch.tensor([5]), size, MASK),
                         embed_tokens=target.model.embed_tokens, lm_head=target.lm_head, temperature=temperature,
                         generator=torch.Generator().manual_seed(0))
            for (lo, hi), size in ROUNDS]


# ---- the block convolution ----------------------------------------------------------------------


def test_causal_windows_and_conv_are_causal():
    x = torch.arange(1.0, 6.0).view(1, 5, 1)
    assert causal_windows(x, 3)[0, :, :, 0].tolist() == [[1, 0, 0], [2, 1, 0], [3, 2, 1], [4, 3, 2], [5, 4, 3]]
    gen = torch.Generator().manual_seed(0)
    x, base = torch.randn(2, 6, 8, generator=gen), torch.randn(3, 8, generator=gen)
    dyn = torch.randn(2, 6, 3, 2, generator=gen)  # [B, T, k, G]: groups of 4 channels
    y = grouped_dynamic_conv(x, base, dyn, 4)
    x2 = x.clone()
    x2[:, 3] += 1.0  # a later position never reaches earlier outputs
    y2 = grouped_dynamic_conv(x2, base, dyn, 4)
    assert torch.equal(y[:, :3], y2[:, :3]) and not torch.allclose(y[:, 3:], y2[:, 3:])
    identity = torch.zeros(3, 8)
    identity[0] = 1.0
    torch.testing.assert_close(grouped_dynamic_conv(x, identity, torch.zeros_like(dyn), 4), x, atol=0, rtol=0)


def test_conv_equals_reference():
    reference = pytest.importorskip("dflash.model", reason=NEEDS_REFERENCE)
    gen = torch.Generator().manual_seed(1)
    x, base = torch.randn(2, 7, 32, generator=gen), torch.randn(4, 32, generator=gen)
    dyn = torch.randn(2, 7, 4, 4, generator=gen)  # [B, T, k, G]: groups of 8 channels
    theirs = reference._grouped_dynamic_convolve(x, dyn, base, 8)
    torch.testing.assert_close(grouped_dynamic_conv(x, base, dyn, 8), theirs, atol=1e-6, rtol=1e-6)


# ---- forward and selector equal to the reference ------------------------------------------------

VARIANTS = {
    "plain": {},
    "kernel_1_one_group": {"conv_kernel_size": 1, "conv_group_size": 64},
    "causal_sliding": {"layer_types": ("full_attention", "sliding_attention"), "sliding_window": 3,
                       "is_causal": True},
    "scales_softcap": {"input_embedding_scale": 0.5, "output_multiplier": 3.0, "final_logit_softcapping": 4.0,
                       "selector_top_k": 1},
}


@pytest.mark.parametrize("variant", list(VARIANTS))
def test_forward_and_greedy_selection_equal_reference(variant, target, features, tmp_path):
    reference = pytest.importorskip("dflash.model", reason=NEEDS_REFERENCE)
    drafter = make_drafter(target, **VARIANTS[variant])
    save_dflash2(drafter, tmp_path)
    assert "candidate_selector.predecessor_codebook" in load_file(tmp_path / "model.safetensors")  # official name
    ref = reference.DFlash2DraftModel.from_pretrained(tmp_path, dtype=torch.float32).eval()
    differs = 0
    for r, ((logits, (tokens, _, q)), ours) in enumerate(zip(reference_rounds(ref, target, features),
                                                              our_rounds(drafter, target, features))):
        assert ours.logits.shape == (1, ROUNDS[r][1] - 1, VOCAB) and logits.abs().max() > 0.1
        torch.testing.assert_close(ours.logits, logits, atol=1e-5, rtol=1e-5, msg=f"{variant}: round {r}")
        assert torch.equal(ours.tokens, tokens), (variant, r)
        assert q is None and ours.probs is None
        differs += int(not torch.equal(ours.tokens, logits.argmax(-1)))
    assert variant == "scales_softcap" or differs > 0  # the selector changed some choices (top-1 cannot)


def test_sampling_distribution_equals_reference(target, features, tmp_path):
    """At T > 0 the reference draws a path; our selector scores that same path to the same q."""
    reference = pytest.importorskip("dflash.model", reason=NEEDS_REFERENCE)
    drafter = make_drafter(target)
    save_dflash2(drafter, tmp_path)
    ref = reference.DFlash2DraftModel.from_pretrained(tmp_path, dtype=torch.float32).eval()
    torch.manual_seed(0)
    theirs_rounds = reference_rounds(ref, target, features, temperature=0.7)
    for r, ((logits, (tokens, cand, q)), ours) in enumerate(zip(theirs_rounds, our_rounds(drafter, target, features))):
        sel = drafter.candidate_selector
        unary, our_cand = sel.candidates(ours.logits)
        previous = torch.cat([torch.tensor([[5]]), tokens[:, :-1]], dim=1)  # the reference's path
        with torch.no_grad():
            our_q = (sel.scores(ours.hidden, unary, our_cand, previous) / 0.7).softmax(-1)
        theirs = torch.zeros_like(logits).scatter(-1, cand, q)
        mine = torch.zeros_like(logits).scatter(-1, our_cand, our_q)
        torch.testing.assert_close(mine, theirs, atol=1e-5, rtol=1e-5, msg=f"round {r}")


def test_sampled_draft_is_reproducible_and_on_candidates(target, features):
    drafter = make_drafter(target)
    a, b = our_rounds(drafter, target, features, 1.0)[0], our_rounds(drafter, target, features, 1.0)[0]
    assert torch.equal(a.tokens, b.tokens) and a.probs.shape == (1, BLOCK - 1, V2["selector_top_k"])
    torch.testing.assert_close(a.probs.sum(-1), torch.ones(1, BLOCK - 1))
    full = a.vocab_probs()
    assert full.shape == (1, BLOCK - 1, VOCAB) and bool((full.gather(-1, a.tokens[..., None]) > 0).all())
    assert bool((a.candidates == a.tokens[..., None]).any(-1).all())


def test_reference_checkpoint_loads_unchanged(target, features, tmp_path):
    """A reference model saved by transformers (codebooks with a ``.weight`` suffix) and the same
    checkpoint with the official bare names both load here and draft the reference's logits."""
    reference = pytest.importorskip("dflash.model", reason=NEEDS_REFERENCE)
    ours = make_drafter(target)
    save_dflash2(ours, tmp_path / "ours")
    ref = reference.DFlash2DraftModel.from_pretrained(tmp_path / "ours", dtype=torch.float32).eval()
    ref.save_pretrained(tmp_path / "theirs")
    fresh = reference.DFlash2DraftModel(ref.config)  # built, not loaded: no key mapping to reverse
    fresh.load_state_dict(ref.state_dict())
    fresh.save_pretrained(tmp_path / "fresh")
    assert "candidate_selector.predecessor_codebook.weight" in load_file(tmp_path / "fresh" / "model.safetensors")
    want = [logits for logits, _ in reference_rounds(ref, target, features)]
    for name in ("theirs", "fresh"):
        loaded = load_any_dflash(tmp_path / name)
        assert isinstance(loaded, DFlash2Drafter) and loaded.config == ours.config
        for r, got in enumerate(our_rounds(loaded, target, features)):
            torch.testing.assert_close(got.logits, want[r], atol=1e-5, rtol=1e-5, msg=f"{name}: round {r}")


def test_save_load_round_trip(target, tmp_path):
    drafter = make_drafter(target).to(torch.bfloat16)
    save_dflash2(drafter, tmp_path, max_shard_size=20_000)
    loaded = load_dflash2(tmp_path)
    assert loaded.config == drafter.config and next(loaded.parameters()).dtype == torch.bfloat16
    for k, v in drafter.state_dict().items():
        assert torch.equal(loaded.state_dict()[k], v), k
    hf = json.loads((tmp_path / "config.json").read_text())
    assert hf["architectures"] == ["DFlash2DraftModel"]
    assert {k: hf["dflash_config"][k] for k in V2} == V2


# ---- a batch-1 greedy loop ----------------------------------------------------------------------



@torch.no_grad()
def greedy_dflash2(drafter, target, ids: torch.Tensor, max_new_tokens: int):
    """(sequence [1, P + new], per-round drafted tokens, per-round tokens committed)."""
    prompt_len, size = ids.shape[1], drafter.block_size
    max_len = prompt_len + max_new_tokens
    target_cache = DynamicCache(config=target.config)
    out = target(ids, past_key_values=target_cache, use_cache=True, output_hidden_states=True)
    seq = torch.cat([ids, out.logits[:, -1:].argmax(-1)], dim=1)
    features = extract_context_feature(out.hidden_states, drafter.target_layer_ids)
    cache, drafts, committed, start = DraftKVCache(drafter.config.num_layers), [], [], prompt_len
    while start + 1 < max_len:
        width = min(size, max_len - start)
        block = make_block(seq[:, start], width, drafter.mask_token_id)
        block[:, 1:] = draft_block2(drafter, cache, features, block, embed_tokens=target_embedding(target),
                                    lm_head=target_head(target)).tokens
        drafts.append(block[:, 1:].clone())
        out = target(block, position_ids=torch.arange(start, start + width)[None], past_key_values=target_cache,
                     use_cache=True, output_hidden_states=True)
        posterior = out.logits.argmax(-1)  # [1, width]
        accepted = int((block[:, 1:] == posterior[:, :-1]).cumprod(dim=1).sum())
        produced = min(accepted + 1, max_len - start - 1)
        seq = torch.cat([seq[:, :start], block[:, :accepted + 1], posterior[:, accepted:accepted + 1]], dim=1)
        start += produced
        crop_to(target_cache, start)
        features = extract_context_feature(out.hidden_states, drafter.target_layer_ids)[:, :produced]
        committed.append(produced)
    return seq[:, :min(start + 1, max_len)], drafts, committed


SMALL_VOCAB, SMALL_MASK = 13, 12
PROMPT = torch.randint(0, SMALL_MASK, (1, 9), generator=torch.Generator().manual_seed(4))


def pair(block_size: int):
    """A tiny random Qwen3 target whose arg-max is mostly one of two tokens, and a DFlash 2 drafter."""
    torch.manual_seed(0)
    cfg = Qwen3Config(vocab_size=SMALL_VOCAB, hidden_size=64, intermediate_size=128, num_hidden_layers=6,
                      num_attention_heads=4, num_key_value_heads=2, head_dim=16, initializer_range=0.1)
    target = Qwen3ForCausalLM(cfg).eval()
    with torch.no_grad():
        target.lm_head.weight[:, 0] += 3.0 * torch.randn(SMALL_VOCAB, generator=torch.Generator().manual_seed(7))
    drafter = random_dflash2(cfg, 2, block_size, SMALL_MASK, seed=1, conv_kernel_size=3, conv_group_size=16,
                             selector_top_k=4, selector_rank=8)
    return target, perturb(drafter, 1)  # seed picked so that some drafts are accepted


@pytest.mark.parametrize("block_size, max_new", [(4, 40), (6, 23)])
def test_greedy_loop_equals_generate_and_reference(block_size, max_new, tmp_path):
    target, drafter = pair(block_size)
    ours, our_drafts, committed = greedy_dflash2(drafter, target, PROMPT, max_new)
    plain = target.generate(PROMPT, max_new_tokens=max_new, do_sample=False, min_new_tokens=max_new)
    assert torch.equal(ours, plain)
    assert max(committed) > 1 and sum(committed) == max_new - 1
    reference = pytest.importorskip("dflash.model", reason=NEEDS_REFERENCE)
    save_dflash2(drafter, tmp_path)
    ref = reference.DFlash2DraftModel.from_pretrained(tmp_path, dtype=torch.float32).eval()
    their_drafts: list[torch.Tensor] = []
    propose = ref.propose
    ref.propose = lambda *a: (lambda out: their_drafts.append(out[0]) or out)(propose(*a))
    theirs = reference.dflash_generate(ref, target, PROMPT, max_new, None)
    assert torch.equal(ours, theirs)
    assert len(our_drafts) == len(their_drafts)
    for r, (a, b) in enumerate(zip(our_drafts, their_drafts)):
        assert torch.equal(a, b), f"round {r}"


# ---- errors -------------------------------------------------------------------------------------


def v2_config_json(target, **changes) -> dict:
    hf = config_to_hf2(random_dflash2(target.config, 2, BLOCK, MASK, **V2).config)
    hf.update(changes)
    return hf


def test_config_that_is_neither_version_is_refused(target, tmp_path):
    hf = v2_config_json(target, architectures=["LlamaForCausalLM"])
    with pytest.raises(ValueError, match=r"not a DFlash drafter config: architectures is \['LlamaForCausalLM'\], "
                                         r"expected \['DFlashDraftModel'\] \(DFlash\) or \['DFlash2DraftModel'\]"):
        config_from_hf2(hf)
    save_dflash2(make_drafter(target), tmp_path)
    (tmp_path / "config.json").write_text(json.dumps(hf))
    with pytest.raises(ValueError, match="not a DFlash drafter config"):
        load_any_dflash(tmp_path)
    with pytest.raises(ValueError, match=r"is a DFlash \(v1\) config"):
        config_from_hf2(v2_config_json(target, architectures=["DFlashDraftModel"]))


def test_missing_dflash2_fields_are_named(target):
    hf = v2_config_json(target)
    for name in ("conv_kernel_size", "selector_rank"):
        del hf["dflash_config"][name]
    del hf["num_target_layers"]
    with pytest.raises(ValueError, match=r"missing DFlash 2 field\(s\) dflash_config.conv_kernel_size, "
                                         r"dflash_config.selector_rank; .*missing num_target_layers"):
        config_from_hf2(hf)
    top = v2_config_json(target)  # the reference also reads the fields from the top level
    top.update({k: top["dflash_config"].pop(k) for k in V2})
    assert config_from_hf2(top).selector_top_k == V2["selector_top_k"]
    assert dflash_version({k: v for k, v in top.items() if k != "architectures"}) == 2
    bad = v2_config_json(target)
    bad["dflash_config"]["conv_group_size"] = 24
    with pytest.raises(ValueError, match=r"conv_group_size \(24\) must divide hidden_size \(64\)"):
        config_from_hf2(bad)


def test_missing_dflash2_weights_are_named(target, tmp_path):
    """A DFlash (v1) checkpoint relabelled DFlash 2: every DFlash 2 key is reported missing."""
    save_dflash(random_dflash(target.config, 2, BLOCK, MASK), tmp_path)
    (tmp_path / "config.json").write_text(json.dumps(v2_config_json(target)))
    with pytest.raises(CheckpointError) as err:
        load_dflash2(tmp_path)
    message = str(err.value)
    assert "missing keys (11)" in message
    for key in ("layers.0.attention_conv.base_kernel", "layers.1.mlp_conv.kernel_projection.weight",
                "candidate_selector.predecessor_codebook", "candidate_selector.hidden_projection.weight"):
        assert key in message
    (tmp_path / "config.json").write_text(json.dumps(v2_config_json(target, architectures=["DFlashDraftModel"])))
    assert type(load_any_dflash(tmp_path)) is DFlashDrafter  # the same weights as DFlash: dispatched to v1


def test_drafter_type_checks(target):
    v1 = random_dflash(target.config, 2, BLOCK, MASK)
    with pytest.raises(TypeError, match="DFlash2Drafter needs a DFlash2Config"):
        DFlash2Drafter(v1.config)
    with pytest.raises(TypeError, match="draft_block2 needs a DFlash2Drafter"):
        draft_block2(v1, DraftKVCache(2), torch.zeros(1, 2, 128), make_block(torch.tensor([1]), BLOCK, MASK),
                     embed_tokens=target.model.embed_tokens, lm_head=target.lm_head)
    assert isinstance(make_drafter(target).config, DFlash2Config)


# ---- through the registered drafter and the production loop --------------------------------------


def test_registered_dflash_drafter_serves_dflash2_losslessly(tmp_path):
    from dllm.drafters.base import make_drafter as make_registered
    from dllm.drafters.loop import speculative_generate

    target, drafter = pair(6)
    save_dflash2(drafter, tmp_path)
    spec = make_registered(f"dflash:model={tmp_path}")  # load_any_dflash reads the architecture
    assert isinstance(spec.model, DFlash2Drafter)
    rows = [PROMPT[0].tolist(), PROMPT[0, :5].tolist(), PROMPT[0, 2:].tolist()]  # ragged
    out = speculative_generate(target, spec, rows, max_new_tokens=20, eos_token_id=[])
    for row, prompt in zip(out.generated, rows):
        ref = target.generate(torch.tensor([prompt]), max_new_tokens=20, do_sample=False, min_new_tokens=20)
        assert row == ref[0, len(prompt):].tolist()
    assert max(a for acc in out.acceptance for a in acc) > 1  # some drafts accepted
    sampled = [speculative_generate(target, spec, rows, max_new_tokens=12, temperature=0.8, seed=3, eos_token_id=[])
               for _ in range(2)]
    assert sampled[0].generated == sampled[1].generated  # seeded: reproducible
