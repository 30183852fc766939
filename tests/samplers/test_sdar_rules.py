"""SDAR's decode step in few ATen calls (``dllm.samplers.sdar``), the same bits: the T = 0 proposal
over [B, W, V] against the flattened rows, the mask replacement through ``argmax_excluding`` against the copy with
the mask's column at -inf (its calls per cached step: ``tests/samplers/test_step_calls.py``)."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from dllm.samplers.sdar import never_mask, propose


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
def test_greedy_proposal_is_the_flattened_one(dtype):
    g = torch.Generator().manual_seed(0)
    query = (torch.randn(3, 12, 50, generator=g) * 3).to(dtype)
    query[..., 7] = query[..., 3]  # ties at the maximum: the first index
    for logits in (query, query[:, 2:9]):  # the whole query, and a grid block inside it (not contiguous)
        b, w, v = logits.shape
        probs, x0 = F.softmax(logits.reshape(-1, v), dim=-1).max(dim=-1)
        got_x0, got_p = propose(logits, 0.0, 0, 1.0, None)
        assert torch.equal(got_x0, x0.view(b, w)) and torch.equal(got_p, probs.view(b, w))


@pytest.mark.parametrize("mask_id", [2, 49])
def test_never_mask_is_the_copy_with_the_mask_column_at_minus_inf(mask_id):
    g = torch.Generator().manual_seed(1)
    logits = torch.randint(-3, 4, (2, 9, 50), generator=g).float()  # ties
    x0 = torch.randint(0, 50, (2, 9), generator=g)
    x0[:, ::2] = mask_id
    other = logits.clone()
    other[..., mask_id] = float("-inf")
    assert torch.equal(never_mask(x0, logits, mask_id), torch.where(x0 == mask_id, other.argmax(dim=-1), x0))


def test_a_top_k_over_the_vocabulary_keeps_every_logit():
    """``top_k`` at or above the vocabulary size filters nothing (it crashed in ``torch.topk``: "selected
    index k out of range"), so it samples as ``top_k=0`` does, draw for draw."""
    logits = torch.randn(2, 5, 50, generator=torch.Generator().manual_seed(2))
    off = propose(logits, 0.8, 0, 1.0, torch.Generator().manual_seed(3))
    for k in (50, 51, 10**6):
        got = propose(logits, 0.8, k, 1.0, torch.Generator().manual_seed(3))
        assert torch.equal(got[0], off[0]) and torch.equal(got[1], off[1]), k
