"""The LLaDA SFT objective: masking (answer only, rate p), 1/p weighting, per-row normalisation,
and Dream's shifted logits."""

from __future__ import annotations

import math

import pytest
import torch

from dllm.train import build_model, diffusion_loss, mask_answer, sft_loss
from dllm.train.objective import MASK_EPS, mask_probability
from .helpers import small_batch, small_recipe

MASK_ID = 1


def _answer_layout(b: int, lp: int, la: int) -> tuple[torch.Tensor, torch.Tensor]:
    ids = torch.randint(5, 80, (b, lp + la), generator=torch.Generator().manual_seed(0))
    answer = torch.zeros(b, lp + la, dtype=torch.bool)
    answer[:, lp:] = True
    return ids, answer


def test_prompt_never_masked_and_masks_written():
    ids, answer = _answer_layout(64, 20, 30)
    noisy, masked, p = mask_answer(ids, answer, torch.Generator().manual_seed(1), mask_id=MASK_ID)
    assert not masked[~answer].any()  # prompt columns untouched
    assert torch.equal(noisy[~masked], ids[~masked])
    assert (noisy[masked] == MASK_ID).all()
    assert masked.any()
    assert p.shape == (64,) and bool(((p >= MASK_EPS) & (p < 1)).all())


def test_mask_probability_form_and_rate():
    gen = torch.Generator().manual_seed(7)
    ids, answer = _answer_layout(256, 4, 4000)
    noisy, masked, p = mask_answer(ids, answer, gen, mask_id=MASK_ID)
    t = torch.rand(256, generator=torch.Generator().manual_seed(7))  # the first draw is t
    torch.testing.assert_close(p, (1 - MASK_EPS) * t + MASK_EPS)
    torch.testing.assert_close(mask_probability(torch.tensor([0.0, 1.0])), torch.tensor([MASK_EPS, 1.0]))
    rate = masked[:, 4:].float().mean(dim=1)  # [B] per-row fraction of masked answer tokens
    assert (rate - p).abs().max() < 0.04  # binomial std <= 0.008 at 4000 tokens
    assert p.min() < 0.1 and p.max() > 0.9  # t spans (0, 1)


def test_sft_loss_weights_and_normalisation():
    torch.manual_seed(0)
    b, l, v = 3, 6, 11
    logits = torch.randn(b, l, v)
    targets = torch.randint(0, v, (b, l))
    masked = torch.tensor([[0, 0, 1, 1, 0, 0], [0, 1, 1, 1, 1, 1], [0, 0, 0, 0, 0, 0]], dtype=torch.bool)
    p = torch.tensor([0.5, 0.25, 0.9])
    answer_len = torch.tensor([4, 5, 2])
    ce = torch.nn.functional.cross_entropy(logits.reshape(-1, v), targets.reshape(-1), reduction="none")
    ce = ce.reshape(b, l)
    expected = sum(float(ce[i][masked[i]].sum()) / float(p[i]) / int(answer_len[i]) for i in range(b)) / b
    got = sft_loss(logits, targets, masked, p, answer_len)
    assert got.dtype == torch.float32 and got.dim() == 0
    assert math.isclose(float(got), expected, rel_tol=1e-6)
    # 1/p: halving every p doubles the loss; doubling the answer length halves it
    half_p = sft_loss(logits, targets, masked, p / 2, answer_len)
    double_len = sft_loss(logits, targets, masked, p, answer_len * 2)
    assert math.isclose(float(half_p), 2 * expected, rel_tol=1e-6)
    assert math.isclose(float(double_len), expected / 2, rel_tol=1e-6)
    # uniform logits: every masked CE is log V
    flat = torch.zeros(b, l, v)
    uniform = sum(int(masked[i].sum()) * math.log(v) / float(p[i]) / int(answer_len[i]) for i in range(b)) / b
    assert math.isclose(float(sft_loss(flat, targets, masked, p, answer_len)), uniform, rel_tol=1e-6)


def test_nothing_masked_gives_zero_loss():
    logits = torch.randn(2, 4, 5, requires_grad=True)
    loss = sft_loss(logits, torch.zeros(2, 4, dtype=torch.long), torch.zeros(2, 4, dtype=torch.bool),
                    torch.tensor([0.5, 0.5]), torch.tensor([2, 2]))
    loss.backward()
    assert float(loss.detach()) == 0.0 and logits.grad is not None


@pytest.mark.parametrize("family", ["llada", "dream"])
def test_loss_reads_shifted_logits(family: str):
    """Dream: the loss through model(...) equals the loss on raw_logits shifted by hand (hidden at
    i-1 predicts i); LLaDA: raw logits are used as they are."""
    model = build_model(small_recipe(family), seed=3)
    batch = small_batch()
    out = diffusion_loss(model, batch.input_ids, batch.answer_mask, batch.key_padding_mask,
                         batch.positions, torch.Generator().manual_seed(5))
    noisy, masked, p = mask_answer(batch.input_ids, batch.answer_mask, torch.Generator().manual_seed(5),
                                   mask_id=model.mask_id)
    assert torch.equal(noisy, out.noisy)
    raw = model.raw_logits(noisy, batch.positions, batch.key_padding_mask)  # [B, L, V] unshifted
    if family == "dream":
        readout = torch.cat((raw[:, :1], raw[:, :-1]), dim=1)  # [:, i] <- hidden at i-1
    else:
        readout = raw
    manual = sft_loss(readout, batch.input_ids, masked, p, batch.answer_len)
    assert torch.equal(out.loss, manual)
    if family == "dream":  # the unshifted read-out is a different (wrong) loss
        wrong = sft_loss(raw, batch.input_ids, masked, p, batch.answer_len)
        assert not torch.allclose(wrong, manual)
