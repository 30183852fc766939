"""Grouped verification variants (``RowsView.attend`` with ``group`` > 1): the variants of one row
attend to ONE copy of its buffers, their queries stacked, each masked to its own fresh keys. The
reference is one copy per variant (``CacheView.attend`` on ``gather`` + ``view``)."""

import dataclasses

import pytest
import torch

import dllm
from dllm.engine.forwards import StepForwards
from dllm.kernels.attention import backends
from dllm.models.core import kv as KV
from dllm.models import tiny

PROMPTS = [[7, 8, 9, 10, 11], [12, 13], [14, 15, 16]]  # left-padded batch


def _filled(model, rows: int, length: int, seed: int = 0):
    """A canvas [rows, length] and buffers filled by its full forward (left padding in row 1)."""
    g = torch.Generator().manual_seed(seed)
    x = torch.randint(5, 40, (rows, length), generator=g)
    kpm = torch.ones(rows, length, dtype=torch.bool)
    kpm[1, :3] = False  # row 1 is left-padded
    positions = (kpm.long().cumsum(1) - 1).clamp_min(0)
    kv = model.new_kv_cache(rows, length)
    model(x, positions=positions, key_padding_mask=kpm, cache=kv.view(0))
    return x, positions, kpm, kv


@pytest.mark.parametrize("family", ["llada", "dream"])
@pytest.mark.parametrize("backend", ["sdpa", "reference"])
@pytest.mark.parametrize("extra", [None, [1, 4]])
def test_grouped_logits_equal_one_copy_per_variant(family, backend, extra):
    model = tiny(family, seed=2, n_layers=3)
    model.set_attn_backend(backend)
    x, positions, kpm, kv = _filled(model, 2, 16)
    start, key_end, g = 8, 14, 3
    extra = None if extra is None else torch.tensor(extra)
    cols = KV.canvas_columns(start, 12, extra)
    select = torch.tensor([0, 1]).repeat_interleave(g)  # [6]: three variants of each row
    variants = x[select].clone()
    variants[:, 8:12] = torch.randint(5, 40, (2 * g, 4), generator=torch.Generator().manual_seed(1))
    kw = dict(positions=positions[select][:, cols], key_padding_mask=kpm[select])
    before = [t.clone() for t in kv.k + kv.v]
    got = model(variants[:, cols], cache=kv.rows_view(select, start, key_end, extra, group=g), **kw).logits
    want = model(variants[:, cols], cache=kv.gather(select).view(start, key_end, extra), **kw).logits
    torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-5)
    assert all(torch.equal(a, b) for a, b in zip(before, kv.k + kv.v))  # the call's buffers untouched


def test_the_stacked_mask_sees_the_row_and_only_its_own_variant():
    model = tiny("llada", seed=2, n_layers=1)
    _, _, kpm, kv = _filled(model, 2, 10)
    view = kv.rows_view(torch.tensor([0, 0, 1, 1]), 6, 9, group=2)
    per_variant = view.attn_mask(kpm[torch.tensor([0, 0, 1, 1])], 2)  # [4, 1, 2, 9]: queries 6, 7
    mask = view.grouped_mask(per_variant, 2, 2, torch.device("cpu"))  # [2, 1, 4, 9 + 4]
    assert mask.shape == (2, 1, 4, 13)
    assert not mask[..., 6:8].any()  # the stale copies of the recomputed columns
    assert mask[0, 0, :, :6].all() and not mask[1, 0, :, :3].any()  # row 1's pads are never attended
    own = mask[0, 0, :, 9:]
    assert own.tolist() == [[True, True, False, False]] * 2 + [[False, False, True, True]] * 2


@pytest.mark.parametrize("padded", [False, True])
@pytest.mark.parametrize("dtype", [None, torch.float32])
def test_a_mask_for_fewer_variants_is_the_kept_one_sliced(padded, dtype):
    """lopa's compacted steps change the variant count within a block: the stacked mask for g variants
    is the top-left part of one kept for more (no new mask), equal to one built for g."""
    model = tiny("llada", seed=2, n_layers=1)
    _, _, kpm, kv = _filled(model, 2, 10)
    rows = torch.tensor([0, 1])
    per_row = kv.rows_view(rows, 6, 9).attn_mask(kpm, 2) if padded else None  # [2, 1, 2, 9] or None
    built = {g: kv.rows_view(rows.repeat_interleave(g), 6, 9, group=g).grouped_mask(per_row, 2, 2,
                                                                                   torch.device("cpu"), dtype)
             for g in (2, 3)}
    view = kv.rows_view(rows.repeat_interleave(2), 6, 9, group=2)
    assert view._fewer_variants((2, 2, 2, 9, 6, not padded, "x", None, None)) is None  # nothing kept yet
    kv.grouped_masks[(2, 2, 3, 9, 6, not padded, "x", None, None)] = built[3]
    sliced = view._fewer_variants((2, 2, 2, 9, 6, not padded, "x", None, None))
    assert torch.equal(sliced, built[2]) and sliced.data_ptr() == built[3].data_ptr()
    assert view._fewer_variants((2, 2, 2, 9, 4, not padded, "x", None, None)) is None  # another block's


def _ungrouped(monkeypatch):
    monkeypatch.setattr(KV.RowsView, "attend", KV.CacheView.attend)
    monkeypatch.setattr(StepForwards, "stacks_variants", lambda self, group, vq: False)


