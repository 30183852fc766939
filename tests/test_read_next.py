"""StepOutput.read_next: values a step leaves for the next step of its block, read to the host with the
engine's test that the block still has masks (one read for both) and handed over as StepInput.host_read.
LoPA's compacted lookahead with reuse (``fast`` on a CPU) makes its next anchor so: its variant batch's
shape then costs no read of its own after a block's first step, with the same tokens."""

from __future__ import annotations

import pytest
import torch

import dllm
from dllm.eval.bench.counters import count_generate
from dllm.models import tiny
from dllm.rows import release_rows
from dllm.samplers.base import NoOptions, Sampler
from dllm.samplers.threshold import Threshold

PROMPTS = [[7, 8, 9, 10, 11], [12, 13], [14, 15, 16]]


class _Recorder(Sampler):
    """Threshold's decisions (tau 1), plus read_next = [block step, rows]; records every step's host_read."""

    Config = NoOptions
    fixed_steps = False

    def __init__(self, dtype=torch.long, **options) -> None:
        super().__init__(None, **options)
        self.inner, self.dtype, self.seen = Threshold(threshold=1.0), dtype, []  # one token a step

    def step(self, inp, state):
        self.seen.append((state.block_index, inp.step, inp.host_read, inp.reads_next))
        out = self.inner.step(inp, state)
        out.read_next = torch.tensor([inp.step, inp.tokens.shape[0]], dtype=self.dtype, device=inp.tokens.device)
        return out


def test_the_engine_hands_the_values_to_the_next_step_of_the_block():
    model = tiny("llada", seed=3)
    smp = _Recorder()
    ref = dllm.generate(model, PROMPTS, sampler="threshold", gen_length=16, block_length=8, threshold=1.0)
    out = dllm.generate(model, PROMPTS, sampler=smp, gen_length=16, block_length=8)
    assert torch.equal(out.sequences, ref.sequences)  # reading them changes nothing else
    assert len(smp.seen) == out.steps > 2
    for (block, i, host, reads), prev in zip(smp.seen, [None] + smp.seen[:-1]):
        assert reads == (i + 1 < 8)  # a block of 8 takes at most 8 steps: its last one is followed by no test
        if i == 0:  # a block's first step follows no test of its masks: nothing read for it
            assert host is None
        else:
            assert prev[:2] == (block, i - 1) and host == [i - 1, len(PROMPTS)]


def test_a_read_next_that_is_not_an_integer_vector_is_refused():
    with pytest.raises(RuntimeError, match="returned read_next .*float32 on cpu; it must be a 1-D integer tensor"):
        dllm.generate(tiny("llada", seed=3), PROMPTS, sampler=_Recorder(dtype=torch.float32), gen_length=8,
                      block_length=8)


@pytest.mark.parametrize("cache", ["none", "dual"])
@pytest.mark.parametrize("family", ["llada", "dream"])
def test_fast_reads_its_variant_counts_once_a_block(family, cache):
    """fast as on a CPU (compacted, reuse): the candidate counts are read in the sampler at a block's
    first step, later steps get them with the engine's test (but after a step that may have filled the
    block: a step leaving a row at most one candidate); the same tokens as static batches, which read
    nothing (and forward more)."""
    model = tiny(family, seed=3)
    kw = dict(gen_length=16, block_length=8, cache=cache, tau_conf=1.0)  # several lookahead steps a block
    counter = count_generate(model, PROMPTS, sampler="fast", **kw)
    sampler_reads = sum("dllm/samplers/lopa.py" in site for step in counter.steps for site in step.syncs)
    merged = sum("tolist @ dllm/engine/loop.py" in site for step in counter.steps for site in step.syncs)
    assert 1 <= sampler_reads <= 4 < len(counter.steps)  # a block's first step (2 blocks), and after a
    assert merged >= len(counter.steps) - 2 - sampler_reads  # step that may have filled it; else merged
    out = dllm.generate(model, PROMPTS, sampler="fast", **kw)
    static = dllm.generate(model, PROMPTS, sampler="fast", compact=False, **kw)
    assert torch.equal(out.sequences, static.sequences) and out.nfe <= static.nfe
    assert len(counter.steps) == out.steps


