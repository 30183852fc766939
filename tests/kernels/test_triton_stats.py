"""``dllm.kernels.triton.stats.vocab_stats`` against ``reference.vocab_stats_reference`` (float64) on random and
adversarial rows; Gumbel-max with external uniforms equals the samplers' arg-max; Philox draws."""

from __future__ import annotations

import math

import pytest
import torch

from dllm.kernels.reference import vocab_stats_reference
from dllm.kernels.triton.stats import vocab_stats
from dllm.samplers._ops import argmax_excluding, gumbel_perturb

from .conftest import DEVICE, INTERPRETED
from .helpers import assert_close

FLOAT_FIELDS = ("top1_prob", "margin", "entropy", "gap", "lse")
ATOL = {"top1_prob": 1e-6, "margin": 1e-6, "entropy": 2e-5, "gap": 1e-5, "lse": 1e-5, "sample_prob": 1e-6}


def _rows(kind: str, n: int, vocab: int, banned: int, g: torch.Generator) -> torch.Tensor:
    x = 4 * torch.randn(n, vocab, generator=g)
    if kind == "ties":  # the maximum is shared by three ids, the banned one among them
        x[:, [banned - 5, banned, banned + 40]] = x.max() + 1
    elif kind == "ties_banned_first":  # the banned id is the first of the tied maxima
        x[:, [banned, banned + 3, vocab - 1]] = x.max() + 1
    elif kind == "banned_argmax":  # the banned id is the unique arg-max by far
        x[:, banned] = 30.0
    elif kind == "peaked":
        x[:, 17] = 80.0
    elif kind == "uniform":
        x.zero_()
    elif kind == "neg_inf":  # top-k filtered rows: -inf (or finfo.min) outside 5 kept ids
        keep = x.topk(5, dim=-1).indices
        x = torch.full_like(x, float("-inf")).scatter(-1, keep, x.gather(-1, keep))
        x[0] = torch.where(torch.isinf(x[0]), torch.finfo(torch.float32).min, x[0])
    elif kind == "large":
        x += 1e4
    return x


CASES = [  # (n, vocab, dtype, kind, banned, block_v)
    (6, 1000, "fp32", "random", 7, 256),  # the last tile is partial
    (6, 1000, "fp16", "random", 7, 256),
    (4, 500, "fp32", "ties", 60, 64),
    (4, 500, "fp32", "ties_banned_first", 60, 64),
    (4, 500, "fp32", "banned_argmax", 60, 64),
    (4, 500, "fp16", "banned_argmax", 60, 64),
    (4, 500, "fp32", "peaked", 60, 128),
    (3, 300, "fp32", "uniform", 0, 64),
    (4, 500, "fp32", "neg_inf", 60, 128),
    (4, 500, "fp32", "large", 60, 128),
    (3, 64, "fp32", "random", 63, 16),  # banned = last id; 4 minimal tiles
]
DTYPES = {"fp32": torch.float32, "fp16": torch.float16}


@pytest.mark.parametrize("n, vocab, dtype, kind, banned, block_v", CASES,
                         ids=[f"N{c[0]}-V{c[1]}-{c[2]}-{c[3]}-ban{c[4]}-blk{c[5]}" for c in CASES])
def test_vocab_stats_match_reference(n, vocab, dtype, kind, banned, block_v):
    g = torch.Generator().manual_seed(vocab + n)
    x = _rows(kind, n, vocab, banned, g).to(DTYPES[dtype]).to(DEVICE)
    st = vocab_stats(x, banned=banned, block_v=block_v)
    ref = vocab_stats_reference(x, banned=banned)
    assert torch.equal(st.argmax, ref.argmax), f"argmax {st.argmax.tolist()} != {ref.argmax.tolist()}"
    assert (st.argmax != banned).all()
    for f in FLOAT_FIELDS:
        assert_close(f"{kind}/{f}", getattr(ref, f), getattr(st, f), 1e-5, atol=ATOL[f])
    assert st.sample is None and st.sample_prob is None
    if kind in ("ties", "ties_banned_first", "uniform"):
        assert torch.all(st.gap == 0) and torch.all(st.margin == 0)
    if kind == "uniform":
        assert torch.allclose(st.entropy, torch.full_like(st.entropy, math.log(vocab)), atol=1e-5)
        assert torch.all(st.argmax == 1)  # first id that is not banned
    if kind == "peaked":
        assert torch.all(st.argmax == 17) and torch.all(st.top1_prob > 0.999999)


def test_leading_dims_and_window_slice():
    g = torch.Generator().manual_seed(5)
    x = (3 * torch.randn(2, 6, 200, generator=g)).to(DEVICE)
    window = x[:, 2:5]  # a non-contiguous [B, W, V] view, as samplers slice the block
    st = vocab_stats(window, banned=9, block_v=64)
    ref = vocab_stats_reference(window, banned=9)
    assert st.argmax.shape == (2, 3) and torch.equal(st.argmax, ref.argmax)
    assert_close("window/entropy", ref.entropy, st.entropy, 1e-5)
    one = vocab_stats(x[1, 3], banned=9, block_v=64)  # a single row [V]
    assert one.argmax.shape == () and int(one.argmax) == int(ref.argmax[1, 1])


