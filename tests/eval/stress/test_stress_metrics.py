"""The stress metrics on hand-made data: Kendall tau, centre of mass, max TPS at a level, the
per-sample oracle, and the summary's leaderboard over tasks."""

import math
import random

import pytest

from dllm.eval.stress.sweep import StressConfig
from dllm.eval.stress.grid import cell_key
from dllm.eval.stress.metrics import (
    Cell, centre_of_mass, kendall_tau_b, max_tps_at, oracle_choice, oracle_summary, unmasking_tau,
)  # fmt: skip
from dllm.eval.stress.report import format_report, summarize


def test_kendall_tau_of_left_to_right_and_right_to_left():
    assert unmasking_tau(list(range(9))) == 1.0
    assert unmasking_tau(list(range(9))[::-1]) == -1.0
    assert unmasking_tau([0, 0, 0]) is None  # one step: no order
    assert unmasking_tau([3, -1, 5, 7]) == 1.0  # never-committed positions are left out


def test_kendall_tau_b_with_ties_by_hand():
    # pairs of [0, 0, 1, 1]: 4 concordant, 2 tied in the steps -> 4 / sqrt(6 * 4)
    assert unmasking_tau([0, 0, 1, 1]) == pytest.approx(4 / math.sqrt(24))
    # x = 1 2 3, y = 2 1 3: concordant (1,3), (2,3); discordant (1,2) -> 1/3
    assert kendall_tau_b([1, 2, 3], [2, 1, 3]) == pytest.approx(1 / 3)
    with pytest.raises(ValueError, match="one length"):
        kendall_tau_b([1, 2], [1])


def test_kendall_tau_b_matches_scipy():
    stats = pytest.importorskip("scipy.stats")
    rng = random.Random(0)
    for _ in range(30):
        n = rng.randint(3, 12)
        x, y = [rng.randint(0, 4) for _ in range(n)], [rng.randint(0, 4) for _ in range(n)]
        want = stats.kendalltau(x, y).statistic
        got = kendall_tau_b(x, y)
        assert (got is None and math.isnan(want)) or got == pytest.approx(want)


POINTS = [(1.0, 1.0), (2.0, 1.0), (4.0, 0.5), (8.0, 0.0)]  # (tokens per step, accuracy)


def test_centre_of_mass():
    assert centre_of_mass(POINTS) == pytest.approx((1 + 2 + 2) / 2.5)
    assert centre_of_mass([(1.0, 0.0), (2.0, 0.0)]) is None


def test_max_tps_at_a_level():
    assert max_tps_at(POINTS, 0.8) == 2.0
    assert max_tps_at(POINTS, 0.5) == 4.0  # the level itself counts
    assert max_tps_at(POINTS, 0.0) == 8.0
    assert max_tps_at([(3.0, 4 / 5)], 0.8) == 3.0  # 4 of 5 correct is 80 %
    assert max_tps_at(POINTS[2:], 0.8) is None


def test_oracle_picks_the_fewest_forwards_that_keep_each_sample_correct():
    correct = [[1, 1, 1, 0], [1, 0, 1, 0], [0, 0, 1, 0]]  # settings x samples
    nfe = [[8, 8, 8, 8], [4, 4, 4, 4], [2, 2, 2, 2]]
    # sample 0: right at settings 0 and 1 -> 1; sample 1: only 0; sample 2: all -> 2 (fewest forwards);
    # sample 3: wrong everywhere, so every setting reaches its best score -> the cheapest, 2
    assert oracle_choice(correct, nfe) == [1, 0, 2, 2]
    with pytest.raises(ValueError, match="one entry per sample"):
        oracle_choice([[1, 0]], [[1]])


def _cell(setting, task, correct, nfe, tokens=8, content=7):
    n = len(correct)
    return Cell(setting, task, [4] * n, list(map(bool, correct)), [float(v) for v in nfe], [tokens] * n,
                [content] * n, [None] * n, forwards=max(nfe), seconds=0.0)


def test_oracle_summary_on_cells():
    cells = [_cell("a", "t", [1, 1, 0], [8, 8, 8]), _cell("b", "t", [1, 0, 0], [2, 2, 2])]
    o = oracle_summary(cells)
    # choices: b (2 forwards), a (8), b (wrong everywhere: the cheapest)
    assert o["choice"] == [1, 0, 1]
    assert o["accuracy"] == pytest.approx(2 / 3)
    assert o["tps"] == pytest.approx(24 / 12) and o["tps_content"] == pytest.approx(21 / 12)
    other = _cell("c", "t", [1], [1])
    other.sizes = [5]
    with pytest.raises(ValueError, match="different samples"):
        oracle_summary([cells[0], other])


def test_cell_rates():
    c = _cell("a", "t", [1, 0, 1, 1], [4, 4, 2, 2], tokens=8, content=6)
    assert c.accuracy == 0.75 and c.mean_nfe == 3.0
    assert c.tps == pytest.approx(32 / 12) and c.tps_content == pytest.approx(24 / 12)
    assert Cell.from_json(c.to_json()) == c


def test_leaderboard_over_tasks_from_hand_made_cells():
    config = StressConfig("hand", grid=("low_confidence:k=1,2,4",), tasks=("copy", "shuffle"), per_size=1)
    k1, k2, k4 = config.settings
    n = 4  # samples per cell; tokens 8 each, so TPS = 8 / nfe
    acc = {("copy", 1): 4, ("copy", 2): 4, ("copy", 4): 4, ("shuffle", 1): 4, ("shuffle", 2): 2, ("shuffle", 4): 0}
    cells = {}
    for s in (k1, k2, k4):
        for task in config.tasks:
            right = acc[(task, s.k)]
            cells[cell_key(s, task)] = _cell(s.label, task, [1] * right + [0] * (n - right), [8 / s.k] * n)
    summary = summarize(config, cells)
    (board,) = summary["leaderboard"]
    # mean accuracy over tasks 100 / 75 / 50 %, mean TPS 1 / 2 / 4
    assert board["max_tps"] == {"80": 1.0, "75": 2.0, "70": 2.0}
    assert board["setting"]["75"] == "low_confidence:k=2"
    assert summary["max_tps_by_task"]["low_confidence"] == {"copy": 4.0, "shuffle": 1.0}
    (curve,) = summary["curves"]
    assert curve["com_by_task"]["copy"] == pytest.approx(7 / 3)
    assert curve["com_by_task"]["shuffle"] == pytest.approx((1 + 2 * 0.5) / 1.5)
    assert curve["oracle_by_task"]["copy"] == {"accuracy": 1.0, "tps": 4.0, "tps_content": 3.5}
    assert curve["oracle_by_task"]["shuffle"]["accuracy"] == 1.0  # k = 1 is right on every sample
    # shuffle: samples 0-1 are right at k = 2 (4 forwards), samples 2-3 only at k = 1 (8)
    assert curve["oracle_by_task"]["shuffle"]["tps"] == pytest.approx(32 / (4 + 4 + 8 + 8))
    assert curve["oracle_choices"] == {"k=4": 4, "k=2": 2, "k=1": 2}
    text = format_report(config, summary)
    assert "TPS@80" in text and "low_confidence:k=2" in text
