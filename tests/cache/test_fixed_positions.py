"""What a cached forward keeps between the forwards of one ``generate`` call (dllm/models/core/kv.py):
the canvas positions given once (``KVCache.fix_positions``), the block-causal mask read from their
block ids (``KVCache.block_mask``), and a view reused by the steps of a block (``view(reuse=True)``),
which keeps the RoPE rows and the masks it derived while its positions tensor is the same object."""

from __future__ import annotations

import pytest
import torch

from dllm.models import tiny
from dllm.models.core.kv import KVCache, StaticView
from dllm.models.core.layer.block import block_causal_mask


def _positions() -> torch.Tensor:
    """[2, 12] canvas positions of a left-padded batch (row 1 has 3 pads, which get 0)."""
    return torch.stack([torch.arange(12), (torch.arange(12) - 3).clamp_min(0)])


@pytest.mark.parametrize("start,t,key_end", [(0, 12, 12), (4, 4, 8), (2, 6, 8), (8, 4, 12)])
def test_block_mask_is_the_block_causal_mask_of_the_columns(start, t, key_end):
    kv = KVCache.allocate(1, 2, 1, 12, 4, dtype=torch.float32, devices=[torch.device("cpu")])
    pos = _positions()
    kv.fix_positions(pos)
    want = block_causal_mask(pos[:, start:start + t], pos[:, :key_end], 4)
    assert torch.equal(kv.block_mask(start, t, key_end, 4), want)
    assert torch.equal(kv.block_mask(start, t, key_end, 3), block_causal_mask(pos[:, start:start + t],
                                                                              pos[:, :key_end], 3))


def test_a_block_mask_covered_by_the_last_is_its_slice():
    """SDAR's block cache forwards a block with the one before it, then the block's variants alone:
    the second mask is rows of the first, sliced instead of compared anew; anything else is made anew."""
    kv = KVCache.allocate(1, 2, 1, 12, 4, dtype=torch.float32, devices=[torch.device("cpu")])
    pos = _positions()
    kv.fix_positions(pos)
    wide = kv.block_mask(4, 8, 12, 4)
    for start, t, key_end, bs in [(8, 4, 12, 4), (4, 3, 12, 4), (6, 4, 12, 4), (8, 4, 12, 3), (8, 4, 10, 4),
                                  (2, 4, 12, 4)]:
        got = kv.block_mask(start, t, key_end, bs)
        assert torch.equal(got, block_causal_mask(pos[:, start:start + t], pos[:, :key_end], bs)), (start, t)
        covered = (key_end, bs) == (12, 4) and 4 <= start and start + t <= 12
        assert (got.untyped_storage().data_ptr() == wide.untyped_storage().data_ptr()) == covered, (start, t)
        wide = kv.block_mask(4, 8, 12, 4)  # the wide one again: the last made
    kv.fix_positions(pos.clone())  # new positions: nothing of the old is read
    assert kv.block_mask(8, 4, 12, 4).untyped_storage().data_ptr() != wide.untyped_storage().data_ptr()


def test_fixed_positions_are_never_written():
    kv = KVCache.allocate(1, 2, 1, 12, 4, dtype=torch.float32, devices=[torch.device("cpu")])
    pos = _positions()
    kv.fix_positions(pos)
    keys = kv.view(4, 8).key_positions(torch.full((2, 4), 99))  # not recorded: the fixed ones stand
    assert torch.equal(keys, pos[:, :8]) and torch.equal(kv.positions, _positions())
    with pytest.raises(ValueError, match="fix_positions takes integer positions"):
        kv.fix_positions(pos[:, :5])


def test_a_static_view_keeps_nothing():
    kv = KVCache.allocate(1, 1, 1, 8, 4, dtype=torch.float32, devices=[torch.device("cpu")])
    with pytest.raises(ValueError, match="keeps nothing"):
        StaticView(kv, 0, 8, None, torch.arange(2), memo={})


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])  # module by module; fused (RoPE rows kept)
@pytest.mark.parametrize("family", ["sdar", "llada"])
def test_a_reused_view_gives_the_logits_of_fresh_views(family, dtype):
    model = tiny(family, dtype=dtype)
    g = torch.Generator().manual_seed(0)
    ids = torch.randint(10, 40, (2, 12), generator=g)
    pos = _positions()
    kpm = pos > 0
    kpm[0] = True
    kpm[1, 3] = True  # row 1: three pads, then real tokens from position 0
    with torch.inference_mode():
        kv = model.new_kv_cache(2, 12)
        kv.fix_positions(pos)
        model(ids, positions=pos, key_padding_mask=kpm, cache=kv.view(0, 12))  # the prefill
        view = kv.view(4, 8, reuse=True)
        q_pos, q_ids = pos[:, 4:8], ids[:, 4:8]
        first = model(q_ids, positions=q_pos, key_padding_mask=kpm, cache=view).logits
        assert view.memo  # the RoPE rows (and a block-causal model's mask) are kept
        again = model(q_ids, positions=q_pos, key_padding_mask=kpm, cache=view).logits
        fresh = model(q_ids, positions=q_pos, key_padding_mask=kpm, cache=kv.view(4, 8)).logits
    assert torch.equal(first, again) and torch.equal(first, fresh)


@pytest.mark.parametrize("key_end", [8, 12])  # a prefix cache's keys, a dual cache's (every column)
def test_a_reused_view_keeps_its_buffer_views(key_end):
    """A reused view makes each layer's buffer views once (where the fresh K/V go, the keys attended:
    ``CacheView.buffer_views``) and writes and reads through them: the same buffers and keys as a
    fresh view, which slices them at every forward; new buffers (another layer, a new cache) get views
    of their own."""
    g = torch.Generator().manual_seed(3)
    kv = KVCache.allocate(2, 2, 2, 12, 4, dtype=torch.float32, devices=[torch.device("cpu")] * 2)
    for buffer in (*kv.k, *kv.v):  # allocated empty: columns never written may hold NaN, and NaN != NaN
        buffer.zero_()
    view, fresh = kv.view(4, key_end, reuse=True), kv.view(4, key_end)
    for step in range(3):
        k, v = torch.randn(2, 2, 4, 4, generator=g), torch.randn(2, 2, 4, 4, generator=g)  # [R, Hkv, T, hd]
        keys, values = view.update(1, k, v)
        assert torch.equal(kv.k[1][:, :, 4:8], k) and torch.equal(kv.v[1][:, :, 4:8], v)
        want_k, want_v = fresh.update(1, k, v)
        assert torch.equal(keys, want_k) and torch.equal(values, want_v)
        assert keys.data_ptr() == kv.k[1].data_ptr() and keys.shape[2] == key_end
        if step:
            assert keys is last  # made once: no slicing at the block's later steps
        last = keys
    other, _ = view.update(0, k, v)  # another layer: its own buffers
    assert other.data_ptr() == kv.k[0].data_ptr() and torch.equal(kv.k[0][:, :, 4:8], k)
    kv.k[1] = kv.k[1].clone()  # buffers replaced (a held-rows forward, a resize): views made again
    again, _ = view.update(1, k, v)
    assert again is not last and again.data_ptr() == kv.k[1].data_ptr()
