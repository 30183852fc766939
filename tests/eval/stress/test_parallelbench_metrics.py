"""``dllm stress --metrics parallelbench``: ParallelBench's definitions (arXiv 2510.04767), each on small
hand-built inputs with the expected value computed here, and its published leaderboard recomputed
from its released per-task results (tests/eval/stress/data/, see the README there)."""

import json
import math
import random
from pathlib import Path

import numpy as np
import pytest

from dllm import tasks as T
from dllm.cli import main
from dllm.eval.stress.metrics import oracle_choice, unmasking_tau
from dllm.eval.stress.parallelbench import (
    ParallelBenchConfig, interpolated_tps_at, nominal_tps_at, order_preference, parse_metrics, pb_kendall_tau,
    pooled_oracle, rescore, slope, task_tps,
)  # fmt: skip
from dllm.scoring.exact_match import eval_examples

DATA = Path(__file__).parent / "data" / "parallelbench_leaderboard.json"


# ---- the leaderboard rules ------------------------------------------------------------------------
def test_adaptive_families_are_interpolated_at_the_level():
    points = [(4.0, 70.0), (2.0, 90.0), (6.0, 50.0)]  # any order
    assert interpolated_tps_at(points, 80.0) == pytest.approx(2.0 + (90 - 80) / (90 - 70) * (4.0 - 2.0))
    assert interpolated_tps_at(points, 60.0) == pytest.approx(4.0 + (70 - 60) / (70 - 50) * (6.0 - 4.0))
    assert interpolated_tps_at(points, 70.0) == 4.0  # on a point
    assert interpolated_tps_at(points, 95.0) == 0.0  # never reached
    assert interpolated_tps_at(points, 40.0) == 6.0  # every point above: the least accurate one, no extrapolation


def test_interpolation_agrees_with_numpy_interp_over_accuracy():
    rng = random.Random(0)
    for _ in range(200):
        accs = rng.sample(range(1, 100), rng.randint(2, 8))  # distinct accuracies, any TPS order
        points = [(rng.uniform(1, 10), float(a)) for a in accs]
        level = rng.uniform(0, 100)
        order = sorted(range(len(points)), key=lambda i: points[i][1])
        ref = np.interp(level, [points[i][1] for i in order], [points[i][0] for i in order])
        want = 0.0 if max(accs) < level else float(ref)
        assert interpolated_tps_at(points, level) == pytest.approx(want, abs=1e-12), (points, level)


def test_top_k_takes_the_nominal_k_without_interpolation():
    points = [(1.0, 86.0), (2.0, 74.0), (4.0, 59.0)]
    assert nominal_tps_at(points, 80.0) == 1.0 and nominal_tps_at(points, 70.0) == 2.0
    assert nominal_tps_at(points, 90.0) == 0.0
    assert interpolated_tps_at(points, 80.0) == pytest.approx(1.0 + 6 / 12)  # what interpolation would claim


def test_task_tps_is_the_nominal_k_or_the_mean_of_per_sample_ratios():
    assert task_tps(4, [7, 7], [2, 2]) == 4.0  # measured 3.5 (ceil(7/4) = 2 steps): the nominal k counts
    tokens, nfe = [8, 8, 16], [2, 4, 4]
    assert task_tps(None, tokens, nfe) == pytest.approx((8 / 2 + 8 / 4 + 16 / 4) / 3)
    assert task_tps(None, tokens, nfe) != pytest.approx(sum(tokens) / sum(nfe))  # not pooled


# ---- Kendall tau -------------------------------------------------------------------------------------
def test_kendall_tau_counts_positions_committed_together_as_in_order():
    assert pb_kendall_tau([0, 0, 1, 1]) == pytest.approx(1.0)
    assert unmasking_tau([0, 0, 1, 1]) == pytest.approx(4 / math.sqrt(6 * 4))  # dllm's: position ties
    assert pb_kendall_tau([1, 1, 0, 0]) == pytest.approx(-1.0)
    assert pb_kendall_tau([3, 3, 3]) is None


