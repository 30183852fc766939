"""Soft inputs (dllm/models/core/soft_inputs.py): mixed token embeddings as a forward's input.

- a one-hot mixture is exactly the token path, for every weight-backed family, with and without a KV
  cache, in a left-padded batch, at any span offset (plain mixture and ``renorm_eps = 0``);
- a real mixture changes the logits exactly where it should: at its own rows and, through attention,
  at the rows that see them (block-causal families: not the blocks before it);
- ``mix_embeddings`` is DMax's formula (interpolation, then the norm of the parts' weighted mean);
- a model without an input embedding (an oracle) refuses soft inputs by name, and a span that does
  not fit the forward is refused.
"""

from __future__ import annotations

import pytest
import torch

from dllm.models import tiny
from dllm.models.core.soft_inputs import SoftInputs, mix_embeddings

FAMILIES = ("llada", "dream", "sdar", "fastdllm_v2", "llada2")


@pytest.fixture(scope="module", params=FAMILIES)
def model(request):
    return tiny(request.param, seed=4).eval()


def _ids(model, b: int = 2, t: int = 12, seed: int = 0) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(10, 40, (b, t), generator=g)
    ids[:, 8:] = model.mask_id
    return ids


def _one_hot(ids: torch.Tensor, a: int, w: int, mask_id: int, eps=None) -> SoftInputs:
    """Rows [a, a + w): their own token with weight 1 and the mask with weight 0, at every other row."""
    span = ids[:, a:a + w]
    where = torch.zeros(span.shape, dtype=torch.bool)
    where[:, ::2] = True
    tokens = torch.stack([span, torch.full_like(span, mask_id)], dim=-1)  # [B, W, 2]
    weights = torch.stack([torch.ones(span.shape), torch.zeros(span.shape)], dim=-1)
    return SoftInputs(where, tokens, weights, renorm_eps=eps, offset=a)


@pytest.mark.parametrize("eps", [None, 0.0], ids=["plain", "renorm0"])
def test_one_hot_equals_token_path(model, eps):
    ids = _ids(model)
    with torch.inference_mode():
        plain = model(ids).logits
        soft = model(ids, soft_inputs=_one_hot(ids, 4, 6, model.mask_id, eps)).logits
    assert torch.equal(plain, soft)


def test_one_hot_equals_token_path_padded(model):
    ids = _ids(model)
    kpm = torch.ones(ids.shape, dtype=torch.bool)
    kpm[1, :3] = False  # a left-padded row
    model.packs_padded_rows = False  # soft inputs run the padded forward: the token path's padded one is its twin
    with torch.inference_mode():
        plain = model(ids, key_padding_mask=kpm).logits
        soft = model(ids, key_padding_mask=kpm, soft_inputs=_one_hot(ids, 3, 8, model.mask_id)).logits
    assert torch.equal(plain[kpm], soft[kpm])


def test_one_hot_equals_token_path_with_cache(model):
    """A full forward fills the buffers, then a cached query of columns [8, 12) with soft inputs at
    [9, 12): logits and the K/V written equal the token path's."""
    ids = _ids(model)
    length = ids.shape[1]
    results = []
    for soft in (None, _one_hot(ids[:, 8:], 1, 3, model.mask_id)):
        kv = model.new_kv_cache(ids.shape[0], length)
        with torch.inference_mode():
            model(ids, cache=kv.view(0, length))
            out = model(ids[:, 8:], cache=kv.view(8, length), soft_inputs=soft).logits
        results.append((out, [k.clone() for k in kv.k]))
    (a, ka), (b, kb) = results
    assert torch.equal(a, b) and all(torch.equal(x, y) for x, y in zip(ka, kb))


def test_mixture_changes_what_sees_it(model):
    ids = _ids(model)
    where = torch.zeros((2, 4), dtype=torch.bool)
    where[0, 1] = True  # row 0, input row 9 only
    span = ids[:, 8:12]
    tokens = torch.stack([torch.full_like(span, 20), torch.full_like(span, model.mask_id)], dim=-1)
    weights = torch.stack([torch.full(span.shape, 0.7), torch.full(span.shape, 0.3)], dim=-1)
    with torch.inference_mode():
        plain = model(ids).logits
        soft = model(ids, soft_inputs=SoftInputs(where, tokens, weights, renorm_eps=1e-6, offset=8)).logits
    assert torch.equal(plain[1], soft[1])  # the other row is untouched
    assert (plain[0, 9] - soft[0, 9]).abs().max() > 1e-2
    bs = model.block_size
    if bs is not None:  # block-causal: blocks before the soft row's block cannot see it (to the MoE's
        first = 9 // bs * bs  # rounding: LLaDA 2's experts batch the tokens they route, soft rows too)
        assert torch.allclose(plain[0, :first], soft[0, :first], atol=1e-5, rtol=0)


def test_mix_embeddings_is_dmax_interpolation():
    torch.manual_seed(0)
    embed = torch.nn.Embedding(10, 6)
    p = torch.tensor([[0.8, 0.25]])  # [1, 2]
    tok = torch.tensor([[3, 4]])
    tokens = torch.stack([tok, torch.full_like(tok, 9)], dim=-1)  # [1, 2, 2]: token, mask 9
    weights = torch.stack([p, 1 - p], dim=-1)
    e, m = embed.weight[tok], embed.weight[9]  # [1, 2, 6], [6]
    mixed = p[..., None] * e + (1 - p)[..., None] * m
    target = p * e.norm(dim=-1) + (1 - p) * m.norm()
    want = mixed * (target / (mixed.norm(dim=-1) + 1e-6))[..., None]
    got = mix_embeddings(embed, tokens, weights, 1e-6)
    assert torch.allclose(got, want, atol=1e-6, rtol=0)
    assert torch.allclose(mix_embeddings(embed, tokens, weights), mixed, atol=1e-6, rtol=0)
    assert torch.allclose(got.norm(dim=-1), target, atol=1e-5)  # back on the parts' mean norm


def test_refusals():
    from dllm.models.oracle import OracleLM

    oracle = OracleLM()
    ids = torch.full((1, 4), oracle.mask_id)
    with pytest.raises(NotImplementedError, match="has no input embedding"):
        oracle(ids, soft_inputs=_one_hot(ids, 0, 2, oracle.mask_id))
    model = tiny("llada", seed=1)
    ids = _ids(model)
    with pytest.raises(ValueError, match=r"do not fit a forward of 2 rows x 12 positions"):
        model(ids, soft_inputs=_one_hot(ids, 0, 6, model.mask_id).at(8))  # rows [8, 14) of 12
    with pytest.raises(ValueError, match="weights must be a float tensor"):
        SoftInputs(torch.ones((1, 2), dtype=torch.bool), torch.zeros((1, 2, 2), dtype=torch.long),
                   torch.zeros((1, 2, 3)))
