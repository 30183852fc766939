"""A short ragged batch's forward without a cache as one forward of its real tokens packed
(``dllm.models.core.views.packed.PackedView``, taken on a CPU) against the padded forward
(``packs_padded_rows = False``, the reference), and the serving plan that counts a merged call's
real tokens when the model packs them."""

from __future__ import annotations

from collections import Counter

import pytest
import torch

from dllm.models import tiny
from dllm.models.core import packed_rows
from dllm.models.core.packed_rows import MIN_PADDED_TOKENS, packed_rows_logits, packs_tokens
from dllm.models.core.views.packed import PackedView
from dllm.serve.backends.scheduling.batcher import BatcherConfig, split_rows
from dllm.serve.backends.scheduling.packing import plan_merges
from tests.models.core.test_packed_rows import _batch as _rows_batch, _both

LENGTHS = (40, 17, 33, 40, 9, 26)  # real columns per row (short: t * t under MIN_WORK)


def _batch(model, lengths=LENGTHS, side="left"):
    return _rows_batch(model, lengths, side=side)


def _counted(monkeypatch):
    calls = Counter()
    inner = packed_rows.packed_tokens_logits

    def counted(*args, **kwargs):
        out = inner(*args, **kwargs)
        calls["packed" if out is not None else "declined"] += 1
        return out

    monkeypatch.setattr(packed_rows, "packed_tokens_logits", counted)
    return calls


@pytest.mark.parametrize("side", ["left", "right"])
@pytest.mark.parametrize("family", ["llada", "dream"])  # the bidirectional ones
def test_logits_equal_the_padded_forward_at_real_positions(family, side, monkeypatch):
    model = tiny(family, seed=1)
    calls = _counted(monkeypatch)
    ids, real = _batch(model, side=side)
    with torch.no_grad():
        fast, ref = _both(model, ids, key_padding_mask=real)
    assert calls["packed"] == 1
    assert fast.shape == ref.shape
    use = real.clone()
    if model.logit_shift:  # a shifted family's first real column predicts nothing in either path
        use &= torch.roll(real, 1, dims=1) & (torch.arange(real.shape[1]) > 0)
    torch.testing.assert_close(fast[use], ref[use], rtol=1e-5, atol=1e-5)
    assert torch.isfinite(fast).all()
    cols = (31, 40) if side == "left" else (0, 9)  # logits_rows (some rows padded there: zeros' logits)
    cols = (cols[0] + model.logit_shift, cols[1]) if side == "right" else cols
    with torch.no_grad():
        fast, ref = _both(model, ids, key_padding_mask=real, logits_rows=cols)
    assert calls["packed"] == 2 and fast.shape == ref.shape
    part = use[:, cols[0]:cols[1]]
    torch.testing.assert_close(fast[part], ref[part], rtol=1e-5, atol=1e-5)


def test_the_view_packs_and_unpacks_the_real_tokens():
    ids = torch.arange(12).view(3, 4)
    real = torch.tensor([[0, 1, 1, 1], [1, 1, 1, 1], [0, 0, 0, 1]], dtype=torch.bool)
    view = PackedView.of(real)
    assert view.tokens == 8
    assert view.pack(ids).tolist() == [[1, 2, 3, 4, 5, 6, 7, 11]]
    back = view.unpack(view.pack(ids.unsqueeze(-1).float()))  # [B, T, 1]
    assert back.squeeze(-1).tolist() == torch.where(real, ids, 0).tolist()
    heads = torch.randn(3, 2, 4, 5)  # [B, H, T, hd]
    packed = view._heads_in(heads)  # [1, H, N, hd]
    assert packed.shape == (1, 2, 8, 5)
    spread = view._heads_out(packed)
    assert torch.equal(spread, torch.where(real[:, None, :, None], heads, 0))


def test_the_path_is_taken_only_where_it_applies(monkeypatch):
    model = tiny("llada", seed=1)
    calls = _counted(monkeypatch)
    ids, real = _batch(model)
    mask = real[:, None, None, :]
    pos = torch.zeros_like(ids)
    assert packs_tokens(model, ids.device) and packed_rows_logits(model, ids, pos, mask, None) is not None
    assert not packs_tokens(model, torch.device("meta"))  # an accelerator's short batch stays padded
    assert not packs_tokens(tiny("sdar", seed=1), ids.device)  # block-causal: masks made from positions
    assert packed_rows_logits(model, ids[:1], pos[:1], mask[:1], None) is None  # one row
    almost, almost_real = _batch(model, (40,) * 31 + (39,))  # 1 pad column in 1,280: under MIN_PADDED_TOKENS
    assert 1 / 1280 < MIN_PADDED_TOKENS
    declined = calls["declined"]
    assert packed_rows_logits(model, almost, torch.zeros_like(almost), almost_real[:, None, None, :], None) is None
    assert calls["declined"] == declined + 1
    with torch.no_grad():  # attention maps asked for: the padded forward answers, with them
        out = model(ids, key_padding_mask=real, want_attn_layers=(0,))
    assert 0 in out.attn and out.attn[0].shape[0] == ids.shape[0]
    assert calls["packed"] == 1


class _Item:
    def __init__(self, length):
        self.rows, self.length, self.mergeable = 1, length, True


def test_the_plan_counts_real_tokens_when_the_model_packs():
    """A 10- and a 40-column forward: padded, merging costs 30 pad columns against a call of 20; packed,
    the pads cost nothing and one call is cheaper."""
    items = [_Item(10), _Item(40)]
    assert len(plan_merges(items, max_rows=8, max_tokens=4096, fixed_cost=20)) == 2
    assert len(plan_merges(items, max_rows=8, max_tokens=4096, fixed_cost=20, packed=True)) == 1
    padded, packed = BatcherConfig(call_cost_tokens=20, packed=False), BatcherConfig(call_cost_tokens=20, packed=True)
    assert split_rows([10, 40, 40], padded) == [[0], [1, 2]]
    assert split_rows([10, 40, 40], packed) == [[0, 1, 2]]
    assert BatcherConfig().resolved(tiny("llada", seed=1)).packed is True
    assert BatcherConfig().resolved(tiny("sdar", seed=1)).packed is False