def test_kendall_tau_leaves_never_committed_positions_out():
    # -1: a position no step committed (a trace of a decode cut short); as unmasking_tau reads it
    assert pb_kendall_tau([0, -1, 1, 2]) == pytest.approx(pb_kendall_tau([0, 1, 2])) == pytest.approx(1.0)
    assert pb_kendall_tau([2, 1, -1, 0]) == pytest.approx(-1.0)
    assert pb_kendall_tau([-1, 4, -1]) is None


def test_kendall_tau_matches_scipy_on_the_upstream_recipe():
    stats = pytest.importorskip("scipy.stats")
    rng = random.Random(1)
    for _ in range(100):
        order = [rng.randint(0, 5) for _ in range(rng.randint(2, 12))]
        if len(set(order)) < 2:
            continue
        want = stats.kendalltau(sorted(order), order).statistic  # furiosa-ai/ParallelBench model_utils.py
        assert pb_kendall_tau(order) == pytest.approx(want, abs=1e-12), order


# ---- order preference, oracle ---------------------------------------------------------------------------
def test_order_preference_slope_is_positive_when_short_blocks_score_higher():
    blocks, accs = [2, 4, 8, 16], [90.0, 80.0, 75.0, 60.0]
    xs = [-math.log2(b) for b in blocks]
    assert order_preference(blocks, accs) == pytest.approx(np.polyfit(xs, accs, 1)[0])
    assert order_preference(blocks, accs) > 0 > order_preference(blocks, accs[::-1])
    assert slope([1.0, 1.0], [3.0, 4.0]) is None
    rng = random.Random(2)
    xs, ys = [rng.uniform(0, 5) for _ in range(9)], [rng.uniform(0, 100) for _ in range(9)]
    assert slope(xs, ys) == pytest.approx(np.polyfit(xs, ys, 1)[0])


def test_oracle_pools_samples_over_tasks():
    # task A: 2 samples, B: 1 sample; 2 settings each: correct[t][s][n], nfe, tokens
    correct = [[[True, False], [True, True]], [[False], [True]]]
    nfe = [[[2, 2], [4, 8]], [[1], [5]]]
    tokens = [[[8, 8], [8, 8]], [[20], [20]]]
    got = pooled_oracle(correct, nfe, tokens)
    # by hand: A0 -> setting 0 (2 forwards), A1 -> setting 1 (8), B0 -> setting 1 (5)
    assert got["accuracy"] == 1.0 and got["samples"] == 3
    assert got["tps"] == pytest.approx((8 + 8 + 20) / (2 + 8 + 5))
    per_task_mean = ((8 + 8) / (2 + 8) + 20 / 5) / 2  # dllm's: a mean of per-task ratios
    assert got["tps"] != pytest.approx(per_task_mean)
    assert oracle_choice(correct[0], nfe[0]) == [0, 1]


# ---- scoring rules ------------------------------------------------------------------------------------
def _region(ex, words):
    la = T.answer_length(ex.task, ex.size)
    return [T.word_id(w) for w in list(words) + [T.EOS] * (la - len(words))]


def test_an_eos_inside_the_answer_is_dropped_or_cut():
    ex = eval_examples(["copy"], 1)[0]
    answer = list(T.get_task("copy").reference_answer(ex.meta))
    row = _region(ex, answer[:2] + [T.EOS] + answer[2:])
    assert not T.score(ex, T.words_of(row))  # dllm: a word after an EOS is a miss
    assert rescore(ex, row, ParallelBenchConfig(eos="drop"))  # ParallelBench: skip_special_tokens
    assert not rescore(ex, row, ParallelBenchConfig(eos="cut"))
    assert rescore(ex, _region(ex, answer), ParallelBenchConfig(eos="drop"))


