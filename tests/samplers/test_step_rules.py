"""Each reference sampler's step rule, checked on hand-built logits (no model)."""

import pytest
import torch

from dllm.samplers import make_sampler
from dllm.samplers._ops import (argmax_excluding, negative_entropy, take_top_k, threshold_commit, top1,
                                top_k_filter, top_p_filter, top_two_margin)

from builders import MASK, V, decode_state, step_input


def _state(bsz, width, steps, masks_at_start):
    return decode_state((bsz, width), block_steps=steps, block_masks_at_start=torch.tensor(masks_at_start))


def _input(logits, active, step, steps, temperature=0.0, generator=None):
    return step_input(logits, active, step=step, steps=steps, temperature=temperature, generator=generator)


def _peaked(prefs):
    """Logits whose arg-max at position i is prefs[i][0] with log-odds prefs[i][1]."""
    logits = torch.zeros(1, len(prefs), V)
    for i, (tok, strength) in enumerate(prefs):
        logits[0, i, tok] = strength
    return logits


def test_low_confidence_commits_scheduled_count_by_probability():
    logits = _peaked([(1, 1.0), (2, 5.0), (3, 3.0), (4, 4.0), (5, 2.0)])
    sampler = make_sampler("low_confidence")
    state = _state(1, 5, 2, [5])
    sampler.begin_block(state)  # 5 masks / 2 steps -> 3, 2
    out = sampler.step(_input(logits, torch.ones(1, 5, dtype=torch.bool), 0, 2), state)
    assert out.commit[0].tolist() == [False, True, True, True, False]
    assert out.tokens[0].tolist() == [1, 2, 3, 4, 5]


def test_low_confidence_never_commits_outside_active():
    logits = _peaked([(1, 9.0), (2, 5.0), (3, 3.0)])
    sampler = make_sampler("low_confidence")
    state = _state(1, 3, 3, [2])
    sampler.begin_block(state)
    active = torch.tensor([[False, True, True]])
    out = sampler.step(_input(logits, active, 0, 3), state)
    assert out.commit[0].tolist() == [False, True, False]


def test_mask_token_is_never_proposed():
    logits = _peaked([(MASK, 8.0), (2, 1.0)])
    logits[0, 0, 4] = 3.0  # runner-up at position 0
    sampler = make_sampler("low_confidence")
    state = _state(1, 2, 1, [2])
    sampler.begin_block(state)
    out = sampler.step(_input(logits, torch.ones(1, 2, dtype=torch.bool), 0, 1), state)
    assert out.tokens[0].tolist() == [4, 2]


def test_logits_eos_inf_and_confidence_eos_eot_inf():
    logits = _peaked([(7, 6.0), (2, 1.0), (8, 5.0)])  # EOS = 7, EoT = 8
    state = _state(1, 3, 3, [3])
    state.extras["eos_ids"] = (7, 8)
    active = torch.ones(1, 3, dtype=torch.bool)
    s1 = make_sampler("low_confidence", logits_eos_inf=True)
    s1.begin_block(state)
    out = s1.step(_input(logits.clone(), active, 0, 3), state)
    assert out.tokens[0, 0] != 7  # EOS can never be proposed
    s2 = make_sampler("low_confidence", confidence_eos_eot_inf=True)
    s2.begin_block(state)
    out = s2.step(_input(logits.clone(), active, 0, 3), state)
    assert out.tokens[0].tolist() == [7, 2, 8]  # still proposed ...
    assert out.commit[0].tolist() == [False, True, False]  # ... but committed last (confidence 0)
    assert out.score[0, 0] == 0 and out.score[0, 2] == 0


def test_random_remasking_commits_scheduled_count_reproducibly():
    logits = torch.randn(2, 6, V, generator=torch.Generator().manual_seed(0))
    sampler = make_sampler("random")
    state = _state(2, 6, 3, [6, 6])
    sampler.begin_block(state)
    active = torch.ones(2, 6, dtype=torch.bool)
    a = sampler.step(_input(logits, active, 0, 3, generator=torch.Generator().manual_seed(1)), state)
    b = sampler.step(_input(logits, active, 0, 3, generator=torch.Generator().manual_seed(1)), state)
    assert a.commit.sum(1).tolist() == [2, 2]
    assert torch.equal(a.commit, b.commit)


def _dream_step(name, logits, step, steps, active=None, **options):
    sampler = make_sampler(name, **options)
    state = _state(logits.shape[0], logits.shape[1], steps, [logits.shape[1]] * logits.shape[0])
    sampler.begin_block(state)
    active = torch.ones(logits.shape[:2], dtype=torch.bool) if active is None else active
    return sampler.step(_input(logits, active, step, steps), state)


def test_dream_first_step_commits_nothing_when_steps_equal_length():
    logits = _peaked([(1, 5.0), (2, 4.0), (3, 3.0), (4, 2.0)])
    out = _dream_step("maskgit_plus", logits, 0, 4)
    assert out.commit.sum() == 0  # k = int(4 * (1 - s/t)) = 0


def test_dream_k_follows_timesteps_and_last_step_commits_all():
    logits = _peaked([(1, 5.0), (2, 4.0), (3, 3.0), (4, 2.0), (5, 1.0), (6, 0.5)])
    t = torch.linspace(1, 1e-3, 3)  # steps = 2
    k0 = int(torch.tensor(6.0) * (1 - t[1] / t[0]))
    out = _dream_step("maskgit_plus", logits, 0, 2)
    assert int(out.commit.sum()) == k0 == 2
    assert out.commit[0, :k0].all()  # the most confident ones
    out = _dream_step("maskgit_plus", logits, 1, 2)
    assert out.commit.all()


