"""dllm bench frontier (dllm/eval/bench/frontier.py): Fast-dLLM's points, our grid, the dev choice, the
test-split ratios and the command's files."""

from __future__ import annotations

import json

import pytest

from dllm.eval.bench.frontier import (ANSWER, FASTDLLM_POINTS, Row, block_label, candidate_grid, choose,
                                      compare_pair, format_table, main, pareto, parse_label)


def row(setting: str, acc: float, tps: float, tpf: float = 1.0, fwd: int = 100, walls=(1.0,)) -> Row:
    return Row(setting, acc, tps, tpf, fwd, list(walls))


def test_fastdllm_points_are_threshold_and_factor_with_prefix_and_dual():
    assert len(FASTDLLM_POINTS) == 18 == len(set(FASTDLLM_POINTS))
    assert {p.split(":")[0] for p in FASTDLLM_POINTS} == {"threshold", "factor"}
    assert sum(p.endswith("cache=dual") for p in FASTDLLM_POINTS) == 9


def test_fastdllm_factor_points_run_fastdllm_codes_rule():
    """The factor points are Fast-dLLM's code (``rule=reference``, equal to its drivers in tokens and NFE:
    tests/samplers/test_factor_upstream.py), not the rule as written, which takes more forwards."""
    from dllm.settings import DecodeSettings

    factor = [DecodeSettings.parse(p) for p in FASTDLLM_POINTS if p.startswith("factor:")]
    assert len(factor) == 8 and {s.sampler_options.get("rule") for s in factor} == {"reference"}
    for s in factor:
        s.check()


def test_the_grid_covers_every_registered_sampler_with_each_cache():
    from dllm.models import load
    from dllm.samplers import samplers
    from dllm.settings import DecodeSettings

    grid = candidate_grid(load("tiny-llada"), ("none", "prefix", "dual"))
    names = {DecodeSettings.parse(s).name for s in grid}
    assert names == set(samplers.names()) - {"random", "origin"}
    assert "threshold:threshold=0.8,cache=dual" in grid and "low_confidence:k=2,cache=prefix" in grid
    for s in grid:
        DecodeSettings.parse(s).check()
    sdar = candidate_grid(load("tiny-random-sdar"), ("none", "block"))
    assert all(DecodeSettings.parse(s).cache in ("none", "block") for s in sdar)


def test_choose_takes_the_fastest_candidate_at_least_as_accurate():
    points = {"p1": row("p1", 0.8, 100.0), "p2": row("p2", 0.95, 50.0)}
    cands = {"a": row("a", 0.79, 500.0), "b": row("b", 0.8, 120.0), "c": row("c", 0.9, 110.0)}
    assert choose(points, cands) == {"p1": "b", "p2": None}


def test_a_margin_asks_the_pick_for_that_much_more_dev_accuracy():
    points = {"p": row("p", 0.8, 100.0)}
    cands = {"a": row("a", 0.81, 500.0), "b": row("b", 0.83, 120.0), "c": row("c", 0.9, 110.0)}
    assert choose(points, cands) == {"p": "a"}
    assert choose(points, cands, margin=0.03) == {"p": "b"}
    assert choose(points, cands, margin=0.2) == {"p": None}


def test_the_pick_also_meets_the_tpf_bar_on_dev_when_a_candidate_can():
    points = {"p": row("p", 0.8, 100.0, tpf=2.0)}
    cands = {"a": row("a", 0.85, 500.0, tpf=2.2), "b": row("b", 0.81, 300.0, tpf=2.7), "c": row("c", 0.9, 200.0, tpf=3.0)}
    assert choose(points, cands) == {"p": "a"}
    assert choose(points, cands, tpf_bar=1.3) == {"p": "b"}
    assert choose(points, cands, margin=0.05, tpf_bar=1.3) == {"p": "c"}
    assert choose(points, {"a": cands["a"]}, tpf_bar=1.3) == {"p": "a"}  # none meets it: the fastest accurate one


def test_a_label_carries_its_block_length_unless_it_is_the_suites():
    assert block_label("fast:cache=dual", 4, 4) == "fast:cache=dual"
    assert block_label("fast:cache=dual", ANSWER, 4) == "fast:cache=dual @ block=answer"
    assert parse_label("fast:cache=dual", 4) == ("fast:cache=dual", 4)
    assert parse_label(block_label("fast", 8, 4), 4) == ("fast", 8)
    assert parse_label(block_label("fast", ANSWER, 4), 4) == ("fast", None)
    assert parse_label("sdar", None) == ("sdar", None)  # a block-causal model: its own grid
    with pytest.raises(ValueError, match="own grid"):
        parse_label("sdar @ block=8", None)
    with pytest.raises(ValueError, match="integer >= 1 or 'answer'"):
        parse_label("fast @ block=0", 4)


