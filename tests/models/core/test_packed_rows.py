"""A long ragged batch's full forward per group of rows with the same real columns
(``dllm.models.core.packed_rows``) against the padded forward (``packs_padded_rows = False``, the reference)."""

from __future__ import annotations

import pytest
import torch

import dllm
from dllm import tasks as T
from dllm.models import tiny
from dllm.models.core import packed_rows
from dllm.models.core.packed_rows import packed_rows_logits
from dllm.train import diffusion_loss

LENGTHS = (300, 180, 300, 90)  # real columns per row; left-padded to 300


def _batch(model, lengths=LENGTHS, seed=0, side="left"):
    g = torch.Generator().manual_seed(seed)
    t = max(lengths)
    ids = torch.randint(10, 60, (len(lengths), t), generator=g)
    real = torch.arange(t)[None, :] >= t - torch.tensor(lengths)[:, None]  # [B, T] left padding
    if side == "right":  # training's layout (dllm.train.data)
        real = real.flip(-1)
    return ids.masked_fill(~real, model.pad_id), real


def _both(model, *args, **kwargs):
    model.packs_padded_rows = True
    fast = model(*args, **kwargs).logits
    model.packs_padded_rows = False
    ref = model(*args, **kwargs).logits
    model.packs_padded_rows = True
    return fast, ref


@pytest.mark.parametrize("side", ["left", "right"])
@pytest.mark.parametrize("family", ["llada", "dream"])
def test_logits_equal_the_padded_forward_at_real_positions(family, side):
    model = tiny(family, seed=1)
    ids, real = _batch(model, side=side)
    with torch.no_grad():
        fast, ref = _both(model, ids, key_padding_mask=real)
    assert fast.shape == ref.shape
    use = real.clone()
    if model.logit_shift:  # a shifted family's first real column predicts nothing in either path
        use &= torch.roll(real, 1, dims=1) & (torch.arange(real.shape[1]) > 0)
    torch.testing.assert_close(fast[use], ref[use], rtol=1e-5, atol=1e-5)
    after = _after_last_real(real) if model.logit_shift else torch.zeros_like(real)
    assert (fast[~real & ~after] == 0).all()
    cols = (292, 300) if side == "left" else (2, 10)  # logits_rows: 8 columns real in every row
    with torch.no_grad():
        fast, ref = _both(model, ids, key_padding_mask=real, logits_rows=cols)
    torch.testing.assert_close(fast, ref, rtol=1e-5, atol=1e-5)


def _after_last_real(real):
    """[B, T] bool: the first pad column after each row's last real one (a shifted family predicts it)."""
    return ~real & torch.roll(real, 1, dims=1) & (torch.arange(real.shape[1]) > 0)


@pytest.mark.parametrize("lengths", [LENGTHS, (40, 17, 33, 9)], ids=["long", "short"])
@pytest.mark.parametrize("family", ["dream", "fastdllm_v2"])
def test_a_shifted_family_predicts_the_column_after_a_right_padded_row(family, lengths):
    """logits[:, i] predicts position i: after a right-padded row's last real token that is the next
    token, from the last real hidden state, whichever path (per group, packed tokens, padded) runs."""
    model = tiny(family, seed=1)
    ids, real = _batch(model, lengths, side="right")
    after = _after_last_real(real)
    with torch.no_grad():
        fast, ref = _both(model, ids, key_padding_mask=real)
        alone = torch.stack([model(ids[r:r + 1, :n + 1], key_padding_mask=real[r:r + 1, :n + 1]).logits[0, n]
                             for r, n in enumerate(lengths) if n < ids.shape[1]])  # each row alone, one pad
    assert after.sum() == sum(n < max(lengths) for n in lengths) and ref[after].abs().amax() > 1
    torch.testing.assert_close(fast[after], ref[after], rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(fast[after], alone, rtol=1e-5, atol=1e-5)


def test_the_path_is_taken_only_where_it_applies():
    model = tiny("llada", seed=1)
    ids, real = _batch(model)
    mask = real[:, None, None, :]
    positions = torch.zeros_like(ids)
    assert packed_rows_logits(model, ids, positions, mask, None) is not None
    assert packed_rows_logits(model, ids, positions, mask, (200, 300)) is None  # row 4 starts at 210
    assert packed_rows_logits(model, ids[:1], positions[:1], mask[:1], None) is None  # one row
    short, short_real = _batch(model, (40, 20, 40))  # short rows: their packed tokens (test_packed_tokens.py)
    short_mask = short_real[:, None, None, :]
    model.packs_padded_rows = False  # a model that does not pack: the padded forward
    assert packed_rows_logits(model, short, torch.zeros_like(short), short_mask, None) is None
    model.packs_padded_rows = True
    with torch.no_grad():  # hidden states asked for: the padded forward answers, with them
        out = model(ids, key_padding_mask=real, want_hidden_layers=(0,))
    assert 0 in out.hidden and out.hidden[0].shape[:2] == ids.shape


@pytest.mark.parametrize("lengths", [LENGTHS, (40, 17, 33, 9)], ids=["long", "short"])
@pytest.mark.parametrize("side", ["left", "right"])
def test_the_objective_and_its_gradients_match(side, lengths, monkeypatch):
    """The training objective (whose batches are right-padded) on both layouts; short rows run as their
    packed tokens (dllm.models.core.views.packed), long ones per group of rows."""
    model = tiny("llada", seed=2)
    ids, real = _batch(model, lengths, side=side)
    packed = []
    monkeypatch.setattr(packed_rows, "packed_tokens_logits",
                        lambda *a, inner=packed_rows.packed_tokens_logits: packed.append(inner(*a)) or packed[-1])
    answer = real & (torch.rand(real.shape, generator=torch.Generator().manual_seed(1)) < 0.2)
    results = {}
    for packs in (True, False):
        model.packs_padded_rows = packs
        model.zero_grad()
        out = diffusion_loss(model, ids, answer, real, None, torch.Generator().manual_seed(0))
        out.loss.backward()
        results[packs] = (out.loss.detach(), [p.grad.clone() for p in model.parameters()])
    model.packs_padded_rows = True
    assert len(packed) == (0 if lengths == LENGTHS else 1) and None not in packed  # short rows: packed, once
    torch.testing.assert_close(results[True][0], results[False][0], rtol=1e-5, atol=1e-6)
    for a, b in zip(results[True][1], results[False][1]):
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-6)


def test_a_ragged_long_prompt_batch_decodes_the_same_tokens():
    model = dllm.load("tiny-llada-long")
    names = T.suite_task_names("long-prompt")
    prompts = [T.prompt_ids(T.test_split(names[i], T.get_task(names[i]).default_sizes[i % 2])[0]) for i in range(3)]
    outs = {}
    for packs in (True, False):
        model.packs_padded_rows = packs
        outs[packs] = dllm.generate(model, prompts, "threshold", gen_length=4, block_length=4)
    assert torch.equal(outs[True].generated, outs[False].generated)
    assert outs[True].nfe == outs[False].nfe