@pytest.mark.parametrize("temperature", [0.5, 1.0, 2.0])
@pytest.mark.parametrize("udtype", [torch.float64, torch.float32])
def test_gumbel_with_external_uniforms_equals_sampler_argmax(temperature, udtype):
    g = torch.Generator().manual_seed(11)
    x = (3 * torch.randn(8, 400, generator=g)).to(DEVICE)
    x[0, 5] = 40.0  # the banned id is the arg-max of row 0
    u = torch.rand(x.shape, generator=g, dtype=torch.float64).to(udtype).to(DEVICE)
    st = vocab_stats(x, banned=5, temperature=temperature, uniforms=u, block_v=128)
    ref = vocab_stats_reference(x, banned=5, temperature=temperature, uniforms=u)
    sampler = argmax_excluding(gumbel_perturb(x, temperature, u.double()), 5)  # what the samplers do
    assert torch.equal(st.sample, ref.sample) and torch.equal(st.sample, sampler)
    assert_close("sample_prob", ref.sample_prob, st.sample_prob, 1e-5, atol=ATOL["sample_prob"])
    assert torch.equal(st.argmax, ref.argmax)  # the greedy fields are still there


def test_philox_draws_are_reproducible_and_tile_invariant():
    g = torch.Generator().manual_seed(2)
    x = (2 * torch.randn(4, 96, generator=g)).to(DEVICE)
    x[:, 3] = 50.0  # banned and overwhelming: must never be drawn
    a = vocab_stats(x, banned=3, temperature=1.0, seed=123, block_v=16)
    b = vocab_stats(x, banned=3, temperature=1.0, seed=123, block_v=128)
    c = vocab_stats(x, banned=3, temperature=1.0, seed=124, block_v=128)
    assert torch.equal(a.sample, b.sample)  # keyed by (seed, row * V + v), not by tile
    assert not torch.equal(a.sample, c.sample)
    assert (a.sample != 3).all()
    p = torch.softmax(x.double(), -1)
    assert torch.allclose(a.sample_prob.double(), p.gather(-1, a.sample[:, None]).squeeze(-1), atol=1e-6)


@pytest.mark.slow  # seconds: the default run leaves it to -m slow (CI runs both)
def test_philox_draws_follow_the_tempered_softmax():
    n, vocab, temperature = 96 if INTERPRETED else 20000, 8, 1.0  # Philox is slow in the interpreter
    logits = torch.tensor([1.0, 0.5, 0.0, -0.5, 0.8, 0.2, -0.2, 3.0])  # every allowed p >= 7%
    x = logits.expand(n, vocab).contiguous().to(DEVICE)
    st = vocab_stats(x, banned=7, temperature=temperature, seed=7)
    counts = torch.bincount(st.sample.cpu(), minlength=vocab).double()
    allowed = logits.clone()
    allowed[7] = float("-inf")
    expect = torch.softmax(allowed.double() / temperature, 0) * n
    assert counts[7] == 0
    chi2 = float(((counts[:7] - expect[:7]) ** 2 / expect[:7]).sum())
    assert chi2 < 30.0, f"chi-square {chi2:.1f} over 6 degrees of freedom (p < 1e-4)"


def test_out_buffers_are_written_in_place_and_checked():
    x = torch.randn(3, 5, 40, generator=torch.Generator().manual_seed(0)).to(DEVICE)
    idx = torch.empty(3, 5, 2, dtype=torch.int64, device=DEVICE)
    val = torch.empty(3, 5, 6, dtype=torch.float32, device=DEVICE)
    st, ref = vocab_stats(x, banned=7, out=(idx, val)), vocab_stats(x, banned=7)
    assert st.idx is idx and st.val is val
    assert torch.equal(st.argmax, ref.argmax) and torch.equal(st.top1_prob, ref.top1_prob)
    assert torch.equal(st.entropy, ref.entropy)
    for bad in [(idx[:2], val), (idx, val.double()), (idx.transpose(0, 1).contiguous().transpose(0, 1), val)]:
        with pytest.raises(ValueError, match="vocab_stats: out must be contiguous tensors"):
            vocab_stats(x, out=bad)


def test_argument_checks():
    x = torch.zeros(2, 10, device=DEVICE)
    with pytest.raises(ValueError, match="exactly one of uniforms"):
        vocab_stats(x, temperature=1.0)
    with pytest.raises(ValueError, match="exactly one of uniforms"):
        vocab_stats(x, temperature=1.0, seed=1, uniforms=torch.rand(2, 10, device=DEVICE))
    with pytest.raises(ValueError, match="outside the vocabulary"):
        vocab_stats(x, banned=10)
    with pytest.raises(ValueError, match="uniforms must have the logits' shape"):
        vocab_stats(x, temperature=1.0, uniforms=torch.rand(2, 9, device=DEVICE))
    with pytest.raises(TypeError, match="float32/float16/bfloat16"):
        vocab_stats(x.double())
    for bad in (-1.0, float("nan")):  # NaN was taken for T = 0: no draw, silently
        with pytest.raises(ValueError, match=f"temperature must be a number >= 0, got {bad}"):
            vocab_stats(x, temperature=bad, seed=1)
    with pytest.raises(ValueError, match="block_v must be a power of two .*got 24"):
        vocab_stats(x, block_v=24)


