"""``dllm bench serve`` (dllm/eval/bench/serving/serve.py): arrivals, percentiles, the requests, the rows, the
verdict, bad flags, Ctrl-C, and one real run against live servers on 127.0.0.1 with tiny-llada."""

from __future__ import annotations

import json
import math
import random

import pytest

from dllm.eval.bench.serving import serve as bench
from dllm.eval.bench.serving.serve import Outcome


def test_arrivals_are_poisson_at_the_rate():
    times = bench.arrival_times(4000, 20.0, seed=1)
    gaps = [b - a for a, b in zip(times, times[1:])]
    assert times[0] == 0.0 and all(g >= 0 for g in gaps)
    assert sum(gaps) / len(gaps) == pytest.approx(1 / 20, rel=0.05)
    # exponential gaps: the standard deviation equals the mean
    mean = sum(gaps) / len(gaps)
    sd = math.sqrt(sum((g - mean) ** 2 for g in gaps) / len(gaps))
    assert sd == pytest.approx(mean, rel=0.1)
    assert bench.arrival_times(5, math.inf) == [0.0] * 5
    assert bench.arrival_times(50, 3.0, seed=7) == bench.arrival_times(50, 3.0, seed=7)


@pytest.mark.parametrize("rate", [0.0, -2.0, math.nan])
def test_a_rate_that_is_not_positive_is_refused(rate):
    with pytest.raises(ValueError, match=f"got {rate}"):
        bench.arrival_times(3, rate)


def test_percentile_is_numpys_linear_one():
    np = pytest.importorskip("numpy")
    rng = random.Random(0)
    xs = [rng.random() for _ in range(37)]
    for q in (0, 1, 50, 90, 99, 100):
        assert bench.percentile(xs, q) == pytest.approx(float(np.percentile(xs, q)))
    assert bench.percentile([], 50) is None


def test_stress_requests_mix_tasks_and_lengths():
    from dllm import tasks as T

    reqs = bench.stress_requests(64, seed=3)
    assert reqs == bench.stress_requests(64, seed=3) and len(reqs) == 64
    assert len({r.max_tokens for r in reqs}) >= 4 and len({r.task for r in reqs}) >= 8
    for r in reqs:
        words = r.prompt.split()
        assert words[0] == T.BOS and words[-1] == T.SEP and words[1] == T.get_task(r.task).task_word
        size = T.parse_prompt(words).size
        assert r.max_tokens == T.answer_length(r.task, size)
    only_sort = bench.stress_requests(5, tasks=["sort"], settings=[("low_confidence", "none"), ("fast", "dual")])
    assert {r.task for r in only_sort} == {"sort"}
    assert [(r.sampler, r.cache) for r in only_sort[:3]] == [("low_confidence", "none"), ("fast", "dual"),
                                                             ("low_confidence", "none")]
    assert only_sort[1].body() == {"prompt": only_sort[1].prompt, "max_tokens": only_sort[1].max_tokens,
                                   "sampler": "fast", "cache": "dual"}


def test_settings_are_sampler_at_cache():
    assert bench.parse_setting("threshold:threshold=0.8@dual:refresh=4") == ("threshold:threshold=0.8",
                                                                             "dual:refresh=4")
    assert bench.parse_setting("fast") == ("fast", "none")
    for bad in ("@dual", "fast@"):
        with pytest.raises(Exception, match=repr(bad)):
            bench.parse_setting(bad)


def test_summarize_and_verdicts():
    ok = [Outcome(True, ttft_s=0.1 * i, latency_s=0.2 * i, output_tokens=5) for i in range(1, 11)]
    row = bench.summarize("continuous", math.inf, ok + [Outcome(False, error="HTTP 429: full")], duration=2.0,
                          mean_batch=4.0)
    assert row["completed"] == 10 and row["failed"] == 1 and row["errors"] == ["HTTP 429: full"]
    assert row["requests_per_s"] == 5.0 and row["output_tokens_per_s"] == 25.0 and row["rate"] == "inf"
    assert row["ttft_p50_s"] == pytest.approx(0.55) and row["e2e_p99_s"] == pytest.approx(1.982)
    serial = bench.summarize("serial", math.inf, ok[:4], duration=2.0)
    static = bench.summarize("static", math.inf, ok[:8], duration=2.0)
    other_rate = bench.summarize("serial", 4.0, ok[:1], duration=2.0)
    (v,) = bench.verdicts([row, serial, static, other_rate])
    assert v["x_serial"] == 2.5 and v["x_static"] == 1.25
    assert v["p99_vs_static"] == pytest.approx(round(1.982 / static["e2e_p99_s"], 2))
    assert "x2.50 the requests/s of serial" in bench.verdict_line(v)
    table = bench.format_table([row, serial])
    assert table.count("\n") == 3 and table.startswith("| mode | rate |")


@pytest.mark.parametrize("argv, named", [(["--rates", "0"], "'0'"), (["--rates", "fast"], "'fast'"),
                                         (["--modes", "dynamic"], "dynamic"), (["--n", "0"], "0"),
                                         (["--tasks", "no_such_task"], "no_such_task"),
                                         (["--max-seconds", "-1"], "-1"), (["--settings", "@dual"], "'@dual'"),
                                         (["--settings", "no_such_sampler"], "no_such_sampler"),
                                         (["--settings", "threshold@no_such_cache"], "no_such_cache"),
                                         (["--settings", "threshold:no_such_option=1"], "no_such_option")])
