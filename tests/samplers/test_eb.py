"""EB-Sampler (``eb``): the entropy-bounded prefix on hand-built logits, against a plain reference,
end to end on tiny models, and on the exact-posterior oracle."""

import math

import pytest
import torch

import dllm
from dllm import tasks as T
from dllm.models import tiny
from dllm.models.oracle import OracleLM, oracle_prompts, score_generation
from dllm.samplers import make_sampler
from dllm.samplers.eb import entropy_prefix

from builders import MASK, V, log_probs, ordinary_ids, prob_row, step_input


def _input(logits, active=None, window=None):
    """logits [B, Q, V]; active [B, Q] bool (default: all); window (default: all of Q)."""
    bsz, width, _ = logits.shape
    active = torch.ones(bsz, width, dtype=torch.bool) if active is None else active
    return step_input(logits, active, window=window)


def _peaked(rows):
    """Logits [1, W, V] from W rows of probabilities."""
    return log_probs(rows)[None]


def _dist(top, tok):
    """p(tok) = top, the rest spread evenly over the other ordinary tokens (the mask id: ~0)."""
    return prob_row(top, tok, mask_id=MASK)


def _one_hot(tok):
    """Logits of exactly zero entropy in float64 (exp(-1e4) underflows to 0, as in the oracle)."""
    logits = torch.full((V,), -1e4)
    logits[tok] = 0.0
    return logits


def _reference_commit(logits, active, gamma, proxy):
    """Plain per-row loops: sort by proxy, largest prefix with sum H - max H <= gamma (>= 1)."""
    p = torch.softmax(logits.double(), dim=-1)
    out = torch.zeros(active.shape, dtype=torch.bool)
    for b in range(logits.shape[0]):
        idx = [i for i in range(logits.shape[1]) if active[b, i]]
        if not idx:
            continue
        h = {i: float(-(p[b, i] * torch.log(p[b, i])).nansum()) for i in idx}
        conf = {i: float(p[b, i].max()) for i in idx}
        top2 = {i: p[b, i].topk(2).values.tolist() for i in idx}
        key = {"entropy": lambda i: h[i], "confidence": lambda i: -conf[i],
               "margin": lambda i: -(top2[i][0] - top2[i][1])}[proxy]
        order = sorted(idx, key=key)
        n = 1
        for k in range(2, len(order) + 1):
            hs = [h[i] for i in order[:k]]
            if sum(hs) - max(hs) <= gamma:
                n = k
            else:
                break
        for i in order[:n]:
            out[b, i] = True
    return out


# ---- the rule -----------------------------------------------------------------------------------------
@pytest.mark.parametrize("h,valid,gamma,n", [
    ([0.0, 0.0, 0.5, 0.6], None, 0.0, 3),  # zero-entropy ones, then one more
    ([0.1, 0.2, 0.3], None, 0.25, 2),  # k=2: 0.1 <= 0.25; k=3: 0.3 > 0.25
    ([0.5, 0.6], None, 0.0, 1),  # the first always
    ([1.0, 2.0, 3.0], None, math.inf, 3),
    ([0.3, 0.1, 0.2], None, 0.25, 2),  # not sorted by entropy: the max is a running max (0.3)
    ([0.0, 0.0, 0.0], [True, True, False], 1.0, 2),  # invalid entries never count
    ([0.0, 0.0], [False, False], 1.0, 0),  # a row with nothing to commit
])
def test_entropy_prefix(h, valid, gamma, n):
    hs = torch.tensor([h], dtype=torch.float64)
    vs = torch.ones_like(hs, dtype=torch.bool) if valid is None else torch.tensor([valid])
    assert entropy_prefix(hs, vs, gamma).tolist() == [n]


def test_gamma_zero_commits_the_determined_positions_plus_the_least_uncertain_one():
    logits = torch.stack([_one_hot(1), _peaked([_dist(0.7, 2)])[0, 0], _one_hot(3),
                          _peaked([_dist(0.9, 4)])[0, 0], _peaked([_dist(0.5, 5)])[0, 0]])[None]
    out = make_sampler("eb", gamma=0.0).step(_input(logits), None)
    assert out.commit[0].tolist() == [True, False, True, True, False]
    assert out.tokens[0].tolist() == [1, 2, 3, 4, 5]


def test_nothing_within_the_bound_still_commits_one_and_inactive_rows_commit_nothing():
    logits = _peaked([_dist(0.6, 1), _dist(0.8, 2), _dist(0.7, 3)]).repeat(2, 1, 1)
    active = torch.tensor([[True, True, True], [False, False, False]])
    out = make_sampler("eb", gamma=0.0).step(_input(logits, active), None)
    assert out.commit[0].tolist() == [False, True, False]  # lowest entropy: the engine fallback is never needed
    assert not out.commit[1].any()


def test_infinite_gamma_commits_every_active_mask_and_only_those():
    logits = _peaked([_dist(0.2, 1), _dist(0.3, 2), _dist(0.4, 3), _dist(0.5, 4)])
    out = make_sampler("eb", gamma=math.inf).step(_input(logits, [[True, False, True, True]]), None)
    assert out.commit[0].tolist() == [True, False, True, True]


@pytest.mark.parametrize("proxy", ["confidence", "margin"])
def test_other_proxies_bound_the_running_max_not_the_last_entropy(proxy):
    # confidence/margin order: A (0.6, rest spread, H ~ 1.50), B (0.55 / 0.45, H ~ 0.69), C (0.5 / 0.5)
    a = _dist(0.6, 1)
    b, c = [1e-30] * V, [1e-30] * V
    b[2], b[5] = 0.55, 0.45
    c[3], c[6] = 0.5, 0.5
    out = make_sampler("eb", gamma=0.8, proxy=proxy).step(_input(_peaked([a, b, c])), None)
    # k = 2: H_A + H_B - max = 0.69 <= 0.8; k = 3: 1.38 > 0.8 (bounding by the last entropy: k = 1)
    assert out.commit[0].tolist() == [True, True, False]


