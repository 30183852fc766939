"""StepOutput.next_logits: a sampler hands the next step the logits of its own variant forward.

The fast path (the engine skips the next step's forward) against the reference (the forward run
anyway): the carried logits must be the ones the skipped forward computes, under every cache that
serves verification variants, both families, CFG and a ragged batch.
"""

import pytest
import torch

import dllm
from dllm.engine.loop import Decode
from dllm.models import tiny
from dllm.samplers.base import NoOptions, Sampler
from dllm.state import StepOutput

PROMPTS = [[7, 8, 9, 10, 11], [12, 13], [14, 15, 16]]


@pytest.fixture
def checked(monkeypatch):
    """Patch the engine so that every step that receives carried logits also runs the forward it
    skips; records (carried, recomputed, rows with masks in the block) per such step."""
    seen = []
    original = Decode._step

    def step(self, i, s, e, block_steps):
        state = self.state
        if self._carried is not None and self._carried[0] == (state.block_index, i - 1):
            query = self.policy.query(state, i, self.shift)
            nfe, fwd = state.nfe, state.forwarded_tokens
            fresh, _ = self.forward(query, rows=(s - query.start, e - query.start))
            state.nfe, state.forwarded_tokens = nfe, fwd  # the reference forward is not counted
            live = (state.x[:, s:e] == state.mask_id).any(dim=1)
            seen.append((self._carried[1].clone(), fresh, live))
        return original(self, i, s, e, block_steps)

    monkeypatch.setattr(Decode, "_step", step)
    return seen


@pytest.mark.parametrize("family", ["llada", "dream"])
@pytest.mark.parametrize("cache", ["none", "dual", "dual:look_back=3,look_ahead=2", "prefix"])
@pytest.mark.parametrize("cfg_scale", [0.0, 1.5])
def test_carried_logits_are_the_skipped_forward(checked, family, cache, cfg_scale):
    model = tiny(family, seed=3)
    out = dllm.generate(model, PROMPTS, sampler="lopa", gen_length=16, block_length=8, reuse=True,
                        branches=3, tau_conf=1.0, cache=cache, cfg_scale=cfg_scale)
    assert checked, "tau_conf=1 leaves masks after every anchor: later steps must reuse logits"
    for carried, fresh, live in checked:
        assert live.any()
        torch.testing.assert_close(carried[live], fresh[live], atol=1e-4, rtol=1e-4)
    assert out.nfe < out.steps * 2  # the reused steps ran no forward of their own


@pytest.mark.parametrize("family", ["llada", "dream"])
@pytest.mark.parametrize("cache", ["none", "dual"])
def test_one_variant_with_reuse_is_threshold_decoding_at_its_nfe(family, cache):
    # branches=1: the variant is B0' alone, whose forward is the next threshold step's forward
    model = tiny(family, seed=3)
    ref = dllm.generate(model, PROMPTS, sampler="threshold", gen_length=12, block_length=4, cache=cache)
    out = dllm.generate(model, PROMPTS, sampler="lopa", gen_length=12, block_length=4, branches=1,
                        reuse=True, cache=cache)
    assert torch.equal(out.sequences, ref.sequences)
    assert out.nfe == ref.nfe and out.steps == ref.steps


def test_reuse_saves_forwards_over_the_bonus_loop():
    model = tiny("llada", seed=3)
    kw = dict(sampler="lopa", gen_length=16, block_length=8, branches=3, tau_conf=1.0)
    loop = dllm.generate(model, PROMPTS, **kw)
    reuse = dllm.generate(model, PROMPTS, **kw, reuse=True)
    assert (reuse.generated != model.mask_id).all()
    # the bonus loop pays two forwards per lookahead step; reuse one (plus each block's first)
    assert loop.nfe > loop.steps and reuse.nfe <= reuse.steps + 2


class _RemaskingCarrier(Sampler):
    """Hands on logits but also re-masks a committed token: the logits no longer fit the canvas."""

    Config = NoOptions
    fixed_steps = True
    reads_block_only = True
    revises = True

    def step(self, inp, state):
        return StepOutput(commit=inp.active, tokens=inp.tokens.clone().fill_(5), next_logits=inp.logits,
                          remask=torch.zeros_like(inp.active))


def test_next_logits_with_a_remask_is_refused():
    model = tiny("llada", seed=3)
    with pytest.raises(RuntimeError, match="returned next_logits with remask or beyond"):
        dllm.generate(model, PROMPTS, sampler=_RemaskingCarrier(), gen_length=4, steps=4)


def test_the_full_query_reference_path_forwards_anew(monkeypatch):
    # the block view's reference (reads_block_only off): same tokens, every step forwards
    model = tiny("llada", seed=3)
    kw = dict(sampler="lopa", gen_length=16, block_length=8, branches=3, tau_conf=1.0, reuse=True)
    fast = dllm.generate(model, PROMPTS, **kw)
    with monkeypatch.context() as m:
        m.setattr(type(dllm.samplers.make_sampler("lopa")), "reads_block_only", False)
        ref = dllm.generate(model, PROMPTS, **kw)
    assert torch.equal(fast.sequences, ref.sequences)
    assert ref.nfe > fast.nfe