def test_shuffle_rejects_the_input_order_under_the_strict_rule():
    ex = eval_examples(["shuffle"], 1)[0]
    task = T.get_task("shuffle")
    identity = [w for item in ex.meta["items"] for w in (item if isinstance(item, (list, tuple)) else [item])]
    assert tuple(identity) == tuple(task.reference_answer(ex.meta))
    row = _region(ex, identity)
    assert T.score(ex, T.words_of(row))  # the shuffle task accepts the input order
    assert not rescore(ex, row, ParallelBenchConfig(shuffle="strict"))
    assert rescore(ex, row, ParallelBenchConfig(shuffle="any"))
    swapped = T.get_task("shuffle_strict").reference_answer(ex.meta)  # another permutation
    assert rescore(ex, _region(ex, swapped), ParallelBenchConfig(shuffle="strict"))


def test_metrics_flag_is_checked_with_clear_errors():
    assert parse_metrics("dllm") is None
    assert parse_metrics("parallelbench") == ParallelBenchConfig()
    assert parse_metrics("parallelbench:eos=cut,shuffle=any").eos == "cut"
    with pytest.raises(ValueError, match="unknown 'bogus'; choose one of dllm, parallelbench"):
        parse_metrics("bogus")
    with pytest.raises(ValueError, match="eos='keep' is not valid; choose one of drop, cut"):
        parse_metrics("parallelbench:eos=keep")
    with pytest.raises(ValueError, match="unknown option.*tau.*valid: eos, shuffle, tau_pad, slope_k"):
        parse_metrics("parallelbench:tau=1")
    with pytest.raises(ValueError, match="slope_k=0"):
        parse_metrics("parallelbench:slope_k=0")


# ---- the command ----------------------------------------------------------------------------------------
def _stress(tmp_path, name, *extra):
    out = tmp_path / name
    assert main(["stress", "--model", "oracle", "--grid", "low_confidence:k=1,2,3", "--grid",
                 "threshold:threshold=0.5,0.9", "--block-lengths", "0,4", "--tasks", "copy", "shuffle",
                 "replace_random", "--per-size", "1", "--out", str(out), "--no-progress", *extra]) == 0
    return out, json.loads((out / "stress.json").read_text())


def test_command_prints_parallelbench_numbers(tmp_path, capsys):
    out, data = _stress(tmp_path, "pb", "--metrics", "parallelbench:eos=cut,shuffle=any")
    text = capsys.readouterr().out
    assert "ParallelBench's metrics" in text and "Order preference" in text and "interpolated" in text
    pb = data["summary"]["parallelbench"]
    assert pb["cells_without_rows"] == 0
    cells = data["cells"]
    tasks = pb["tasks"]
    for s in pb["settings"]:
        for t in tasks:
            cell = cells[f"{s['label']} | {t}"]
            # with dllm's scoring rules, the rescored rows give dllm's accuracy on every cell
            assert s["per_task"][t]["accuracy"] == pytest.approx(sum(cell["correct"]) / len(cell["correct"]))
            want = s["k"] if s["k"] is not None else np.mean([a / b for a, b in zip(cell["tokens"], cell["nfe"])])
            assert s["per_task"][t]["tps"] == pytest.approx(want)
            taus = [pb_kendall_tau(tr) for tr in cell["traces"]]
            taus = [x for x in taus if x is not None]
            assert s["per_task"][t]["tau"] == (pytest.approx(np.mean(taus)) if taus else None)
    row = {s["label"]: s for s in pb["settings"]}
    for c in pb["curves"]:
        members = [s for s in pb["settings"] if s["curve"] == c["curve"]]
        points = [(s["tps"], s["accuracy"]) for s in members]
        rule = nominal_tps_at if c["rule"] == "nominal k" else interpolated_tps_at
        assert c["rule"] == ("nominal k" if members[0]["k"] is not None else "interpolated")
        for lv in ("80", "75", "70"):
            assert c["leaderboard"][lv] == pytest.approx(rule(points, int(lv) / 100))
    assert row["low_confidence:k=3"]["tps"] == 3.0  # nominal, where the measured TPS is not 3 (L_ans % 3)
    assert any(o["family"] == "low_confidence" and o["k"] == 2 for o in pb["order_preference"])
    assert (out / "stress.txt").read_text().startswith("dllm stress (ParallelBench's metrics")


