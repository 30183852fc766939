"""Parallel decoding under the oracle reproduces ParallelBench's theory (arXiv 2510.04767).

All decoding here runs over the answer's content positions only (``gen_length`` = content length,
no EOS slot), so "k tokens per step" groups the answer's items exactly as the closed forms assume;
the engine's LLaDA schedule spreads a remainder over the first steps (n // S + (i < n % S)).
"""

import math

import pytest

import dllm
from dllm import tasks as T
from dllm.models.oracle import OracleLM, oracle_prompts, score_generation
from oracle_theory import (
    Threshold, binomial_ok, decode, exact_confidence_topk, exact_one_step,
    replace_random_one_step, replace_random_random_order, repeated, shuffle_topk,
)  # fmt: skip

ROWS = 800  # samples per closed-form check (4-sigma binomial band: about +-7 points at p = 0.5)


@pytest.fixture(scope="module")
def exact():
    return OracleLM()


@pytest.fixture(scope="module")
def noisy():
    return OracleLM(noise_std=0.05, seed=1)  # ties broken at random, no flips (log 2 >> 0.05)


def _sizes(task):
    t = T.get_task(task)
    return sorted({t.min_size, t.max_size})


# ---- one token per step: always valid -----------------------------------------------------------------
@pytest.mark.parametrize("task", T.tasks.names())
def test_one_token_per_step_is_always_valid(exact, task):
    exs = [ex for s in _sizes(task) for ex in T.test_split(task, s, 3)]
    g = max(T.answer_length(ex.task, ex.size) for ex in exs)  # full region: EOS padding included
    greedy = dllm.generate(exact, oracle_prompts(exs), gen_length=g, steps=g)
    sampled = dllm.generate(exact, oracle_prompts(exs), sampler="random", gen_length=g, steps=g,
                            temperature=1.0, seed=0)
    assert all(score_generation(exs, greedy)) and all(score_generation(exs, sampled))


# ---- C(Y|X) = 0: any parallelism ------------------------------------------------------------------------
C_ZERO = [name for name in T.tasks.names()
          if all(T.count_answers(ex) == 1 for s in _sizes(name) for ex in T.test_split(name, s, 2))]


def test_the_single_answer_tasks_are_the_c_zero_tasks():
    assert {"copy", "reverse", "sort", "replace_index", "sudoku4", "add_msb", "cumsum"} <= set(C_ZERO)
    assert not {"replace_random", "shuffle", "chain", "latin4", "pick_pair"} & set(C_ZERO)
    assert all(T.total_correlation(T.test_split(name, _sizes(name)[-1], 1)[0]) < 1e-9 for name in C_ZERO)


