"""The DFlash drafter module: forward equal to the reference package's ``DFlashDraftModel`` on the same
weights (several rounds through the draft KV cache, attention variants), ragged batches equal to
their rows alone, the cache's crop/select, the tap helpers and the argument checks."""

from __future__ import annotations

import dataclasses

import pytest
import torch
import torch.nn.functional as F
from transformers import Qwen3ForCausalLM

from dllm.drafters.dflash.config import SLIDING_ATTENTION, DFlashConfig, tap_layer_ids
from dllm.drafters.dflash.io import random_dflash, save_dflash
from dllm.drafters.dflash.model import (DFlashDrafter, DraftKVCache, draft_block, extract_context_feature,
                                        make_block)

from tests.drafters.speculative_helpers import dflash_target

VOCAB, MASK, BLOCK = 101, 100, 4  # id 100 is a spare embedding row: the mask token
NEEDS_REFERENCE = "the reference package `dflash` is not installed (pip install --no-deps dflash==0.1.0)"


@pytest.fixture(scope="module")
def target() -> Qwen3ForCausalLM:
    return dflash_target(VOCAB)


@pytest.fixture(scope="module")
def features(target) -> torch.Tensor:
    """Tapped hidden states (layers 1 and 3) of 2 rows x 16 tokens: [2, 16, 128]."""
    ids = torch.randint(0, MASK, (2, 16), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        out = target(ids, output_hidden_states=True)
    return extract_context_feature(out.hidden_states, (1, 3))


def make_drafter(target, seed: int = 3, **changes) -> DFlashDrafter:
    """A random 2-layer drafter with every weight (norms included) perturbed, so a swapped norm shows."""
    base = random_dflash(target.config, 2, BLOCK, MASK, seed=seed)
    drafter = DFlashDrafter(dataclasses.replace(base.config, **changes))
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in drafter.parameters():
            p.copy_(torch.randn(p.shape, generator=gen) * 0.1 + (1.0 if p.dim() == 1 else 0.0))
    return drafter.eval()


def block_of(ids: list[int], size: int = BLOCK) -> torch.Tensor:
    """[len(ids), size] blocks with anchors ``ids``."""
    return make_block(torch.tensor(ids), size, MASK)


# Rounds: (new features as [lo, hi) of the feature rows, block size); the anchor position is hi.
ROUNDS = [((0, 7), BLOCK), ((7, 10), BLOCK), ((10, 11), BLOCK), ((11, 13), 3)]

VARIANTS = {
    "plain": {},
    "gqa_one_kv_head": {"num_kv_heads": 1},
    "sliding_window": {"layer_types": ("full_attention", SLIDING_ATTENTION), "sliding_window": 3},
    "causal": {"is_causal": True},
    "yarn_rope": {"rope_scaling": (("factor", 4.0), ("original_max_position_embeddings", 8),
                                   ("rope_type", "yarn")), "max_position_embeddings": 32},
    "bias_and_scales": {"attention_bias": True, "input_embedding_scale": 0.5, "output_multiplier": 3.0,
                        "final_logit_softcapping": 4.0},
}


def reference_rounds(ref, target, feats: torch.Tensor) -> list[torch.Tensor]:
    """Draft logits of the reference model over ROUNDS, driven as its ``dflash_generate`` does."""
    from dflash.model import _crop_to, _draft_value, _make_cache, _raw_input_embeddings

    cache, out = _make_cache(ref.config), []
    for (lo, hi), size in ROUNDS:
        block = block_of([5], size)
        scale = float(_draft_value(ref.config, "input_embedding_scale", 1.0))
        with torch.no_grad():
            hidden = ref(target_hidden=feats[:, lo:hi], noise_embedding=_raw_input_embeddings(target, block, scale),
                         position_ids=torch.arange(lo, hi + size)[None], past_key_values=cache,
                         use_cache=True)[:, 1 - size:]
            out.append(ref.compute_logits(hidden, target.lm_head))
        _crop_to(cache, hi)
    return out


def our_rounds(drafter, target, feats: torch.Tensor, cache=None) -> list[torch.Tensor]:
    cache = cache if cache is not None else DraftKVCache(drafter.config.num_layers)
    return [draft_block(drafter, cache, feats[:, lo:hi], block_of([5], size),
                        embed_tokens=target.model.embed_tokens, lm_head=target.lm_head).logits
            for (lo, hi), size in ROUNDS]


@pytest.mark.parametrize("variant", list(VARIANTS))
def test_forward_equals_reference_package(variant, target, features, tmp_path):
    dflash_model = pytest.importorskip("dflash.model", reason=NEEDS_REFERENCE)
    drafter = make_drafter(target, **VARIANTS[variant])
    save_dflash(drafter, tmp_path)
    ref = dflash_model.DFlashDraftModel.from_pretrained(tmp_path, dtype=torch.float32).eval()
    feats = features[:1]
    theirs, ours = reference_rounds(ref, target, feats), our_rounds(drafter, target, feats)
    for r, (a, b) in enumerate(zip(theirs, ours)):
        assert a.shape == b.shape == (1, ROUNDS[r][1] - 1, VOCAB)
        assert a.abs().max() > 0.1  # the logits carry signal
        torch.testing.assert_close(b, a, atol=1e-5, rtol=1e-5, msg=f"{variant}: round {r}")


def test_ragged_batch_equals_each_row_alone(target, features):
    """Rows committing different numbers of tokens (left padding in the prompt, right padding later)."""
    drafter = make_drafter(target, layer_types=("full_attention", SLIDING_ATTENTION), sliding_window=4)
    # per round: (features of row 0, of row 1) as [lo, hi); padded to a common width with a mask
    rounds = [((0, 5), (0, 8)), ((5, 9), (8, 9)), ((9, 10), (9, 12))]
    alone = []
    for row in range(2):
        cache = DraftKVCache(2)
        alone.append([draft_block(drafter, cache, features[row:row + 1, r[row][0]:r[row][1]], block_of([7 + row]),
                                  embed_tokens=target.model.embed_tokens, lm_head=target.lm_head).logits[0]
                      for r in rounds])
    cache = DraftKVCache(2)
    for k, r in enumerate(rounds):
        width = max(hi - lo for lo, hi in r)
        feats = torch.zeros(2, width, features.shape[-1])
        mask = torch.zeros(2, width, dtype=torch.bool)
        for row, (lo, hi) in enumerate(r):
            n = hi - lo
            cols = slice(width - n, width) if k == 0 else slice(0, n)  # prompt left-padded, then right-padded
            feats[row, cols], mask[row, cols] = features[row, lo:hi], True
        got = draft_block(drafter, cache, feats, block_of([7, 8]), feature_mask=mask,
                          embed_tokens=target.model.embed_tokens, lm_head=target.lm_head)
        for row in range(2):
            torch.testing.assert_close(got.logits[row], alone[row][k], atol=1e-5, rtol=1e-5)
        assert got.tokens.shape == (2, BLOCK - 1)
    assert cache.num_tokens.tolist() == [10, 12]


def test_cache_keeps_only_context_and_crops(target, features):
    drafter = make_drafter(target)
    embed, head = target.model.embed_tokens, target.lm_head
    cache = DraftKVCache(2)
    draft_block(drafter, cache, features[:1, :7], block_of([5]), embed_tokens=embed, lm_head=head)
    assert cache.length == 7 and cache.keys[0].shape == (1, 2, 7, 16)  # the block's K/V are not kept
    first = draft_block(drafter, cache, features[:1, 7:10], block_of([5]), embed_tokens=embed, lm_head=head)
    assert cache.length == 10 and cache.positions[0].tolist() == list(range(10))
    cache.crop(7)  # roll back round 2, then redo it
    again = draft_block(drafter, cache, features[:1, 7:10], block_of([5]), embed_tokens=embed, lm_head=head)
    torch.testing.assert_close(again.logits, first.logits, atol=0, rtol=0)
    with pytest.raises(ValueError, match=r"crop length must be an int in \[0, 10\]"):
        cache.crop(11)


def test_cache_select_rows(target, features):
    drafter = make_drafter(target)
    embed, head = target.model.embed_tokens, target.lm_head
    both, one = DraftKVCache(2), DraftKVCache(2)
    draft_block(drafter, both, features[:, :6], block_of([1, 2]), embed_tokens=embed, lm_head=head)
    draft_block(drafter, one, features[1:, :6], block_of([2]), embed_tokens=embed, lm_head=head)
    both.select(torch.tensor([1]))
    a = draft_block(drafter, both, features[1:, 6:8], block_of([3]), embed_tokens=embed, lm_head=head)
    b = draft_block(drafter, one, features[1:, 6:8], block_of([3]), embed_tokens=embed, lm_head=head)
    torch.testing.assert_close(a.logits, b.logits, atol=1e-6, rtol=1e-6)
    with pytest.raises(ValueError, match="the draft cache holds 1 rows, but this round has 2"):
        draft_block(drafter, both, features[:, 8:9], block_of([1, 2]), embed_tokens=embed, lm_head=head)


def test_tap_layer_ids():
    assert tap_layer_ids(36, 5) == (1, 9, 17, 25, 33)  # Qwen3-8B
    assert tap_layer_ids(36, 1) == (18,)
    assert tap_layer_ids(6, 2) == (1, 3)


def test_tap_layer_ids_equal_reference():
    reference = pytest.importorskip("dflash.model", reason=NEEDS_REFERENCE)
    for n in range(4, 40):
        for layers in range(1, 9):
            assert list(tap_layer_ids(n, layers)) == reference.build_target_layer_ids(n, layers), (n, layers)


def test_extract_context_feature_offset():
    states = [torch.full((1, 2, 3), float(i)) for i in range(5)]  # embeddings + 4 layers
    feat = extract_context_feature(states, (0, 2))
    assert feat.shape == (1, 2, 6)
    assert feat[0, 0].tolist() == [1.0] * 3 + [3.0] * 3  # layer i is hidden_states[i + 1]
    with pytest.raises(ValueError, match=r"tapped target layer 4 needs hidden_states\[5\]"):
        extract_context_feature(states, (4,))


def test_draft_block_argument_errors(target, features):
    drafter = make_drafter(target)
    embed, head = target.model.embed_tokens, target.lm_head
    with pytest.raises(ValueError, match="T >= 2"):
        draft_block(drafter, DraftKVCache(2), features[:1, :4], block_of([5], 1), embed_tokens=embed, lm_head=head)
    with pytest.raises(ValueError, match="a row for mask_token_id 100"):
        draft_block(drafter, DraftKVCache(2), features[:1, :4], block_of([5]), embed_tokens=embed.weight[:50],
                    lm_head=head)
    with pytest.raises(ValueError, match="fc expects 128 = 2 tapped layers x hidden size 64"):
        draft_block(drafter, DraftKVCache(2), features[:1, :4, :64], block_of([5]), embed_tokens=embed, lm_head=head)


def test_config_errors(target):
    cfg = random_dflash(target.config, 2, BLOCK, MASK).config
    with pytest.raises(ValueError, match="block_size must be an integer >= 2"):
        dataclasses.replace(cfg, block_size=1)
    with pytest.raises(ValueError, match=r"mask_token_id must be an integer in \[0, 100\]"):
        dataclasses.replace(cfg, mask_token_id=VOCAB)
    with pytest.raises(ValueError, match=r"target_layer_ids must be an integer in \[0, 5\]"):
        dataclasses.replace(cfg, target_layer_ids=(1, 6))
    with pytest.raises(ValueError, match="layer_types has 1 entries for 2 layers"):
        dataclasses.replace(cfg, layer_types=("full_attention",))
    with pytest.raises(ValueError, match="'dynamic'"):
        dataclasses.replace(cfg, rope_scaling=(("factor", 2.0), ("rope_type", "dynamic")))
    with pytest.raises(ValueError, match="hidden_act 'tanh' is not supported"):
        DFlashDrafter(dataclasses.replace(cfg, hidden_act="tanh"))
    assert isinstance(cfg, DFlashConfig) and cfg.target_layer_ids == (1, 3)


def test_forward_without_cache_and_dtype(target, features):
    """No cache: the context is attended once; a bf16 drafter takes float32 target features."""
    drafter = make_drafter(target)
    embeds = F.embedding(block_of([5]), target.model.embed_tokens.weight)
    with torch.no_grad():
        h = drafter(embeds, features[:1, :7])
        cached = drafter(embeds, features[:1, :7], cache=DraftKVCache(2))
        low = drafter.to(torch.bfloat16)(embeds, features[:1, :7])
    torch.testing.assert_close(h, cached, atol=0, rtol=0)
    assert low.dtype == torch.bfloat16 and (low.float() - h).abs().max() < 0.1


def test_explicit_mask_trains_several_blocks_in_one_forward(target, features):
    """The training layout: blocks at anchors 4 and 9 after the 12 context features, each block
    seeing the context strictly before its anchor and itself only -> each block drafted alone."""
    drafter = make_drafter(target)
    weight = target.model.embed_tokens.weight
    anchors, n_ctx = (4, 9), 12
    blocks = [F.embedding(block_of([3 + j]), weight) for j in range(2)]  # [1, B, D] each
    with torch.no_grad():
        alone = [drafter(blocks[j], features[:1, :a]) for j, a in enumerate(anchors)]
        block_pos = torch.cat([a + torch.arange(BLOCK) for a in anchors])[None]  # [1, 2B]
        ctx_pos = torch.arange(n_ctx)
        owner = torch.arange(2 * BLOCK) // BLOCK  # block of each query / block key
        sees_ctx = ctx_pos[None, :] < torch.tensor(anchors)[owner][:, None]  # [2B, n_ctx]
        sees_block = owner[:, None] == owner[None, :]  # [2B, 2B]
        mask = torch.cat([sees_ctx, sees_block], dim=1)[None, None]  # [1, 1, 2B, n_ctx + 2B]
        together = drafter(torch.cat(blocks, dim=1), features[:1, :n_ctx], block_positions=block_pos,
                           attn_mask=mask)
    torch.testing.assert_close(together, torch.cat(alone, dim=1), atol=1e-5, rtol=1e-5)