@pytest.mark.parametrize("family", ["llada", "dream"])
@pytest.mark.parametrize("cache", ["dual", "prefix", "dual:look_back=3,look_ahead=2",
                                   "drift:first_look_back=2,threshold=1e-09"])
@pytest.mark.parametrize("cfg_scale", [0.0, 1.5])
def test_samplers_decode_the_same_tokens_grouped(monkeypatch, family, cache, cfg_scale):
    model = tiny(family, seed=3)
    calls = []
    real = KV.RowsView.grouped_mask
    monkeypatch.setattr(KV.RowsView, "grouped_mask", lambda self, *a: calls.append(self.group) or real(self, *a))
    kw = dict(gen_length=16, block_length=8, cache=cache, cfg_scale=cfg_scale)
    runs = [("fast", {}), ("spec_threshold", {}), ("ssd", {}), ("lopa", dict(branches=3, tau_conf=1.0))]
    grouped = [dllm.generate(model, PROMPTS, sampler=s, **kw, **o) for s, o in runs]
    assert calls and min(calls) > 1  # the grouped layout ran (stacked by the engine unless under guidance)
    with monkeypatch.context() as m:
        _ungrouped(m)
        reference = [dllm.generate(model, PROMPTS, sampler=s, **kw, **o) for s, o in runs]
    for (name, _), a, b in zip(runs, grouped, reference):
        assert torch.equal(a.sequences, b.sequences), name
        assert a.nfe == b.nfe and a.forwarded_tokens == b.forwarded_tokens, name


def test_a_backend_without_arbitrary_masks_gets_one_copy_per_variant(monkeypatch):
    model = tiny("llada", seed=2, n_layers=2)
    x, positions, kpm, kv = _filled(model, 2, 12)
    select = torch.tensor([0, 0, 1, 1])
    seen = []
    sdpa = backends.get("sdpa").fn

    def padding_only(q, k, v, mask=None, return_probs=False):  # like the Triton kernel's contract
        seen.append((q.shape[0], k.shape[2]))
        return sdpa(q, k, v, mask, return_probs)

    assert KV.grouped_backend(padding_only) is None
    view = kv.rows_view(select, 8, 12, group=2)
    hkv, hd = kv.k[0].shape[1], kv.k[0].shape[3]
    q, k = torch.randn(4, hkv, 2, hd), torch.randn(4, hkv, 2, hd)
    view.attend(0, q, k, k.clone(), None, padding_only, False)
    assert seen == [(4, 12)]  # four variants, each against its own copy of 12 keys


@pytest.mark.parametrize("family", ["llada", "dream"])
@pytest.mark.parametrize("padded", [False, True])
def test_every_row_in_order_reads_the_buffers_in_place_with_the_same_logits(family, padded):
    """``every_row=True`` (the variants are every buffer row in order): no gather of the rows' K/V,
    bit-identical logits; and a second forward of the block reuses the stacked mask (kept on the
    buffers) with the same logits again."""
    model = tiny(family, seed=2, n_layers=3)
    x, positions, kpm, kv = _filled(model, 2, 16)
    if not padded:
        kpm = torch.ones_like(kpm)
    kv.fix_positions(positions)
    start, key_end, g = 8, 14, 3
    select = torch.tensor([0, 1]).repeat_interleave(g)
    variants = x[select].clone()
    variants[:, 8:12] = torch.randint(5, 40, (2 * g, 4), generator=torch.Generator().manual_seed(1))
    kw = dict(positions=positions[select][:, 8:12], key_padding_mask=kpm[select] if padded else None)
    gathers = []
    real = torch.Tensor.index_select
    with pytest.MonkeyPatch.context() as m:
        m.setattr(torch.Tensor, "index_select", lambda t, *a: gathers.append(t.shape) or real(t, *a))
        in_place = model(variants[:, 8:12], cache=kv.rows_view(select, start, key_end, group=g, every_row=True), **kw)
        k_gathers = sum(1 for s in gathers if len(s) == 4)  # [R, Hkv, K, hd] buffer gathers
    gathered = model(variants[:, 8:12], cache=kv.rows_view(select, start, key_end, group=g), **kw)
    assert k_gathers == 0
    assert torch.equal(in_place.logits, gathered.logits)
    assert len(kv.grouped_masks) == 1  # built once, kept for the block's next variant forwards
    again = model(variants[:, 8:12], cache=kv.rows_view(select, start, key_end, group=g, every_row=True), **kw)
    assert len(kv.grouped_masks) == 1 and torch.equal(again.logits, in_place.logits)


def test_the_mask_kind_follows_a_backend_registered_again(monkeypatch):
    """``grouped_backend`` keeps its table per state of the backends registry: a backend registered
    again under a name the table knows is asked for by its new function, and the old one is unknown."""
    sdpa = backends.get("sdpa")
    assert KV.grouped_backend(sdpa.fn) == "float"
    assert KV.grouped_backend(backends.get("reference").fn) == "bool"

    def wrapped(q, k, v, mask=None, return_probs=False):
        return sdpa.fn(q, k, v, mask, return_probs)

    entries = dict(backends._entries)
    monkeypatch.setattr(backends, "_entries", entries)  # restored after the test
    monkeypatch.setattr(backends, "version", backends.version)
    with pytest.warns(UserWarning, match="registered again"):
        backends.add("sdpa", dataclasses.replace(sdpa, fn=wrapped))
    assert KV.grouped_backend(wrapped) == "float" and KV.grouped_backend(sdpa.fn) is None
