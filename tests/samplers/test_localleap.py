"""LocalLeap (``localleap``): the anchor-relaxed threshold on hand-built logits, end to end on tiny
models, and on the exact-posterior oracle."""

import pytest
import torch

import dllm
from dllm import tasks as T
from dllm.models import tiny
from dllm.models.oracle import OracleLM, oracle_prompts, score_generation
from dllm.samplers import make_sampler
from dllm.samplers.localleap import near_anchor

from builders import MASK, log_probs, ordinary_ids, prob_row, step_input


def _input(tops, active=None):
    """One row; position i proposes token i % 8 with probability tops[i] (the mask id: ~0)."""
    logits = log_probs([[prob_row(t, i % 8, mask_id=MASK) for i, t in enumerate(tops)]])  # [1, W, V]
    return step_input(logits, None if active is None else [active])


@pytest.mark.parametrize("anchors,radius,expected", [
    ([2], 1, [0, 1, 1, 1, 0, 0]),
    ([2], 0, [0, 0, 1, 0, 0, 0]),
    ([0, 5], 2, [1, 1, 1, 1, 1, 1]),
    ([0], 9, [1, 1, 1, 1, 1, 1]),
    ([], 3, [0, 0, 0, 0, 0, 0]),
])
def test_near_anchor(anchors, radius, expected):
    a = torch.zeros(1, 6, dtype=torch.bool)
    a[0, anchors] = True
    assert near_anchor(a, radius)[0].long().tolist() == expected


# ---- the rule -----------------------------------------------------------------------------------------
def test_relaxed_bar_applies_only_within_the_radius_of_an_anchor():
    #        0     1     2    3    4    5    6     7
    tops = [0.95, 0.80, 0.5, 0.5, 0.5, 0.5, 0.80, 0.91]
    out = make_sampler("localleap", radius=2).step(_input(tops), None)
    # anchors 0 and 7 (>= 0.9); 1 is within 2 of anchor 0 and passes 0.75; 6 is within 2 of anchor 7
    assert out.commit[0].tolist() == [True, True, False, False, False, False, True, True]
    out = make_sampler("localleap", radius=0).step(_input(tops), None)
    assert out.commit[0].tolist() == [True, False, False, False, False, False, False, True]
    out = make_sampler("localleap", radius=2, relaxed_threshold=0.85).step(_input(tops), None)
    assert out.commit[0].tolist() == [True, False, False, False, False, False, False, True]


def test_only_active_masks_are_anchors():
    tops = [0.99, 0.8, 0.5]
    out = make_sampler("localleap").step(_input(tops, [False, True, True]), None)
    assert out.commit[0].tolist() == [False, True, False]  # 1 is the top-1, not relaxed by position 0


def test_nothing_passes_commits_the_top_one_and_everything_passes_commits_all():
    out = make_sampler("localleap").step(_input([0.5, 0.7, 0.6, 0.3]), None)
    assert out.commit[0].tolist() == [False, True, False, False]  # the engine fallback is never needed
    out = make_sampler("localleap").step(_input([0.95, 0.8, 0.76, 0.8, 0.99]), None)
    assert out.commit[0].all()


def test_the_mask_token_is_never_proposed():
    inp = _input([0.9, 0.9])
    inp.logits[0, 0, MASK] = 10.0
    assert make_sampler("localleap").step(inp, None).tokens[0, 0] != MASK


@pytest.mark.parametrize("options,match", [
    (dict(threshold=0.0), r"threshold must be a number in \(0, 1\], got 0.0"),
    (dict(threshold=1.5), r"threshold must be a number in \(0, 1\], got 1.5"),
    (dict(relaxed_threshold=0.95),
     r"relaxed_threshold must be a number in \(0, 0.9\] \(at most threshold\), got 0.95"),
    (dict(relaxed_threshold=0), r"relaxed_threshold must be a number in \(0, 0.9\] \(at most threshold\), got 0"),
    (dict(radius=-1), r"radius must be an integer >= 0, got -1"),
    (dict(radius=1.5), r"radius must be an integer >= 0, got 1.5"),
])
def test_out_of_range(options, match):
    with pytest.raises(ValueError, match=match):
        make_sampler("localleap", **options)


