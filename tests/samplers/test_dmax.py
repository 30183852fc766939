"""The ``dmax`` sampler (dllm/samplers/dmax.py) and the engine's refinement path it uses (soft inputs,
rewrites of committed tokens, settled rows; dllm/engine/loop.py).

- the step rule: left-to-right threshold decoding, the leftmost mask when none qualifies;
- soft inputs reach the model: a block's later forwards get the interpolations at the decoded
  active positions (and tokens, NFE and forwarded tokens count them as ordinary forwards);
- the exact caches (``block`` on a block-causal model, a full forward every step) give ``none``'s tokens;
- a ragged batch decodes each row as alone, on every cache (``none``, ``dual``, ``auto``; ``block`` on
  block-causal families), with classifier-free guidance, a released row, and the static step path;
- ``threshold=0`` decodes a whole block in its first step, then revises it; ``max_steps`` caps a block;
- bad options get the registry's error naming the value and the valid ones; the engine refuses
  rewrites or settled rows from a sampler that does not declare ``refines``.
Token identity with the release: tests/samplers/test_dmax_reference.py.
"""

from __future__ import annotations

import pytest
import torch

import dllm
from dllm.models import tiny
from dllm.rows import release_rows
from dllm.samplers import make_sampler
from dllm.samplers.base import Sampler
from dllm.samplers.dmax import DMax, left_to_right
from dllm.state import StepOutput

PROMPTS = {"llada": [[7, 8, 9, 10, 11], [12, 13], [14, 15, 16]],
           "sdar": [[7, 8, 9, 10, 11], [12], [14, 15, 16, 17, 18]]}  # block-causal: lengths agree mod 4
CACHES = {"llada": ["none", "dual", "dual:refresh=2", "auto"], "sdar": ["none", "block", "auto"]}


@pytest.fixture(scope="module", params=["llada", "sdar"])
def family(request):
    return request.param, tiny(request.param, seed=5)


def _run(m, prompts, **kw):
    kw.setdefault("gen_length", 8)
    kw.setdefault("block_length", 4)
    return dllm.generate(m, prompts, sampler="dmax", return_trace=True, **kw)


def test_left_to_right():
    masks = torch.tensor([[True, True, False, True, True], [True, True, True, False, False]])
    conf = torch.tensor([[0.9, 0.6, 0.0, 0.2, 0.95], [0.1, 0.9, 0.9, 0.0, 0.0]])
    assert left_to_right(masks, conf, 0.5).tolist() == [[True, True, False, False, False],
                                                        [True, False, False, False, False]]  # leftmost
    assert left_to_right(masks, conf, 0.0).tolist() == masks.tolist()


def test_ragged_batch_equals_each_prompt_alone_on_every_cache(family):
    name, m = family
    for cache in CACHES[name]:
        batch = _run(m, PROMPTS[name], cache=cache)
        assert (batch.generated != m.mask_id).all()
        for j, p in enumerate(PROMPTS[name]):
            alone = _run(m, [p], cache=cache)
            assert torch.equal(batch.generated[j], alone.generated[0]), (cache, j)


def test_exact_caches_equal_none(family):
    """``block`` on a block-causal model and a full forward every step (``dual:refresh=1``) carry the soft
    inputs to the same logits as ``none``: the same tokens and forwards."""
    name, m = family
    none = _run(m, PROMPTS[name], cache="none", threshold=0.0)
    exact = _run(m, PROMPTS[name], cache="block" if name == "sdar" else "dual:refresh=1", threshold=0.0)
    assert torch.equal(none.generated, exact.generated) and none.nfe == exact.nfe
    assert exact.forwarded_tokens < none.forwarded_tokens or name == "llada"


def test_ragged_with_guidance_released_rows_and_static_steps(family):
    name, m = family
    prompts = PROMPTS[name]
    cache = "auto"
    cfg = _run(m, prompts, cfg_scale=1.0, cache=cache)
    for j, p in enumerate(prompts):
        assert torch.equal(cfg.generated[j], _run(m, [p], cfg_scale=1.0, cache=cache).generated[0])
    static = _run(m, prompts, cache=cache, cuda_graphs="static")
    assert torch.equal(static.generated, _run(m, prompts, cache=cache).generated)
    seen = []

    def release_first(state):  # row 0 released after its first step: the other rows decode as before
        if state.step == 1:
            release_rows(state, [0])
        seen.append(state.generated[0].clone())

    out = _run(m, prompts, cache=cache, callback=release_first)
    for j, p in enumerate(prompts[1:], start=1):
        assert torch.equal(out.generated[j], _run(m, [p], cache=cache).generated[0])
    assert all(torch.equal(a, seen[1]) for a in seen[1:])  # a released row is never rewritten


