"""The block-diffusion objective (dllm/train/block_objective.py): one block per row noised with every
earlier block clean, the loss blind to later blocks, the trainer's choice of objective, and the
LLaDA -> SDAR conversion of the tiny-sdar recipe."""

from __future__ import annotations

from collections import Counter

import pytest
import torch

from dllm.train import build_model, get_recipe
from dllm.train.block_objective import (block_diffusion_loss, mask_current_block, pick_block, position_blocks,
                                        training_loss)
from dllm.train.objective import diffusion_loss, sft_loss
from dllm.train.recipes import warm_start
from .helpers import SMALL_MODEL, small_batch, small_recipe

MASK_ID = 1


def small_sdar(**train):
    """tiny-sdar's recipe shrunk like the other small test recipes (block 4, block-causal, q/k norms)."""
    model = dict(SMALL_MODEL, n_kv_heads=2)
    defaults = dict(batch_size=8, warmup=2, log_every=1, eval_every=0, save_every=0, eval_per_size=1, phases=())
    r = get_recipe("tiny-sdar").with_overrides(model, **{**defaults, **train})
    from dataclasses import replace

    return replace(r, init_from=None)


def test_pick_block_is_uniform_over_the_answer_blocks():
    positions = torch.arange(14).expand(4000, 14)  # [B, L]
    answer = torch.zeros(4000, 14, dtype=torch.bool)
    answer[:, 5:] = True  # answer at positions 5..13: blocks 1, 2, 3 of 4
    blocks = position_blocks(positions, 4)
    pick = pick_block(blocks, answer, torch.rand(4000, generator=torch.Generator().manual_seed(0)))
    counts = Counter(pick.tolist())
    assert set(counts) == {1, 2, 3}
    assert all(abs(n / 4000 - 1 / 3) < 0.03 for n in counts.values())
    none = pick_block(blocks[:1], torch.zeros(1, 14, dtype=torch.bool), torch.tensor([0.5]))
    assert none.tolist() == [-1]


def test_only_answer_tokens_of_one_block_are_masked():
    b, l = 256, 17
    ids = torch.randint(5, 80, (b, l), generator=torch.Generator().manual_seed(0))
    answer = torch.zeros(b, l, dtype=torch.bool)
    answer[:, 6:] = True
    positions = torch.arange(l).expand(b, l)
    noisy, masked, p, in_block = mask_current_block(ids, answer, positions, 4, torch.Generator().manual_seed(1),
                                                    mask_id=MASK_ID)
    blocks = position_blocks(positions, 4)
    assert not (masked & ~in_block).any() and not (in_block & ~answer).any()
    for r in range(b):
        assert len(set(blocks[r][in_block[r]].tolist())) == 1  # one block per row
    assert torch.equal(noisy[~masked], ids[~masked]) and (noisy[masked] == MASK_ID).all()
    # block 1 holds answer positions 6, 7 only; blocks 2, 3 four; block 4 position 16
    sizes = Counter(in_block.sum(dim=1).tolist())
    assert set(sizes) == {1, 2, 4}
    rate = masked.sum(dim=1).float() / in_block.sum(dim=1)
    assert abs(float((rate - p).mean())) < 0.05  # each block's tokens are masked at rate p


def test_loss_is_blind_to_later_blocks_and_matches_the_estimator():
    torch.manual_seed(0)
    model = build_model(small_sdar()).eval()
    batch = small_batch()
    pos = batch.positions
    gen = lambda: torch.Generator().manual_seed(3)  # noqa: E731
    out = block_diffusion_loss(model, batch.input_ids, batch.answer_mask, batch.key_padding_mask, pos, gen())
    _, masked, p, in_block = mask_current_block(batch.input_ids, batch.answer_mask, pos, 4, gen(), mask_id=model.mask_id)
    assert torch.equal(masked, out.masked) and masked.any()
    expected = sft_loss(out.logits, batch.input_ids, masked, p, in_block.sum(dim=1))
    assert torch.allclose(out.loss, expected)
    # change every clean answer token after each row's current block: the loss must not move
    blocks = position_blocks(pos, 4)
    current = torch.where(in_block, blocks, torch.full_like(blocks, -1)).amax(dim=1)  # [B]
    later = batch.answer_mask & (blocks > current[:, None])
    assert later.any()
    changed = batch.input_ids.masked_fill(later, 7)
    out2 = block_diffusion_loss(model, changed, batch.answer_mask, batch.key_padding_mask, pos, gen())
    assert torch.allclose(out.loss, out2.loss, atol=1e-6)
    # while the bidirectional objective on a bidirectional model sees them
    llada = build_model(small_recipe("llada")).eval()
    a = diffusion_loss(llada, batch.input_ids, batch.answer_mask, batch.key_padding_mask, pos, gen()).loss
    b = diffusion_loss(llada, changed, batch.answer_mask, batch.key_padding_mask, pos, gen()).loss
    assert not torch.allclose(a, b)


def test_the_trainer_objective_follows_the_attention():
    assert training_loss(build_model(small_sdar())) is block_diffusion_loss
    llada = build_model(small_recipe("llada"))
    assert training_loss(llada) is diffusion_loss
    batch = small_batch()
    with pytest.raises(ValueError, match="block-causal model"):
        block_diffusion_loss(llada, batch.input_ids, batch.answer_mask)


def test_a_few_steps_lower_the_block_loss(tmp_path):
    from dllm.train import Trainer

    trainer = Trainer(small_sdar(steps=80, lr=3e-3), tmp_path, progress=False)
    trainer.train(stop_at=80)
    losses = [loss for _, loss in trainer.history]
    assert len(losses) == 80
    assert sum(losses[-15:]) / 15 < 0.8 * sum(losses[:15]) / 15


def test_conversion_from_llada_keeps_weights_and_starts_the_new_norms_at_one():
    recipe = get_recipe("tiny-sdar")
    assert recipe.init_from == "tiny-llada"
    model = build_model(recipe)  # warm-started from the embedded tiny-llada
    from dllm.models import load

    src = load("tiny-llada").state_dict()
    ours = model.state_dict()
    assert all(torch.equal(ours[k], v) for k, v in src.items())
    new = sorted(set(ours) - set(src))
    assert new and all(k.endswith(("q_norm.weight", "k_norm.weight")) for k in new)
    assert all(bool((ours[k] == 1).all()) for k in new)
    assert model.config.block_causal and model.config.block_size == 4


def test_a_conversion_that_drops_or_adds_other_tensors_is_refused():
    dream = build_model(small_recipe("dream"))  # q/k/v biases, which LLaDA lacks
    with pytest.raises(ValueError, match="conversion may only add norm weights"):
        warm_start(dream, "tiny-llada")
