"""The contract every registered sampler must keep, run over ``list_samplers()``.

- the output has the right shapes and dtypes and no masks are left (also at temperature > 0);
- one forward per step, plus at most one batched verification forward for samplers that
  declare ``needs_variants``;
- prompts are never changed and committed tokens never change (non-revising samplers);
- the trace shows progress: every step commits at least one position per row, except where a
  reference algorithm is known to idle (Dream's schedule commits 0 at its first step);
- determinism under a seed (also at temperature > 0);
- a batch of ragged prompts decodes each row as it decodes alone (samplers without batch-shaped
  random draws);
- both model families.
"""

import pytest
import torch

import dllm
from dllm.models import tiny
from dllm.samplers import samplers

ALL = [e.name for e in samplers]
RANDOM_DRAWS = {"random", "origin"}  # draw noise whose shape follows the batch, like the references
MAY_IDLE = {"origin", "maskgit_plus", "topk_margin", "entropy"}  # Dream's schedule: k = 0 steps


@pytest.fixture(scope="module", params=["llada", "dream"])
def model(request):
    return tiny(request.param, seed=5)


PROMPTS = [[7, 8, 9, 10, 11], [12, 13], [14, 15, 16]]


def _run(model, name, prompts=PROMPTS, **kw):
    kw.setdefault("gen_length", 8)
    kw.setdefault("block_length", 4)
    return dllm.generate(model, prompts, sampler=name, return_trace=True, **kw)


@pytest.mark.parametrize("name", ALL)
def test_shapes_no_masks_prompt_untouched(model, name):
    out = _run(model, name)
    assert out.sequences.dtype == torch.long and out.sequences.shape == (3, 5 + 8)
    assert (out.generated != model.mask_id).all()
    for j, p in enumerate(PROMPTS):
        assert out.sequences[j, 5 - len(p):5].tolist() == p
    assert out.trace.shape == (3, 8) and (out.trace >= 0).all()
    assert out.nfe >= 1 and out.steps >= out.trace.max().item() + 1
    if samplers.get(name).needs_variants:
        assert out.steps <= out.nfe <= 2 * out.steps
    else:
        assert out.nfe == out.steps


@pytest.mark.parametrize("name", ALL)
def test_progress_every_step(model, name):
    """Per row and block, the steps that committed something form an unbroken run from the block's
    first step: a row that still has masks commits at least one position at every step."""
    out = _run(model, name)
    assert out.trace.max().item() < out.steps
    # blocks are decoded left to right: every position of block 0 before any of block 1
    assert (out.trace[:, :4].max(dim=1).values < out.trace[:, 4:].min(dim=1).values).all()
    if name in MAY_IDLE:
        return
    for block in (slice(0, 4), slice(4, 8)):
        first = out.trace[:, block].min().item()  # the block's first step (all rows start together)
        for row in out.trace[:, block]:
            used = sorted(set(row.tolist()))
            assert used == list(range(first, used[-1] + 1)), (name, row.tolist())


@pytest.mark.parametrize("name", ALL)
@pytest.mark.parametrize("temperature", [0.0, 0.8])
def test_deterministic_under_seed(model, name, temperature):
    if temperature > 0 and samplers.get(name).greedy_only:
        with pytest.raises(ValueError, match="greedy only"):
            _run(model, name, temperature=temperature, seed=11)
        return
    a = _run(model, name, temperature=temperature, seed=11)
    b = _run(model, name, temperature=temperature, seed=11)
    assert torch.equal(a.sequences, b.sequences) and a.nfe == b.nfe
    assert (a.generated != model.mask_id).all()


@pytest.mark.parametrize("name", ALL)
def test_commits_are_final_unless_the_sampler_revises(model, name):
    """A committed token is never overwritten by another token; only revising samplers
    (``revises``) may turn one back into a mask (and they still end with none, checked above)."""
    canvases = []
    _run(model, name, callback=lambda s: canvases.append(s.generated.clone()))
    overwritten = remasked = 0
    for before, after in zip(canvases, canvases[1:]):
        was_set = before != model.mask_id
        overwritten += int((was_set & (after != model.mask_id) & (after != before)).sum())
        remasked += int((was_set & (after == model.mask_id)).sum())
    if not samplers.get(name).refines:  # refining samplers (dmax) rewrite their block's committed tokens
        assert overwritten == 0, name
    if not samplers.get(name).revises:
        assert remasked == 0, name


@pytest.mark.parametrize("name", [n for n in ALL if n not in RANDOM_DRAWS])
def test_ragged_batch_equals_each_prompt_alone(model, name):
    batch = _run(model, name)
    for j, p in enumerate(PROMPTS):
        alone = _run(model, name, prompts=[p])
        assert torch.equal(batch.generated[j], alone.generated[0]), (name, j)