@pytest.mark.parametrize("task", C_ZERO)
def test_c_zero_tasks_are_exact_in_one_step_per_block(exact, task):
    exs = [ex for s in _sizes(task) for ex in T.test_split(task, s, 3)]
    g = max(T.answer_length(ex.task, ex.size) for ex in exs)
    for block in (g, 3):
        blocks = -(-g // block)
        out = dllm.generate(exact, oracle_prompts(exs), gen_length=g, block_length=block, steps=blocks)
        assert out.nfe == blocks and all(score_generation(exs, out))


# ---- temperature 1: closed forms ------------------------------------------------------------------------
@pytest.mark.parametrize("n", [4, 6, 8])
def test_replace_random_one_step_temperature_one(exact, n):
    valid, _ = decode(exact, repeated("replace_random", n, ROWS), k=n, temperature=1.0, seed=n)
    assert binomial_ok(sum(valid), ROWS, replace_random_one_step(n)), (sum(valid) / ROWS, n)


def test_closed_forms_match_the_table():
    assert [round(100 * replace_random_one_step(n), 1) for n in (4, 6, 8)] == [42.2, 40.2, 39.3]
    assert [round(100 * shuffle_topk(n, n), 1) for n in (4, 6)] == [9.4, 1.5]
    assert [round(100 * shuffle_topk(n, 2), 1) for n in (4, 6, 8)] == [37.5, 31.2, 27.3]
    assert [round(100 * replace_random_random_order(n, 2), 1) for n in (4, 6, 8)] == [65.6, 73.4, 78.0]
    assert round(100 * replace_random_random_order(6, 3), 1) == 60.4
    ex = T.test_split("replace_random", 4, 1)[0]
    # confidence order at T = 1, k = 2, n = 4: >= 2 originals drawn (243/256) -> commit two
    # originals, then a fair coin on the last pair; one original (12/256) -> the new item is placed.
    assert math.isclose(exact_confidence_topk(ex, 2), 243 / 512 + 12 / 256)
    assert math.isclose(exact_one_step(ex), replace_random_one_step(4))


@pytest.mark.parametrize("task,n", [("shuffle", 4), ("shuffle", 6), ("insert_random", 4),
                                    ("remove_random", 6), ("pick_pair", 4)])
def test_one_step_temperature_one_matches_exact_validity(exact, task, n):
    exs = repeated(task, n, ROWS, prompts=1)
    want = exact_one_step(exs[0])  # shuffle n!/n^n; insert 12.3%; remove 49.4%; pick_pair per example
    valid, _ = decode(exact, exs, k=n + 1, temperature=1.0, seed=11)
    assert binomial_ok(sum(valid), ROWS, want), (sum(valid) / ROWS, want)


@pytest.mark.parametrize("sampler", ["low_confidence", "random"])
@pytest.mark.parametrize("n", [4, 6])
def test_shuffle_top2_temperature_one(exact, sampler, n):
    """Every marginal is 1/m: any order of positions gives prod P(m, 2) / m^2 = (n-1)!!/n!!."""
    valid, _ = decode(exact, repeated("shuffle", n, ROWS), k=2, sampler=sampler, temperature=1.0, seed=n)
    assert binomial_ok(sum(valid), ROWS, shuffle_topk(n, 2)), (sum(valid) / ROWS, shuffle_topk(n, 2))


@pytest.mark.parametrize("n,k", [(4, 2), (6, 2), (6, 3)])
def test_replace_random_random_order_temperature_one(exact, n, k):
    want = replace_random_random_order(n, k)  # 65.6 / 73.4 / 60.4 %
    valid, _ = decode(exact, repeated("replace_random", n, ROWS), k=k, sampler="random", temperature=1.0, seed=n)
    assert binomial_ok(sum(valid), ROWS, want), (sum(valid) / ROWS, want)


@pytest.mark.parametrize("n,k", [(4, 2), (5, 2), (6, 3)])
def test_replace_random_confidence_order_temperature_one_matches_enumeration(exact, n, k):
    exs = repeated("replace_random", n, ROWS)
    want = exact_confidence_topk(exs[0], k)  # 52.1 / 96.3 / 44.9 %: a sampled "new" is committed last
    valid, _ = decode(exact, exs, k=k, temperature=1.0, seed=n)
    assert binomial_ok(sum(valid), ROWS, want), (sum(valid) / ROWS, want)


# ---- greedy with i.i.d. logit noise: random tie-breaking -------------------------------------------------
@pytest.mark.parametrize("n,k,want", [(4, 2, 0.5), (6, 2, 0.5), (5, 2, 1.0), (7, 2, 1.0), (6, 3, 0.0),
                                      (8, 4, 0.0), (6, 6, 0.0), (8, 3, 0.5)])
def test_replace_random_greedy_with_noise_parity(noisy, n, k, want):
    """Originals win while >= 3 positions remain; the last group (size r) decides: r = 1 -> valid,
    r = 2 -> a fair coin (1/2 vs 1/2 tie), r >= 3 -> all originals (8, 3: groups 3, 3, 2)."""
    rows = ROWS if 0 < want < 1 else 64
    valid, _ = decode(noisy, repeated("replace_random", n, rows), k=k)
    assert binomial_ok(sum(valid), rows, want), (sum(valid) / rows, want)


def test_shuffle_greedy_with_noise_is_the_product_formula(noisy):
    valid, _ = decode(noisy, repeated("shuffle", 4, ROWS), k=2)
    assert binomial_ok(sum(valid), ROWS, shuffle_topk(4, 2)), sum(valid) / ROWS


# ---- greedy with exact marginals: deterministic ties --------------------------------------------------------
def _between(ex):
    """The new item's id lies strictly between the ids of the last two items."""
    last = [T.word_id(it[0]) for it in ex.meta["items"][-2:]]
    return min(last) < T.word_id(ex.meta["new"][0]) < max(last)


@pytest.mark.parametrize("n", [3, 4, 5, 6, 7, 8])
def test_replace_random_greedy_exact_top2_parity(exact, n):
    """All confidences tie at (m-1)/m, so the stable sort commits left to right, originals first.
    Odd n: the last group is one position whose marginal is the new item -> always valid. Even n:
    the last two positions tie 1/2 : 1/2 between their original and the new item; arg-max takes the
    lower id at both, so exactly one takes the new item iff its id lies between theirs."""
    exs = T.test_split("replace_random", n, 40)
    valid, _ = decode(exact, exs, k=2, ties="first")  # the closed form assumes left-to-right ties
    assert valid == [n % 2 == 1 or _between(ex) for ex in exs]
    assert 0 < sum(valid) < len(exs) or n % 2 == 1  # both outcomes occur at even n
    everything, _ = decode(exact, exs, k=n, ties="first")
    assert not any(everything)  # one step: originals everywhere


def test_replace_random_greedy_exact_with_the_eos_slot_flips_the_parity(exact):
    """Decoding the full region (EOS slot included): EOS has confidence 1 and joins the first group,
    so the items form groups 1, 2, 2, ...: now even n is always valid and odd n depends on ids."""
    for n in (4, 5, 6, 7):
        exs = T.test_split("replace_random", n, 20)
        g = n + 1
        out = dllm.generate(exact, oracle_prompts(exs), gen_length=g, steps=-(-g // 2), ties="first")
        assert score_generation(exs, out) == [n % 2 == 0 or _between(ex) for ex in exs]


def test_shuffle_greedy_exact_duplicates_at_any_parallelism(exact):
    exs = T.test_split("shuffle", 5, 20)
    for k in (2, 3, 5):
        valid, _ = decode(exact, exs, k=k)
        assert not any(valid)  # tied positions all take the lowest-id item
    assert all(decode(exact, exs, k=1)[0])


# ---- thresholds -----------------------------------------------------------------------------------------------
@pytest.mark.parametrize("n", [4, 6, 8])
def test_replace_random_threshold(exact, n):
    exs = T.test_split("replace_random", n, 10)
    top = (n - 1) / n
    above, out = decode(exact, exs, k=None, sampler=Threshold(gamma=top + 0.01))
    assert all(above) and out.nfe == n  # correct, one token per step
    at, out = decode(exact, exs, k=None, sampler=Threshold(gamma=top))  # accept c >= gamma
    assert not any(at) and out.nfe == 1  # all positions pass at step one: originals everywhere
    strict, _ = decode(exact, exs, k=None, sampler=Threshold(gamma=top, strict=True))
    assert all(strict)
    below, _ = decode(exact, exs, k=None, sampler=Threshold(gamma=top - 0.01))
    assert not any(below)


def test_threshold_on_shuffle_and_copy(exact):
    shuffle = T.test_split("shuffle", 6, 10)
    valid, out = decode(exact, shuffle, k=None, sampler=Threshold(gamma=0.51))
    assert all(valid) and out.nfe == 6  # gamma > 0.5 degenerates to one token per step
    valid, _ = decode(exact, shuffle, k=None, sampler=Threshold(gamma=0.5))
    assert not any(valid)  # the last pair ties at 1/2, passes, and takes the same item
    copy = T.test_split("copy", 8, 10)
    valid, out = decode(exact, copy, k=None, sampler=Threshold(gamma=0.9))
    assert all(valid) and out.nfe == 1  # C = 0: everything at once
