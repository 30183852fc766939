"""Each reference sampler's step rule, checked on hand-built logits (no model)."""

import pytest
import torch

from dllm.samplers import make_sampler
from dllm.samplers._ops import (argmax_excluding, expand_window, negative_entropy, take_top_k, threshold_commit,
                                top1, top_k_filter, top_p_filter, top_two_margin)
from dllm.samplers.chunked import pick_last, softmax_prob

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


def _two_sided_argmax(z: torch.Tensor, banned: int) -> torch.Tensor:
    """The first maximum outside ``banned`` from the maxima of its two sides (argmax_excluding's
    definition, written out)."""
    v = z.shape[-1]
    if banned == 0:
        return z[..., 1:].argmax(dim=-1) + 1
    left_val, left_idx = z[..., :banned].max(dim=-1)
    if banned == v - 1:
        return left_idx
    right_val, right_idx = z[..., banned + 1:].max(dim=-1)
    return torch.where(right_val > left_val, right_idx + banned + 1, left_idx)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float32, torch.float64])
def test_argmax_excluding_takes_the_first_maximum_outside_the_banned_id(dtype):
    g = torch.Generator().manual_seed(0)
    for trial in range(300):
        v = int(torch.randint(2, 24, (1,), generator=g))
        z = torch.randint(-2, 3, (2, 3, v), generator=g).to(dtype)  # many ties
        if trial % 3 == 0:
            z[z == 2] = float("inf")
        if trial % 4 == 0:
            z[z == -2] = float("-inf")
        if trial % 7 == 0:  # every id -inf, or every id but one
            z.fill_(float("-inf"))
            z[..., int(torch.randint(0, v, (1,), generator=g))] = 1.0
        for banned in {0, v // 2, v - 1}:
            got = argmax_excluding(z, banned)
            assert torch.equal(got, _two_sided_argmax(z, banned)), (trial, banned)
            assert not (got == banned).any()


def test_pick_last_is_gather():
    g = torch.Generator().manual_seed(1)
    for shape in [(2, 5, 11), (7, 13), (3, 2, 4, 9)]:
        values = torch.randn(*shape, 2, generator=g)[..., 0]  # non-contiguous
        index = torch.randint(0, shape[-1], shape[:-1], generator=g)
        assert torch.equal(pick_last(values, index), values.gather(-1, index[..., None])[..., 0])


def test_threshold_commit_equals_its_definition():
    g = torch.Generator().manual_seed(2)
    for _ in range(200):
        conf = torch.randint(0, 5, (3, 6), generator=g).double() / 4  # ties, and 1.0
        eligible = torch.rand(3, 6, generator=g) < 0.6
        want = (eligible & (conf >= 0.75)) | top1(conf, eligible)
        assert torch.equal(threshold_commit(conf, eligible, 0.75), want)


def test_expand_window_pads_with_the_fill():
    values = torch.tensor([[1, 2], [3, 4]])
    assert expand_window(values, (1, 3), 4, 9).tolist() == [[9, 1, 2, 9], [9, 3, 4, 9]]
    assert expand_window(values, (0, 2), 2, 9) is values
    flags = expand_window(torch.tensor([[True, False]]), (2, 4), 5, False)
    assert flags.tolist() == [[False, False, True, False, False]]
    scores = expand_window(torch.tensor([[0.5]], dtype=torch.float64), (0, 1), 3, float("-inf"))
    assert scores.dtype == torch.float64 and scores.tolist() == [[0.5, float("-inf"), float("-inf")]]


def test_softmax_prob_in_one_piece_and_in_chunks_is_the_cast_softmax():
    g = torch.Generator().manual_seed(3)
    logits = (4 * torch.randn(3, 5, 50, generator=g)).to(torch.bfloat16)
    tokens = torch.randint(0, 50, (3, 5), generator=g)
    want = torch.softmax(logits.to(torch.float64), dim=-1).gather(-1, tokens[..., None])[..., 0]
    assert torch.equal(softmax_prob(logits, tokens), want)
    assert torch.equal(softmax_prob(logits, tokens, chunk_elements=100), want)  # two rows a piece


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