def test_pareto_keeps_the_undominated_rows_by_speed():
    rows = [row("a", 0.9, 10.0), row("b", 0.8, 20.0), row("c", 0.8, 15.0), row("d", 0.95, 5.0), row("e", 0.9, 10.0)]
    assert [r.setting for r in pareto(rows)] == ["d", "a", "e", "b"]


def test_compare_pair_uses_the_median_of_paired_rounds_and_both_bars():
    theirs = row("t", 0.8, 0.0, tpf=1.0, fwd=900, walls=(2.0, 2.2, 1.8))
    ours = row("o", 0.81, 0.0, tpf=1.4, fwd=700, walls=(1.0, 2.2, 1.5))
    p = compare_pair(ours, theirs, 1.1, 1.3)
    assert p["speed_ratio_rounds"] == [2.0, 1.0, 1.2] and p["speed_ratio"] == 1.2
    assert p["tpf_ratio"] == 1.4 and p["met"]
    assert not compare_pair(ours, theirs, 1.3, 1.3)["met"]  # speed bar
    assert not compare_pair(row("o", 0.79, 0.0, tpf=2.0, walls=(1.0, 1.0, 1.0)), theirs, 1.1, 1.3)["met"]  # accuracy
    table = format_table({"t": p, "u": {"accuracy_theirs": 0.99}}, {"t": "o", "u": None})
    assert "met at 1 of 2 points" in table and "no candidate as accurate" in table
    grouped = format_table({"t": p, "u": {"accuracy_theirs": 0.99}}, {"t": "o", "u": None},
                           {" at block 4": ["t"], " at block answer": ["u"]})
    assert "met at 1 of 1 points at block 4" in grouped and "met at 0 of 1 points at block answer" in grouped


def test_the_command_writes_its_table_json_and_plot(tmp_path, capsys):
    out = tmp_path / "f"
    code = main(["--model", "oracle", "--dev", "1", "--test", "1", "--repeats", "2", "--no-progress",
                 "--points", "threshold:threshold=0.9", "--candidates", "low_confidence:k=2",
                 "low_confidence", "sdar", "--point-blocks", "answer", "--out", str(out)])
    assert code == 0
    doc = json.loads((out / "frontier.json").read_text())
    assert doc["examples"]["dev"] == doc["examples"]["test"] > 0
    ours = {"low_confidence:k=2", "low_confidence"}
    # our candidates at the suite's block (4) and as one block of the answer; their point at 4 only
    theirs = {"threshold:threshold=0.9", "threshold:threshold=0.9 @ block=answer"}  # the bar's block, and answer
    assert set(doc["dev"]) == theirs | ours | {f"{c} @ block=answer" for c in ours}
    assert doc["groups"] == {" at block 4 (the bar)": ["threshold:threshold=0.9"],
                             " at block answer": ["threshold:threshold=0.9 @ block=answer"]}
    assert "denoising_steps" in doc["skipped"]["sdar"]  # 4 steps per block; some answers are 3 long
    one_block, blocks_of_4 = doc["dev"]["low_confidence:k=2 @ block=answer"], doc["dev"]["low_confidence:k=2"]
    assert one_block["tokens_per_forward"] > blocks_of_4["tokens_per_forward"]  # ceil(L / 2) < ceil(L / 4) * 2
    pick = doc["picks"]["threshold:threshold=0.9"]
    assert pick in doc["test"] and len(doc["test"][pick]["wall_times"]) == 2
    assert doc["dev"][pick]["accuracy"] >= doc["dev"]["threshold:threshold=0.9"]["accuracy"]
    assert (out / "frontier.png").stat().st_size > 0
    assert "points at block 4 (the bar)" in (out / "frontier.txt").read_text()
    assert "met at" in capsys.readouterr().out