def test_default_metrics_are_unchanged(tmp_path, capsys):
    out, data = _stress(tmp_path, "dllm")
    assert "parallelbench" not in data["summary"]
    assert all("rows" not in c and "traces" not in c for c in data["cells"].values())
    assert "ParallelBench's metrics" not in capsys.readouterr().out


def test_a_resumed_file_without_rows_is_reported(tmp_path, capsys):
    out, _ = _stress(tmp_path, "mix")
    capsys.readouterr()
    _, data = _stress(tmp_path, "mix", "--resume", "--metrics", "parallelbench")
    assert data["summary"]["parallelbench"]["cells_without_rows"] == len(data["cells"])
    assert "were decoded without --metrics parallelbench" in capsys.readouterr().out


# ---- the bar: ParallelBench's published leaderboard from its released results ------------------------
def _leaderboard(family: dict, kind: str) -> dict[str, float]:
    points = [(t, a) for t, a in family["settings"]]
    rule = nominal_tps_at if kind == "top-k" else interpolated_tps_at
    return {lv: rule(points, float(lv)) for lv in family["published"]}


def _families():
    data = json.loads(DATA.read_text())
    return [(m, name, fam) for m, families in data["models"].items() for name, fam in families.items()]


def test_published_leaderboard_is_reproduced_from_released_per_setting_results():
    entries = 0
    for model, name, family in _families():
        got = _leaderboard(family, family["kind"])
        for lv, want in family["published"].items():
            assert got[lv] == pytest.approx(want, rel=1e-12, abs=1e-12), (model, name, lv, got[lv], want)
            entries += 1
    assert entries == 99  # 4 models, 33 families, 3 levels
    # the two rules matter: interpolating top-k, or taking the best setting of an adaptive family, fails
    fams = {(m, n): f for m, n, f in _families()}
    topk, wino = fams[("llada15", "confidence-topk")], fams[("llada15", "wino")]
    assert _leaderboard(topk, "adaptive")["80"] != pytest.approx(topk["published"]["80"])
    assert _leaderboard(wino, "top-k")["75"] != pytest.approx(wino["published"]["75"])


def test_released_setting_results_are_means_over_tasks():
    """Top-k settings are the same row of every task (the nominal k): their released accuracy and
    TPS are the plain means over the 17 tasks, as ``summarize_parallelbench`` averages."""
    checked = 0
    for model, name, family in _families():
        if family["kind"] != "top-k":
            continue
        rows = list(family["tasks"].values())
        assert len(rows) == 17
        for i, (tps, acc) in enumerate(family["settings"]):
            assert {r[i][0] for r in rows} == {tps}  # the nominal k on every task
            assert math.fsum(r[i][1] for r in rows) / len(rows) == pytest.approx(acc, rel=1e-12), (model, name, i)
            checked += 1
    assert checked == 4 * 5 * 6  # 4 models x 5 top-k families x k = 1 .. 32


def test_per_task_rows_are_sorted_by_tps_so_adaptive_rows_do_not_line_up():
    """Why the leaderboard is recomputed from the released per-setting rows: within a task the CSV
    rows are sorted by TPS, so for adaptive families the i-th row of two tasks can be two settings,
    and averaging rows by index misses published entries (llada15 confidence-threshold at 80 %)."""
    for _, _, family in _families():
        for rows in family["tasks"].values():
            assert [t for t, _ in rows] == sorted(t for t, _ in rows)
    fam = {(m, n): f for m, n, f in _families()}[("llada15", "confidence-threshold")]
    rows = list(fam["tasks"].values())
    by_index = [(math.fsum(r[i][0] for r in rows) / 17, math.fsum(r[i][1] for r in rows) / 17) for i in range(6)]
    assert interpolated_tps_at(by_index, 80.0) != pytest.approx(fam["published"]["80"], rel=1e-3)
    assert interpolated_tps_at(fam["settings"], 80.0) == pytest.approx(fam["published"]["80"], rel=1e-12)