@pytest.mark.parametrize("banned", [0, 5, 39])
def test_rows_without_a_finite_allowed_logit_give_the_lowest_allowed_id(banned):
    """A row of -inf (or one where only the banned id is finite) has no maximum: the arg-max and the
    draw are the lowest id that is not banned, as ``argmax_excluding``; never -1 (an id outside the
    vocabulary), never the banned id."""
    x = torch.full((3, 40), float("-inf"))
    x[1, 0] = 2.0  # only id 0 finite: banned or not
    x[2, 5] = 1.0
    x = x.to(DEVICE)
    expect = argmax_excluding(x.cpu(), banned)  # [1, 1, 5] for banned 0; [0, 0, 0] for 5; [0, 0, 5] for 39
    st = vocab_stats(x, banned=banned, block_v=16)
    assert st.argmax.cpu().tolist() == expect.tolist() == vocab_stats_reference(x, banned=banned).argmax.cpu().tolist()
    u = torch.rand(x.shape, generator=torch.Generator().manual_seed(1), dtype=torch.float64).to(DEVICE)
    drawn = vocab_stats(x, banned=banned, temperature=1.0, uniforms=u, block_v=16)
    ref = vocab_stats_reference(x, banned=banned, temperature=1.0, uniforms=u)
    assert drawn.sample.cpu().tolist() == expect.tolist() == ref.sample.cpu().tolist()
    assert (vocab_stats(x, banned=banned, temperature=1.0, seed=3, block_v=16).sample.cpu() == expect).all()


def _non_finite_rows(vocab: int, banned: int) -> torch.Tensor:
    """Rows with +inf, -inf and NaN logits, in different tiles of 16 (and on the banned id)."""
    inf, nan = float("inf"), float("nan")
    x = torch.randn(11, vocab, generator=torch.Generator().manual_seed(4))
    x[0, 20] = inf  # one +inf
    x[1, [20, 50]] = inf  # two +inf: gap inf - inf
    x[2, banned] = inf  # +inf on the banned id only
    x[3, 37] = nan  # one NaN, below the row's maximum
    x[4, [5, 40]] = 9.0
    x[4, 50] = nan  # a NaN in a later tile than the maximum
    x[5, 20], x[5, 33] = inf, nan  # +inf before a NaN
    x[6, banned] = nan  # NaN on the banned id only
    x[7] = nan  # all NaN
    x[8] = -inf  # all -inf
    x[9, :40] = -inf  # -inf on the first tiles, finite after
    x[10, 3], x[10, 60] = -inf, nan
    return x


def _same(a: torch.Tensor, b: torch.Tensor, atol: float) -> bool:
    return bool(torch.isclose(a.double().cpu(), b.double().cpu(), rtol=1e-5, atol=atol, equal_nan=True).all())


@pytest.mark.parametrize("dtype, banned", [(torch.float32, 12), (torch.float16, 0)], ids=["fp32-ban12", "fp16-ban0"])
def test_non_finite_logits_match_the_reference(dtype, banned):
    """NaN / +inf / -inf logits: the kernel gives what torch gives on the reference (``argmax`` /
    ``topk`` rank NaN first, the softmax of a row with a NaN or a +inf is NaN, ``logsumexp`` is +inf
    with a +inf), field by field, at every tiling; the Gumbel draw on the same uniforms too."""
    vocab = 64
    x = _non_finite_rows(vocab, banned).to(dtype).to(DEVICE)
    ref = vocab_stats_reference(x, banned=banned)
    assert torch.equal(ref.argmax.cpu(), argmax_excluding(x.cpu().float(), banned))  # the samplers' arg-max
    assert ref.argmax[3] == 37 and ref.argmax[4] == 50 and ref.argmax[5] == 33 and ref.argmax[0] == 20
    assert torch.isinf(ref.lse[0]) and torch.isnan(ref.lse[3]) and torch.isnan(ref.top1_prob[0])
    u = torch.rand(x.shape, generator=torch.Generator().manual_seed(8), dtype=torch.float64).to(DEVICE)
    ref_t = vocab_stats_reference(x, banned=banned, temperature=0.7, uniforms=u)
    for block_v in (16, 64):
        st = vocab_stats(x, banned=banned, block_v=block_v)
        assert st.argmax.cpu().tolist() == ref.argmax.cpu().tolist(), block_v
        for f in FLOAT_FIELDS:
            assert _same(getattr(st, f), getattr(ref, f), ATOL[f]), (f, block_v, getattr(st, f), getattr(ref, f))
        drawn = vocab_stats(x, banned=banned, temperature=0.7, uniforms=u, block_v=block_v)
        assert drawn.sample.cpu().tolist() == ref_t.sample.cpu().tolist(), block_v
        assert _same(drawn.sample_prob, ref_t.sample_prob, ATOL["sample_prob"]), block_v
        assert (st.argmax != banned).all() and (drawn.sample != banned).all()