def test_the_mask_token_is_never_proposed():
    row = _dist(0.8, MASK)
    row[4] = 0.15
    out = make_sampler("eb").step(_input(_peaked([row, _dist(0.9, 2)])), None)
    assert out.tokens[0].tolist() == [4, 2]


def _random_logits(bsz, width, g):
    """Distributions whose confidence and entropy orders disagree: a top probability in [0.3, 1)
    and the rest spread over 1 to 8 other tokens (few: low entropy; many: high entropy)."""
    probs = torch.full((bsz, width, V), 1e-12, dtype=torch.float64)
    top = 0.3 + 0.7 * torch.rand(bsz, width, generator=g, dtype=torch.float64)
    others = torch.rand(bsz, width, V, generator=g).argsort(dim=-1)  # random token order
    spread = torch.randint(1, V - 1, (bsz, width), generator=g)
    for b in range(bsz):
        for i in range(width):
            toks = [t for t in others[b, i].tolist() if t != MASK]
            probs[b, i, toks[0]] = top[b, i]
            weights = torch.rand(int(spread[b, i]), generator=g, dtype=torch.float64) + 0.1
            probs[b, i, toks[1:1 + int(spread[b, i])]] = (1 - top[b, i]) * weights / weights.sum()
    return torch.log(probs).float()


@pytest.mark.parametrize("proxy", ["entropy", "confidence", "margin"])
@pytest.mark.parametrize("gamma", [0.0, 0.3, 1.0, 4.0])
def test_vectorised_rule_equals_the_plain_reference(proxy, gamma):
    g = torch.Generator().manual_seed(int(gamma * 10) + len(proxy))
    width = 9
    logits = _random_logits(3, width + 2, g)
    active = torch.rand(3, width + 2, generator=g) < 0.7
    active[:, 0] = active[:, -1] = False  # the window is [1, width + 1)
    active[2] = False
    active[2, 3] = True  # a row with a single mask
    out = make_sampler("eb", gamma=gamma, proxy=proxy).step(_input(logits, active, (1, width + 1)), None)
    assert torch.equal(out.commit, _reference_commit(logits, active, gamma, proxy))


@pytest.mark.parametrize("options,match", [
    (dict(gamma=-1), r"gamma must be a number >= 0, got -1"),
    (dict(gamma=float("nan")), r"gamma must be a number >= 0, got nan"),
    (dict(gamma="0.1"), r"gamma must be a number >= 0, got '0.1'"),
    (dict(proxy="kl"), r"proxy must be one of 'entropy', 'confidence', 'margin', got 'kl'"),
])
def test_out_of_range(options, match):
    with pytest.raises(ValueError, match=match):
        make_sampler("eb", **options)


def test_unknown_option_lists_the_valid_ones():
    with pytest.raises(TypeError, match="Valid options: gamma, proxy"):
        make_sampler("eb", threshold=0.9)


# ---- end to end -------------------------------------------------------------------------------------
@pytest.fixture(scope="module", params=["llada", "dream"])
def model(request):
    return tiny(request.param, seed=0)


# default options: the contract tests (tests/samplers/test_sampler_contract.py)
@pytest.mark.parametrize("options", [dict(gamma=0.5, proxy="confidence"), dict(gamma=2.0, proxy="margin")])
def test_batch_of_ragged_prompts_finishes_and_equals_each_prompt_alone(model, options):
    prompts = [ordinary_ids(model, 3, 1), ordinary_ids(model, 8, 2), ordinary_ids(model, 5, 3)]
    kw = dict(sampler="eb", gen_length=8, block_length=4, **options)
    batch = dllm.generate(model, prompts, **kw)
    assert (batch.generated != model.mask_id).all() and batch.nfe <= 8
    for j, p in enumerate(prompts):
        assert torch.equal(batch.generated[j], dllm.generate(model, [p], **kw).generated[0]), j


def test_gamma_zero_is_one_token_per_step_when_every_entropy_is_positive(model):
    out = dllm.generate(model, [ordinary_ids(model, 4, 0)], sampler="eb", gamma=0.0, gen_length=8, block_length=4,
                        return_trace=True)
    assert out.nfe == 8 and sorted(out.trace[0].tolist()) == list(range(8))


def test_infinite_gamma_is_one_forward_per_block(model):
    out = dllm.generate(model, [ordinary_ids(model, 4, 0)], sampler="eb", gamma=math.inf, gen_length=10, block_length=4)
    assert out.nfe == 3 and (out.generated != model.mask_id).all()


def test_sampling_is_reproducible_under_a_seed(model):
    kw = dict(sampler="eb", gamma=0.5, gen_length=8, temperature=1.0)
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
    out = dllm.generate(oracle, oracle_prompts(exs), sampler="eb", gen_length=g, block_length=4)
    assert all(score_generation(exs, out))
    assert out.nfe == 3 < g  # every entropy is 0: each block in one forward


@pytest.mark.parametrize("task", ["shuffle", "replace_random"])
def test_gamma_zero_is_exact_on_tasks_with_many_answers(oracle, task):
    # gamma = 0 commits the positions the committed words determine (H = 0) and one more, so every
    # step stays inside the answer set (valid at T = 0 despite ties), and determined tails come free
    exs = T.test_split(task, 5, 6)
    g = T.answer_length(task, 5)
    out = dllm.generate(oracle, oracle_prompts(exs), sampler="eb", gamma=0.0, gen_length=g)
    assert all(score_generation(exs, out))
    assert out.nfe < g