def test_dream_confidence_kinds_rank_differently():
    # position 0: p1 = p2 (margin 0, high max); position 1: one clear winner but lower max
    logits = torch.full((1, 2, V), -10.0)
    logits[0, 0, 1] = logits[0, 0, 2] = 5.0
    logits[0, 1, 3] = 2.0
    probs = logits.softmax(-1)
    assert top_two_margin(probs)[0, 0] == 0
    m = _dream_step("topk_margin", logits, 1, 3)
    assert m.score[0, 1] > m.score[0, 0]
    e = _dream_step("entropy", logits, 1, 3)
    assert torch.allclose(e.score[0], negative_entropy(probs[0]))


def test_dream_origin_last_step_reveals_everything():
    logits = torch.randn(2, 5, V, generator=torch.Generator().manual_seed(0))
    out = _dream_step("origin", logits, 2, 3)
    assert out.commit.all() and (out.tokens != MASK).all()


def test_take_top_k_per_row_by_ranks():
    score = torch.tensor([[0.1, 0.9, 0.5, 0.7], [0.3, 0.2, 0.8, 0.1]])
    eligible = torch.tensor([[True, True, False, True], [True, True, True, True]])
    sel = take_top_k(score, torch.tensor([2, 3]), eligible)
    assert sel.tolist() == [[False, True, False, True], [True, True, True, False]]
    # k larger than the eligible count never selects ineligible positions
    assert take_top_k(score, torch.tensor([4, 0]), eligible).tolist() == [
        [True, True, False, True], [False] * 4]


def test_top1_is_take_top_k_of_one_lowest_index_on_ties():
    score = torch.tensor([[0.1, 0.9, 0.9, 0.5], [0.3, 0.3, 0.3, 0.3], [0.7, 0.2, 0.7, 0.1],
                          [float("-inf")] * 4, [0.5, 0.6, 0.7, 0.8]])
    eligible = torch.tensor([[True, True, True, True], [False, True, True, True], [False, True, True, True],
                             [False, True, False, True], [False] * 4])
    one = torch.ones((), dtype=torch.long)
    assert top1(score, eligible).tolist() == take_top_k(score, one, eligible).tolist() == [
        [False, True, False, False], [False, True, False, False], [False, False, True, False],
        [False] * 4, [False] * 4]  # ties: the lowest index; nothing eligible (or finite): nothing
    # any leading shape: [2, 5, 4]
    stacked = top1(torch.stack([score, score.flip(0)]), torch.stack([eligible, eligible.flip(0)]))
    assert torch.equal(stacked[1], top1(score.flip(0), eligible.flip(0)))


def test_threshold_commit_is_the_threshold_rule_plus_the_top1():
    conf = torch.tensor([[0.95, 0.5, 0.91, 0.2], [0.3, 0.4, 0.4, 0.1], [0.99, 0.99, 0.1, 0.1]],
                        dtype=torch.float64)
    eligible = torch.tensor([[True, True, True, True], [True, True, True, False], [False, True, True, True]])
    assert threshold_commit(conf, eligible, 0.9).tolist() == [
        [True, False, True, False], [False, True, False, False], [False, True, False, False]]
    # per-position thresholds
    tau = torch.tensor([[1.0, 0.4, 1.0, 1.0]], dtype=torch.float64)
    assert threshold_commit(conf, eligible, tau)[0].tolist() == [True, True, False, False]


def test_argmax_excluding():
    z = torch.tensor([[0.0, 3.0, 1.0], [2.0, 0.0, 1.0]])
    assert argmax_excluding(z, 1).tolist() == [2, 0]
    assert argmax_excluding(z, 2).tolist() == [1, 0]


def test_top_p_and_top_k_filters():
    logits = torch.log(torch.tensor([[0.5, 0.3, 0.15, 0.05]]))
    kept = top_p_filter(logits, 0.7) > torch.finfo(torch.float32).min
    assert kept.tolist() == [[True, True, False, False]]  # first token past 0.7 is kept
    assert (top_p_filter(logits, 1.0) == logits).all()
    kept = top_k_filter(logits, 3) > torch.finfo(torch.float32).min
    assert kept.tolist() == [[True, True, True, False]]


@pytest.mark.parametrize("name,options,match", [
    ("maskgit_plus", dict(top_p=0.0), r"top_p must be (a number )?in \(0, 1\], got 0.0"),
    ("maskgit_plus", dict(top_p=1.5), r"top_p must be (a number )?in \(0, 1\], got 1.5"),
    ("entropy", dict(top_k=0), r"top_k must be an integer >= 1, got 0"),
    ("origin", dict(eps=1.0), r"eps must be (a number )?in \(0, 1\), got 1.0"),
    ("topk_margin", dict(alg_temp=-1.0), r"alg_temp must be (a finite number )?>= 0"),
])
def test_out_of_range_options(name, options, match):
    with pytest.raises(ValueError, match=match):
        make_sampler(name, **options)


def test_unknown_option_lists_valid_ones():
    with pytest.raises(TypeError, match=r"Unknown option\(s\) 'threshold' for sampler 'low_confidence'. "
                                         r"Valid options: logits_eos_inf, confidence_eos_eot_inf"):
        make_sampler("low_confidence", threshold=0.9)


def test_unknown_sampler_lists_valid_ones():
    with pytest.raises(KeyError, match=r"Unknown sampler 'fastest'.*low_confidence.*maskgit_plus"):
        make_sampler("fastest")