def test_soft_inputs_reach_the_model(family):
    """Each block's first forward takes tokens; later forwards take the interpolation at the block's
    decoded positions (the engine places the block's span at the query's rows)."""
    name, m = family
    calls = []
    original = type(m).forward

    def spy(self, input_ids, **kw):
        calls.append((input_ids.shape[1], kw.get("soft_inputs")))
        return original(self, input_ids, **kw)

    type(m).forward = spy
    try:
        out = _run(m, [PROMPTS[name][0]], cache="none", threshold=0.0)
    finally:
        type(m).forward = original
    assert len(calls) == out.nfe
    first_of_block = [c for c in calls if c[1] is None]
    soft = [c[1] for c in calls if c[1] is not None]
    starts = {"llada": {5, 9}, "sdar": {5, 8, 12}}[name]  # the blocks' first columns (prompt 5 wide; SDAR's
    assert len(first_of_block) == len(starts) and soft  # grid of 4 from position 0); refinement: soft inputs
    for s in soft:
        assert s.offset in starts
        assert s.where.any() and s.tokens[..., 1].eq(m.mask_id).all() and s.renorm_eps == 1e-6
        w = s.weights[s.where]
        assert torch.allclose(w.sum(dim=-1), torch.ones(len(w)))  # p and 1 - p


def test_threshold_zero_decodes_the_block_at_once_then_refines(family):
    name, m = family
    blocks = {"llada": [(0, 4), (4, 8)], "sdar": [(0, 3), (3, 7), (7, 8)]}[name]  # SDAR: its grid
    out = _run(m, [PROMPTS[name][0]], threshold=0.0)
    trace = out.trace[0]
    assert all(trace[a:b].unique().numel() == 1 for a, b in blocks)  # one step decodes a block
    assert out.nfe >= len(blocks)
    capped = _run(m, [PROMPTS[name][0]], threshold=0.0, max_steps=1)
    assert capped.nfe == len(blocks) and (capped.generated != m.mask_id).all()
    full = _run(m, [PROMPTS[name][0]], threshold=1.0)  # one mask per step: at least W steps per block
    assert full.nfe >= 8 and sorted(full.trace[0].tolist()) == full.trace[0].tolist()


def test_greedy_only():
    with pytest.raises(ValueError, match="greedy only"):
        _run(tiny("llada", seed=1), [[7, 8]], temperature=0.7, seed=1)


@pytest.mark.parametrize("bad, match", [
    (dict(threshold=1.5), r"threshold must be a number in \[0, 1\], got 1.5"),
    (dict(threshold=-0.1), "threshold"), (dict(confident=0.0), r"confident must be a number in \(0, 1\]"),
    (dict(max_steps=0), "max_steps must be an integer >= 1"), (dict(threshold="high"), "threshold"),
])
def test_bad_options(bad, match):
    with pytest.raises(ValueError, match=match):
        make_sampler("dmax", **bad)
    with pytest.raises(ValueError, match=match):
        dllm.generate(tiny("llada", seed=1), [[7, 8, 9]], sampler="dmax", gen_length=4, **bad)


def test_unknown_option_lists_the_valid_ones():
    with pytest.raises(TypeError, match="Unknown option.*'top_k'.*Valid options: threshold, confident, max_steps"):
        make_sampler("dmax:top_k=3")
    assert isinstance(make_sampler("dmax:threshold=0.7,max_steps=4"), DMax)


class _Rewrites(Sampler):
    """Commits the leftmost mask and asks to rewrite the block without declaring ``refines``."""

    name = "rewrites"
    fixed_steps = False

    def step(self, inp, state):
        commit = inp.active & (inp.active.long().cumsum(dim=1) == 1)
        return StepOutput(commit=commit, tokens=torch.full_like(inp.tokens, 20), rewrite=~inp.active)


def test_engine_refuses_rewrites_without_refines():
    with pytest.raises(RuntimeError, match="does not declare refines = True"):
        dllm.generate(tiny("llada", seed=1), [[7, 8, 9]], sampler=_Rewrites(), gen_length=4)