def test_resume_reuses_the_dev_rows_of_the_same_run(tmp_path, capsys):
    out = tmp_path / "f"
    base = ["--model", "oracle", "--dev", "1", "--test", "1", "--repeats", "1", "--no-progress",
            "--candidate-blocks", "4", "--points", "threshold:threshold=0.9", "--out", str(out)]
    assert main(base + ["--candidates", "low_confidence"]) == 0
    first = json.loads((out / "frontier.json").read_text())["dev"]
    assert main(base + ["--candidates", "low_confidence", "low_confidence:k=2 @ block=8", "--resume"]) == 0
    again = json.loads((out / "frontier.json").read_text())["dev"]
    assert set(again) == set(first) | {"low_confidence:k=2 @ block=8"}  # a label with its own block: once
    assert all(again[k]["wall_times"] == first[k]["wall_times"] for k in first)  # not measured again
    with pytest.raises(SystemExit):
        main(base[:4] + ["2"] + base[5:] + ["--candidates", "low_confidence", "--resume"])  # --dev 2
    assert "--resume" in capsys.readouterr().err
    # the suite's block length is in no label: rows decoded in blocks of 4 are not rows of blocks of 8
    with pytest.raises(SystemExit):
        main(base + ["--candidates", "low_confidence", "--block-length", "8", "--resume"])
    assert "--block-length" in capsys.readouterr().err


@pytest.mark.parametrize("argv, message", [
    (["--suite", "nope"], "--suite 'nope'"),
    (["--dev", "40", "--test", "20"], "not in the test split"),
    (["--points", "threshold:thresh=0.9"], "threshold:thresh=0.9"),
    (["--model", "tiny-random-sdar"], "block-causally"),
    (["--candidate-blocks", "4", "0"], "--candidate-blocks '0'"),
    (["--point-blocks", "whole"], "--point-blocks 'whole'"),
    (["--margin", "200"], "--margin 200"),
])
def test_bad_arguments_are_refused_before_any_decode(argv, message, capsys):
    with pytest.raises(SystemExit) as err:
        main(argv + ["--model", "oracle"] if "--model" not in argv else argv)
    assert err.value.code == 2 and message in capsys.readouterr().err


def test_the_driver_has_fastdllm_points_only():
    """benchmarks/frontier_driver.py's points: threshold, and factor as Fast-dLLM's code runs it (the written
    rule, other options, samplers or caches have no driver)."""
    from benchmarks.frontier_driver import driver_point

    assert driver_point("threshold:threshold=0.9,cache=dual") == ("threshold", 0.9, "dual")
    assert driver_point("factor:factor=1.3,rule=reference,cache=prefix") == ("factor", 1.3, "prefix")
    for label in ("factor:factor=1.3,cache=prefix", "factor:factor=1.3,rule=written,cache=dual",
                  "threshold:threshold=0.9", "threshold:threshold=0.9,ties=first,cache=dual", "fast:cache=dual"):
        assert driver_point(label) is None, label


@pytest.mark.slow
def test_the_driver_comparison_reads_a_frontier_run(tmp_path):
    """benchmarks/frontier_driver.py: Fast-dLLM's driver (batch 1) against the frontier's pick, on
    the frontier run's test instances; the driver and the engine agree on every verdict."""
    import subprocess
    import sys
    from pathlib import Path

    out = tmp_path / "f"
    assert main(["--model", "tiny-llada", "--dev", "1", "--test", "1", "--repeats", "1", "--no-progress",
                 "--points", "threshold:threshold=0.9,cache=dual", "factor:factor=1.0,rule=reference,cache=dual",
                 "--candidates", "threshold:threshold=0.7", "--out", str(out)]) == 0
    script = Path(__file__).resolve().parents[3] / "benchmarks" / "frontier_driver.py"
    run = subprocess.run([sys.executable, str(script), "--frontier", str(out / "frontier.json"), "--repeats", "1",
                          "--threads", "1", "--no-progress", "--out", str(out)],
                         capture_output=True, text=True, timeout=600)
    assert run.returncode == 0, run.stderr
    rows = json.loads((out / "frontier-driver.json").read_text())["rows"]
    assert set(rows) == {"threshold:threshold=0.9,cache=dual", "factor:factor=1.0,rule=reference,cache=dual"}
    for row in rows.values():
        assert row["pick"].startswith("threshold:threshold=0.7")
        assert row["accuracy_driver"] == row["accuracy_engine_point"] and row["same_verdicts_as_engine"] == 1.0
        assert row["speed_ratio"] > 0
    assert "x driver" in (out / "frontier-driver.txt").read_text()