@pytest.mark.parametrize("family", ["llada", "dream"])
@pytest.mark.parametrize("at", [1, 2, 3, 4])
def test_a_row_released_mid_block_is_not_decoded_by_a_made_anchor(family, at):
    """A callback releasing a row mid-block (as the server does at a stop string) fills its masks: the
    anchor the last step made still counted them, so it is not taken; the same tokens as static batches."""
    model = tiny(family, seed=3)

    def run(compact):
        def release(state):
            if state.step == at:
                release_rows(state, [1])
        return dllm.generate(model, PROMPTS, sampler="fast", compact=compact, gen_length=16, block_length=8,
                             tau_conf=1.0, callback=release)

    out, static = run(True), run(False)
    assert torch.equal(out.sequences, static.sequences) and out.generated_tokens == static.generated_tokens


class _Ends(Sampler):
    """Threshold's decisions (tau 1: one token a step) that always say they end the block
    (StepOutput.fills_block), optionally with a re-mask too."""

    Config = NoOptions
    fixed_steps = False

    def __init__(self, remask=False, **options) -> None:
        super().__init__(None, **options)
        self.inner, self.remask = Threshold(threshold=1.0), remask

    def step(self, inp, state):
        out = self.inner.step(inp, state)
        out.fills_block = True
        if self.remask:
            out.remask = torch.zeros_like(out.commit)
        return out


@pytest.mark.parametrize("cache", ["none", "dual"])
@pytest.mark.parametrize("family", ["llada", "dream"])
def test_a_step_whose_anchor_fills_the_block_ends_it_without_a_read(family, cache):
    """fast's counts read at a block's first step say that the anchor fills every row's block (every
    mask clears tau): that step ends the block (StepOutput.fills_block), so the block costs that one
    read and no test of its masks; the same tokens as the threshold rule it applies."""
    model = tiny(family, seed=3)
    kw = dict(gen_length=16, block_length=8, cache=cache)
    counter = count_generate(model, PROMPTS, sampler="fast", tau_conf=1e-9, **kw)
    sites = [site for step in counter.steps for site in step.syncs]
    assert len(counter.steps) == 2  # one step a block
    assert sum("dllm/samplers/lopa.py" in site for site in sites) == 2
    assert not [site for site in sites if "dllm/engine/loop.py" in site]  # before: one test per block
    out = dllm.generate(model, PROMPTS, sampler="fast", tau_conf=1e-9, **kw)
    ref = dllm.generate(model, PROMPTS, sampler="threshold", threshold=1e-9, **kw)
    assert torch.equal(out.sequences, ref.sequences) and out.nfe == ref.nfe == 2


def test_a_sampler_that_says_it_ended_a_block_with_masks_left_fails_the_call():
    with pytest.raises(RuntimeError, match=r"masks are left in blocks whose last step said it ended them .*"
                                           r"blocks \[\(5, 13\)\]"):
        dllm.generate(tiny("llada", seed=3), PROMPTS, sampler=_Ends(), gen_length=8, block_length=8)


def test_fills_block_with_a_remask_is_refused():
    with pytest.raises(RuntimeError, match="returned fills_block with remask, beyond"):
        dllm.generate(tiny("llada", seed=3), PROMPTS, sampler=_Ends(remask=True), gen_length=8, block_length=8)


class _RefiningEnds(_Ends):
    refines = True  # its block runs while a row has masks or is not settled: no step ends it alone


def test_fills_block_from_a_refining_sampler_is_refused():
    with pytest.raises(RuntimeError, match="returned fills_block .* or while it refines"):
        dllm.generate(tiny("llada", seed=3), PROMPTS, sampler=_RefiningEnds(), gen_length=8, block_length=8)


def test_spec_threshold_ends_a_block_that_its_first_set_fills_without_a_read():
    """spec_threshold reads whether any draft is left to verify; where none is, its first set holds every
    mask and the step ends the block (StepOutput.fills_block): no test of the block's masks follows."""
    model = tiny("llada", seed=3)
    kw = dict(gen_length=16, block_length=8, threshold=1e-9)
    counter = count_generate(model, PROMPTS, sampler="spec_threshold", **kw)
    sites = [site for step in counter.steps for site in step.syncs]
    assert len(counter.steps) == 2 and not [site for site in sites if "dllm/engine/loop.py" in site]
    out = dllm.generate(model, PROMPTS, sampler="spec_threshold", **kw)
    assert torch.equal(out.sequences, dllm.generate(model, PROMPTS, sampler="threshold", **kw).sequences)
