"""Oracle marginals (uniform over consistent valid answers) and C(Y|X) against closed forms."""

import itertools
import math
import random
from collections import Counter

import pytest

from dllm import tasks as T
from dllm.tasks.answers import AnswerTable

ALL = T.tasks.names()
EOS = "[EOS]"


def _frequencies(answers):
    out = []
    for pos in range(len(answers[0])):
        counts = Counter(a[pos] for a in answers)
        out.append({w: c / len(answers) for w, c in counts.items()})
    return out


def _close(got, want):
    assert len(got) == len(want)
    for g, w in zip(got, want):
        assert g.keys() == w.keys()
        assert all(math.isclose(g[k], w[k], rel_tol=1e-12) for k in g)


def _examples(name, seed=2):
    task, rng = T.get_task(name), random.Random(seed)
    return [task.generate(rng, s) for s in sorted({task.min_size, *task.default_sizes})
            if T.count_answers(task.generate(random.Random(0), s)) <= 50_000]


@pytest.mark.parametrize("name", ALL)
def test_marginals_match_the_enumeration(name):
    rng = random.Random(9)
    for ex in _examples(name):
        answers = T.valid_answers(ex)
        _close(T.marginals(ex), _frequencies(answers))
        for _ in range(4):  # commit 1-3 words of a random valid answer
            pick = rng.choice(answers)
            positions = rng.sample(range(len(pick)), rng.randint(1, min(3, len(pick))))
            committed = {p: pick[p] for p in positions}
            consistent = [a for a in answers if all(a[p] == w for p, w in committed.items())]
            got = T.marginals(ex, committed)
            _close(got, _frequencies(consistent))
            for p, w in committed.items():
                assert got[p] == {w: 1.0}


@pytest.mark.parametrize("name", ALL)
def test_inconsistent_commits_give_none(name):
    for ex in _examples(name):
        L = T.answer_length(ex.task, ex.size)
        assert T.marginals(ex, {0: ","}) is None  # "," never appears in an answer
        assert T.marginals(ex, {L - 1: ex.answer[0]}) is None  # the last position is always EOS
        assert T.marginals(ex, {0: EOS}) is None


def test_shuffle_repeated_item_gives_none_and_last_slot_is_forced():
    ex = T.parse_prompt(["[BOS]", "shuffle", "A", "B", "C", "D", "[SEP]"])
    assert T.marginals(ex, {0: "A", 1: "A"}) is None
    m = T.marginals(ex, {0: "C", 1: "A", 2: "D"})
    assert m[3] == {"B": 1.0} and m[4] == {EOS: 1.0}
    m = T.marginals(ex, {0: "C"})
    assert m[1] == {"A": 1 / 3, "B": 1 / 3, "D": 1 / 3}


def test_marginals_validate_commits():
    ex = T.test_split("copy", 4, 1)[0]
    with pytest.raises(ValueError, match="committed position 9 is outside the answer region 0..4"):
        T.marginals(ex, {9: "A"})
    with pytest.raises(ValueError, match="'Z' is not in the PB-mini vocabulary"):
        T.marginals(ex, {0: "Z"})


@pytest.mark.parametrize(
    ("name", "m"), [("chain", 2), ("chain", 3), ("chain", 4), ("chain_must", 3), ("chain_must", 4)]
)
def test_chain_counting_matches_brute_force(name, m):
    task, rng = T.get_task(name), random.Random(m)
    ex = task.generate(rng, m)
    table = AnswerTable.build(task.enumerate_answers(ex.meta), T.answer_length(name, m))
    assert T.count_answers(ex) == len(table.ids)
    L = T.answer_length(name, m)
    for _ in range(40):
        positions = rng.sample(range(L), rng.randint(0, 3))
        committed = {p: rng.choice(["1", "2", "3", "5", "9", EOS]) for p in positions}
        got, want = T.marginals(ex, committed), table.marginals(committed)
        if want is None:
            assert got is None
        else:
            _close(got, want)


def test_chain_valid_answers_refuse_huge_sets():
    ex = T.test_split("chain", 8, 1)[0]
    assert T.count_answers(ex) == 9**8
    with pytest.raises(T.TooManyAnswersError, match="43046721 valid answers"):
        T.valid_answers(ex)


C_TABLE = {  # bits, computed once by exact enumeration of the answer sets (3 decimals)
    "replace_random": {4: 1.245, 6: 1.315, 8: 1.349},
    "shuffle": {4: 3.415, 6: 6.018, 8: 8.701},
    "insert_random": {4: 3.386, 6: 4.880, 8: 6.354},
    "remove_random": {4: 0.623, 6: 1.552, 8: 2.619},
    "replace_random_2tok": {4: 4.490, 6: 5.215},
    "insert_random_2tok": {4: 9.093, 6: 12.567},
    "remove_random_2tok": {4: 3.245, 6: 5.688},
    "shuffle_2tok": {4: 11.415, 6: 21.528, 8: 32.701},
    "latin4": {4: 22.830},
    "latin4_r1": {4: 14.435},
}


