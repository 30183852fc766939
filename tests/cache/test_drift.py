"""The ``drift`` cache policy (dllm/cache/drift.py): the probe measures what the cache carried, the
window covers the drifted columns, and its limits reproduce ``none`` and ``dual`` exactly."""

import pytest
import torch

import dllm
from dllm.cache import make_cache
from dllm.cache.drift import drifted_columns
from dllm.models import tiny
from dllm.models.core.kv import DriftProbe

PROMPTS = [[7, 8, 9, 10, 11, 12], [13, 14], [15, 16, 17, 18]]  # ragged: left-padded batch


@pytest.fixture(scope="module", params=["llada", "dream"])
def model(request):
    return tiny(request.param, seed=3)


def _gen(model, cache, sampler="threshold", **kw):
    kw.setdefault("gen_length", 12)
    kw.setdefault("block_length", 4)
    opts = {"threshold": 0.5} if sampler == "threshold" else {}
    return dllm.generate(model, PROMPTS, sampler=sampler, cache=cache, return_trace=True, **opts, **kw)


def _same(a, b):
    assert torch.equal(a.sequences, b.sequences) and torch.equal(a.trace, b.trace)
    assert (a.nfe, a.forwarded_tokens) == (b.nfe, b.forwarded_tokens)


def test_drifted_columns_and_right_margin():
    d = torch.zeros(2, 20)
    d[0, 3], d[1, 7], d[0, 8], d[1, 15], d[0, 18] = 0.5, 0.2, 0.15, 0.3, 0.001
    cols, ahead = drifted_columns(d, 10, 14, 0.1)
    assert cols.tolist() == [3, 7, 8] and ahead == 2  # right: up to column 15
    assert drifted_columns(d, 10, 14, 0.1, max_extra=2)[0].tolist() == [3, 7]  # the two most drifted
    assert drifted_columns(d, 10, 14, 0.4)[0].tolist() == [3] and drifted_columns(d, 10, 14, 0.4)[1] == 0
    assert drifted_columns(d, 10, 14, 1.0)[0].numel() == 0
    assert drifted_columns(d, 10, 14, 0.0005)[1] == 5  # column 18 is the rightmost


def test_probe_measures_the_keys_the_cache_served():
    probe = DriftProbe()
    old = [torch.randn(2, 3, 10, 4) for _ in range(2)]
    new = [o + 0.1 * torch.randn_like(o) for o in old]
    for i, o in enumerate(old):
        probe.record(i, 2, o, torch.zeros_like(o))  # first full forward: nothing to compare
    assert probe.filled and probe.drift is None
    for i in range(2):
        probe.record(i, 2, new[i], old[i])
    expect = sum(((n - o).square().sum((1, 3)) / n.square().sum((1, 3))) for n, o in zip(new, old)) / 2
    torch.testing.assert_close(probe.drift, expect)


@pytest.mark.parametrize("cfg_scale", [0.0, 1.5], ids=["plain", "cfg"])
def test_limits_are_none_and_dual(model, cfg_scale):
    # every column drifts a little: the window is the whole canvas, i.e. a full forward every step
    _same(_gen(model, "drift:threshold=1e-30,first_look_back=none,first_look_ahead=64", cfg_scale=cfg_scale),
          _gen(model, "none", cfg_scale=cfg_scale))
    # nothing counts as drift and no first-block prefix: Fast-dLLM's dual cache exactly
    _same(_gen(model, "drift:threshold=1e30,first_look_back=0", cfg_scale=cfg_scale),
          _gen(model, "dual", cfg_scale=cfg_scale))


def _queries(model, spec):
    """(the policy's cached queries as (block, block start, Query) in call order, the output)."""
    seen = []
    policy = make_cache(spec)
    real = policy.cached_query

    def spy(state, shift):
        q = real(state, shift)
        seen.append((state.block_index, state.block_start, q))
        return q
    policy.cached_query = spy
    return seen, _gen(model, policy, gen_length=16)


def test_first_block_recomputes_the_prefix_then_follows_the_drift(model):
    queries, out = _queries(model, "drift:threshold=0.01,first_look_back=none")
    seen = [(b, q.start, q.end, None if q.extra is None else tuple(q.extra.tolist())) for b, _, q in queries]
    first = [q for q in seen if q[0] == 0]
    assert first and all(q[1:3] == (0, 6 + 4) and q[3] is None for q in first)  # the 6 prompt columns, block 0
    later = [q for q in seen if q[0] > 0]
    assert later and any(q[3] for q in later)  # later blocks recompute drifted columns left of the block
    per_block = {}
    for b, s, e, extra in seen:
        per_block.setdefault(b, set()).add((s, e, extra))
        assert not extra or (max(extra) < s and list(extra) == sorted(extra))
    assert all(len(v) == 1 for v in per_block.values())  # one query per block
    assert out.forwarded_tokens < _gen(model, "none", gen_length=16).forwarded_tokens


def test_verification_samplers_run_on_it(model):
    """fast (LoPA variants) is served: the window is fixed per block."""
    ref = _gen(model, "none", "fast")
    _same(_gen(model, "drift:threshold=1e-30,first_look_back=none,first_look_ahead=64", "fast"), ref)
    out = _gen(model, "drift", "fast")
    assert out.sequences.shape == ref.sequences.shape


@pytest.mark.parametrize("spec,match", [
    ("drift:threshold=0", "drift threshold must be a number > 0"),
    ("drift:threshold=-1", "drift threshold must be a number > 0"),
    ("drift:max_extra=-2", "max_extra"),
    ("drift:first_look_ahead=1.5", "first_look_ahead"),
])
def test_bad_options(spec, match):
    with pytest.raises(ValueError, match=match):
        make_cache(spec)


def test_first_block_vicinity_and_extra_cap(model):
    queries, _ = _queries(model, "drift:threshold=1e-30,max_extra=2,first_look_back=3")
    seen = [(b, s, q.start, q.n_extra) for b, s, q in queries]
    assert {q[2] for q in seen if q[0] == 0} == {6 - model.logit_shift - 3}  # block 0 starts at column 6
    later = [q for q in seen if q[0] > 0]
    assert later and all(q[3] == 2 for q in later)  # every column drifts; the 2 most drifted


def test_shadow_block_samplers_are_refused(model):
    with pytest.raises(ValueError, match="sampler 'wino' decodes with a shadow block, which cache policy 'drift' "
                                         "cannot serve"):
        _gen(model, "drift:threshold=1e-30", "wino", gen_length=16)