def test_bad_flags_are_refused_naming_the_value(argv, named, capsys):
    with pytest.raises(SystemExit) as exit_:
        bench.main(argv)
    assert exit_.value.code == 2
    assert named in capsys.readouterr().err


def test_ctrl_c_keeps_the_finished_rows(tmp_path, monkeypatch, capsys):
    """Rows are written as they finish; Ctrl-C in the third exits 130 saying where the first two are."""
    from contextlib import contextmanager

    @contextmanager
    def no_servers(model, requests, extra, args):
        yield {mode: f"http://127.0.0.1:1/{mode}" for mode in args.modes}

    calls = []

    def fake_row(url, name, mode, requests, rate, **kw):
        calls.append((mode, rate))
        if len(calls) == 3:
            raise KeyboardInterrupt
        return bench.summarize(mode, rate, [Outcome(True, 0.1, 0.2, 3)] * len(requests), 1.0)

    monkeypatch.setattr(bench, "open_servers", no_servers)
    monkeypatch.setattr(bench, "bench_row", fake_row)
    status = bench.main(["--n", "4", "--rates", "2", "inf", "--modes", "continuous", "static", "--out",
                         str(tmp_path), "--no-progress"])
    assert status == 130
    assert calls == [("continuous", 2.0), ("static", 2.0), ("continuous", math.inf)]  # interleaved modes
    saved = json.loads((tmp_path / "serve.json").read_text())
    assert [(r["mode"], r["rate"], r["repeat"]) for r in saved["rows"]] == [("continuous", 2.0, 0), ("static", 2.0, 0)]
    assert f"interrupted: 2 finished rows are saved in {tmp_path / 'serve.json'}" in capsys.readouterr().out
    assert (tmp_path / "serve.png").stat().st_size > 1000


def test_median_rows_fold_the_repeats():
    rows = [bench.summarize("serial", 4.0, [Outcome(True, 0.1 * k, 0.2 * k, 3)] * 4, float(k)) for k in (1, 3, 2)]
    rows.append(bench.summarize("static", 4.0, [Outcome(True, 0.1, 0.2, 3), Outcome(False)], 1.0))
    serial, static = bench.median_rows(rows)
    assert serial["repeats"] == 3 and serial["completed"] == 12 and serial["duration_s"] == 2.0
    assert serial["requests_per_s"] == 2.0 and serial["e2e_p99_s"] == pytest.approx(0.4)
    assert static["repeats"] == 1 and static["failed"] == 1 and static["requests_per_s"] == 1.0


@pytest.mark.slow
def test_a_real_run_against_live_servers(tmp_path, capsys):
    """Every request of every (mode, rate) completes against the real app; the rows add up."""
    status = bench.main(["--n", "8", "--rates", "40", "inf", "--modes", "continuous", "serial", "--tasks", "sort",
                         "copy", "--settings", "low_confidence", "threshold@dual", "--threads", "1", "--server",
                         "thread", "--out", str(tmp_path), "--no-progress"])
    assert status == 0
    saved = json.loads((tmp_path / "serve.json").read_text())
    rows = saved["rows"]
    assert [(r["mode"], r["rate"]) for r in rows] == [("continuous", 40.0), ("serial", 40.0),
                                                      ("continuous", "inf"), ("serial", "inf")]
    for r in rows:
        assert r["completed"] == 8 and r["failed"] == 0, r.get("errors")
        d = r["duration_s"]  # rounded to 3 decimals: a run of a few tens of ms is off by up to 0.5 ms,
        #   and requests_per_s is rounded to 3 decimals too (8 / 0.1755 = 45.58405 reads 45.584)
        assert 8 / (d + 0.0005) - 0.0005 <= r["requests_per_s"] <= 8 / max(d - 0.0005, 1e-6) + 0.0005
        assert 0 < r["ttft_p50_s"] <= r["e2e_p50_s"] <= r["e2e_p99_s"] <= r["duration_s"]
        assert r["output_tokens_per_s"] > r["requests_per_s"]  # every answer has more than one token
    # the Poisson run cannot end before its last arrival (8 requests at 40/s: ~0.2 s in expectation)
    assert rows[0]["duration_s"] >= bench.arrival_times(8, 40.0)[-1]
    assert rows[1]["mean_batch"] == 1.0 and rows[0]["mean_batch"] >= 1.0  # serial runs one row at a time
    assert len(saved["verdicts"]) == 2 and "x_serial" in saved["verdicts"][0]
    assert saved["settings"] == ["low_confidence@none", "threshold@dual"]
    out = capsys.readouterr().out
    assert "| continuous | inf | 8 | 0 |" in out and "the requests/s of serial" in out
    assert (tmp_path / "serve.png").read_bytes()[:4] == b"\x89PNG"


@pytest.mark.slow
def test_a_server_process_per_mode(tmp_path):
    """--server process (the default): each mode's server is ``dllm serve --mode MODE`` in its own process."""
    status = bench.main(["--n", "4", "--modes", "static", "--tasks", "reverse", "--repeats", "2", "--threads", "1",
                         "--out", str(tmp_path), "--no-progress"])
    assert status == 0
    saved = json.loads((tmp_path / "serve.json").read_text())
    assert saved["server"] == "process" and [r["repeat"] for r in saved["rows"]] == [0, 1]
    (row,) = saved["table"]
    assert row["mode"] == "static" and row["repeats"] == 2
    assert row["completed"] == 8 and row["failed"] == 0 and row["output_tokens_per_s"] > 0
    assert row["mean_batch"] >= 1.0  # read from the server's /metrics