@pytest.mark.parametrize("name", sorted(C_TABLE))
def test_total_correlation_matches_the_table(name):
    for n, want in C_TABLE[name].items():
        for ex in T.test_split(name, n, 2):
            assert round(T.total_correlation(ex), 3) == want


@pytest.mark.parametrize("n", [3, 4, 5, 6, 7, 8])
def test_total_correlation_closed_forms(n):
    ex = T.test_split("replace_random", n, 1)[0]
    assert math.isclose(T.total_correlation(ex), (n - 1) * math.log2(n / (n - 1)), abs_tol=1e-9)
    ex = T.test_split("shuffle", n, 1)[0]
    assert math.isclose(T.total_correlation(ex), n * math.log2(n) - math.log2(math.factorial(n)), abs_tol=1e-9)
    ex = T.test_split("shuffle_strict", n, 1)[0]
    plain = n * math.log2(n) - math.log2(math.factorial(n))
    assert abs(T.total_correlation(ex) - plain) < (0.05 if n >= 4 else 0.5)


@pytest.mark.parametrize("m", range(2, 9))
def test_chain_total_correlation(m):
    ex = T.test_split("chain", m, 1)[0]
    assert math.isclose(T.total_correlation(ex), (m - 1) * math.log2(9), abs_tol=1e-9)
    ex = T.test_split("chain_must", m, 1)[0]
    assert T.total_correlation(ex) > 0


def test_pick_pair_total_correlation():
    ex = T.parse_prompt(["[BOS]", "pick_pair", "f0", "s0", "f0", "s1", "f1", "s2", "f2", "s2", "[SEP]"])
    assert math.isclose(T.total_correlation(ex), 1.0, abs_tol=1e-12)
    for e in T.test_split("pick_pair"):
        assert T.total_correlation(e) > 0  # Cartesian products are never generated


@pytest.mark.parametrize("name", [
    "copy", "reverse", "sort", "sort_num", "replace_index", "insert_index", "remove_index",
    "copy_2tok", "reverse_2tok", "sort_2tok", "replace_index_2tok", "insert_index_2tok",
    "remove_index_2tok", "sudoku4", "add_lsb", "add_msb", "cumsum",
])  # fmt: skip
def test_deterministic_tasks_have_zero_total_correlation(name):
    for ex in T.test_split(name, n=3):
        assert T.count_answers(ex) == 1
        assert T.total_correlation(ex) == 0.0
        assert all(len(m) == 1 for m in T.marginals(ex))


def test_latin_counts_and_marginals():
    ex = T.parse_prompt(["[BOS]", "latin4", "C", "A", "B", "D", "[SEP]"])
    assert len(T.valid_answers(ex)) == 576
    assert all(m == {s: 0.25 for s in "ABCD"} for m in T.marginals(ex)[:16])
    ex = T.parse_prompt(["[BOS]", "latin4_r1", "A", "B", "C", "D", "|", "B", "A", "D", "C", "[SEP]"])
    assert len(T.valid_answers(ex)) == 24
    m = T.marginals(ex)
    assert m[0] == {"B": 1.0} and m[4] == {"A": 1 / 3, "C": 1 / 3, "D": 1 / 3}


def test_enumerated_answers_cover_all_latin_squares_once():
    task = T.get_task("latin4")
    from dllm.tasks.kinds.latin import all_squares, is_latin

    squares = all_squares()
    assert len(set(squares)) == 576
    grid = [str(v) for v in range(4)]
    assert all(is_latin([str(v) for v in sq], grid) for sq in squares)
    assert sum(1 for sq in itertools.product(range(4), repeat=4) if len(set(sq)) == 4) == 24
    assert task.count_answers({"symbols": ("A", "B", "C", "D")}) == 576


ONE_STEP_VALIDITY = {  # % valid when every position is sampled independently from its marginal
    "replace_random": {4: 42.2, 6: 40.2, 8: 39.3},
    "insert_random": {4: 12.3, 6: 5.6, 8: 2.7},
    "remove_random": {4: 75.0, 6: 49.4, 8: 30.8},
    "shuffle": {4: 9.4, 6: 1.5},
}


@pytest.mark.parametrize("name", sorted(ONE_STEP_VALIDITY))
def test_one_step_validity_under_exact_marginals(name):
    for n, want in ONE_STEP_VALIDITY[name].items():
        ex = T.test_split(name, n, 1)[0]
        margs = T.marginals(ex)
        p = sum(math.prod(m[w] for m, w in zip(margs, a)) for a in T.valid_answers(ex))
        assert round(100 * p, 1) == want
    ex = T.test_split("latin4", 4, 1)[0]
    assert math.isclose(576 / 4**16, sum(math.prod(m[w] for m, w in zip(T.marginals(ex), a))
                                         for a in T.valid_answers(ex)), rel_tol=1e-9)