# ---- end to end -------------------------------------------------------------------------------------
@pytest.fixture(scope="module", params=["llada", "dream"])
def model(request):
    return tiny(request.param, seed=0)


# default options: the contract tests (tests/samplers/test_sampler_contract.py)
@pytest.mark.parametrize("options", [dict(threshold=0.5, relaxed_threshold=0.2, radius=1)])
def test_batch_of_ragged_prompts_finishes_and_equals_each_prompt_alone(model, options):
    prompts = [ordinary_ids(model, 3, 1), ordinary_ids(model, 8, 2), ordinary_ids(model, 5, 3)]
    kw = dict(sampler="localleap", gen_length=8, block_length=4, **options)
    batch = dllm.generate(model, prompts, **kw)
    assert (batch.generated != model.mask_id).all() and batch.nfe <= 8
    for j, p in enumerate(prompts):
        assert torch.equal(batch.generated[j], dllm.generate(model, [p], **kw).generated[0]), j


def test_threshold_one_is_one_token_per_step(model):
    # nothing reaches p = 1, so no anchors and no relaxation: the top-1 per step = low_confidence
    p = [ordinary_ids(model, 5, 0), ordinary_ids(model, 2, 4)]
    out = dllm.generate(model, p, sampler="localleap", threshold=1.0, gen_length=8, block_length=4)
    ref = dllm.generate(model, p, sampler="low_confidence", gen_length=8, block_length=4)
    assert out.nfe == 8 and torch.equal(out.sequences, ref.sequences)


@pytest.mark.parametrize("options", [dict(radius=0), dict(relaxed_threshold=0.5, threshold=0.5)])
def test_without_relaxation_it_is_fast_dllm_threshold(model, options):
    p = [ordinary_ids(model, 5, 0), ordinary_ids(model, 2, 4)]
    tau = options.get("threshold", 0.9)
    out = dllm.generate(model, p, sampler="localleap", gen_length=12, block_length=6, **options)
    ref = dllm.generate(model, p, sampler="threshold", threshold=tau, gen_length=12, block_length=6)
    assert out.nfe == ref.nfe and torch.equal(out.sequences, ref.sequences)


def test_sampling_is_reproducible_under_a_seed(model):
    kw = dict(sampler="localleap", threshold=0.5, relaxed_threshold=0.3, gen_length=8, temperature=1.0)
    a = dllm.generate(model, [ordinary_ids(model, 4, 0)], seed=5, **kw)
    b = dllm.generate(model, [ordinary_ids(model, 4, 0)], seed=5, **kw)
    assert torch.equal(a.sequences, b.sequences) and (a.generated != model.mask_id).all()


# ---- the exact-posterior oracle ------------------------------------------------------------------------
@pytest.fixture(scope="module")
def oracle():
    return OracleLM()


@pytest.mark.parametrize("task", ["copy", "reverse"])
def test_single_answer_tasks_are_solved_in_fewer_forwards_than_tokens(oracle, task):
    exs = T.test_split(task, 8, 6)
    g = T.answer_length(task, 8)  # 9: eight words and the EOS
    out = dllm.generate(oracle, oracle_prompts(exs), sampler="localleap", gen_length=g, block_length=4)
    assert all(score_generation(exs, out))
    assert out.nfe == 3 < g  # c = 1 everywhere: each block in one forward


def test_relaxing_below_the_marginals_breaks_dependent_positions(oracle):
    # shuffle of 3 items: each item slot starts at p = 1/3 and the EOS slot at p = 1 (an anchor).
    # Default bars: one slot per step (the EOS, then items at 1/3, 1/2, 1): always a permutation.
    # tau_relax = 0.3 < 1/3: every slot near the EOS anchor passes at once and, from independent
    # marginals (ties -> the same item), the row repeats an item: never valid.
    exs = T.test_split("shuffle", 3, 4)
    g = T.answer_length("shuffle", 3)  # 4: three items and the EOS
    safe = dllm.generate(oracle, oracle_prompts(exs), sampler="localleap", gen_length=g)
    assert all(score_generation(exs, safe)) and safe.nfe == 4
    leap = dllm.generate(oracle, oracle_prompts(exs), sampler="localleap", relaxed_threshold=0.3, gen_length=g)
    assert not any(score_generation(exs, leap)) and leap.nfe == 1
