"""The auto-cache rule (dllm/eval/bench/choose/cache.py) and the end-to-end verdict (dllm/eval/bench/e2e.py)."""

import pytest

from dllm.eval.bench.choose import cache as C
from dllm.eval.bench import e2e

ACC = {"a/short": {"none": 0.90, "dual": 0.80, "drift": 0.895, "slow": 0.90},
       "b/long": {"none": 0.95, "dual": 0.95, "drift": 0.94, "slow": 0.95}}
SPEED = {"m": {"none": 1.0, "dual": 12.0, "drift": 4.0, "slow": 2.0}}


def test_rule_needs_accuracy_everywhere_and_the_speedup():
    dual = C.judge("dual", ACC, SPEED)
    assert not dual.passes and dual.reasons == ("a/short: accuracy 80.0% < none 90.0% - 1 pt",)
    drift = C.judge("drift", ACC, SPEED)
    assert drift.passes and drift.accuracy_drop == {"a/short": 0.5, "b/long": 1.0} and drift.mean_speedup == 4.0
    slow = C.judge("slow", ACC, SPEED)
    assert not slow.passes and "m: 2.00x none < 3x at 1024 + 256" in slow.reasons
    winner, verdicts = C.choose(ACC, SPEED, ["dual", "drift", "slow"])
    assert winner == "drift" and [v.cache for v in verdicts] == ["drift", "dual", "slow"]
    assert C.choose(ACC, SPEED, ["dual", "slow"])[0] is None  # nothing passes: no auto
    assert C.judge("drift", ACC, SPEED, tolerance=0.005).passes is False
    assert C.judge("drift", ACC, {}).reasons == ("no speed measurement",)  # half a measurement never passes
    assert C.judge("drift", {}, SPEED).reasons == ("no accuracy measurement",)


def test_resolving_n_makes_one_example_at_most_half_the_tolerance():
    assert C.resolving_n(8, 31) == 8  # PB-mini: one example of 248 is 0.40 pt
    assert C.resolving_n(8, 4) == 50  # the long suite: 8 per task (3.1 pt per example) -> 50 (0.5 pt)
    assert C.resolving_n(60, 4) == 60 and C.resolving_n(1, 1, 0.5) == 4
    for tasks in (1, 3, 4, 7, 31):
        n = C.resolving_n(1, tasks)
        assert 1 / (n * tasks) <= C.TOLERANCE / 2 + 1e-12 < 1 / ((n - 1) * tasks) if n > 1 else True
    with pytest.raises(ValueError, match="got 0, 4, 0.01"):
        C.resolving_n(0, 4)


def test_bad_candidate_fails_before_any_run(capsys):
    with pytest.raises(ValueError, match="Unknown cache policy 'nope'"):
        C.main(["--candidates", "nope"])


def test_bad_speed_model_fails_before_any_run_and_none_skips_speed(capsys, tmp_path, monkeypatch):
    with pytest.raises(SystemExit):
        C.main(["--speed-models", "no-such-model", "--out", str(tmp_path / "x.json")])
    assert "--speed-models: cannot load 'no-such-model'" in capsys.readouterr().err
    runs = []
    monkeypatch.setattr(C, "measure_accuracy", lambda pairs, cands, n, progress, partial: (runs.append("acc"),
                                                                                            ({}, {}))[1])
    monkeypatch.setattr(C, "measure_speed", lambda models, cands, repeats, progress: (runs.append(models), ({}, {}))[1])
    assert C.main(["--speed-models", "none", "--candidates", "dual", "--out", str(tmp_path / "y.json")]) == 0
    assert runs == ["acc", []] and "lack one" in capsys.readouterr().out


def test_a_run_that_dies_keeps_its_measured_pairs_for_merge(tmp_path, monkeypatch, capsys):
    import json

    from dllm.eval import compare as compare_mod
    from dllm.scoring import exact_match
    from dllm.eval.compare import SamplerResult

    calls = []

    def fake_compare(model, specs, names, n, **kw):
        calls.append((model, n))
        if model == "tiny-dream":
            raise KeyboardInterrupt
        return [SamplerResult(s, 0.9 - 0.01 * i, dict.fromkeys(names, 0.9), n * len(names), 2.0, 100, 1.5, 1.2,
                              100.0, 1.0) for i, s in enumerate(specs)]

    monkeypatch.setattr(compare_mod, "compare", fake_compare)
    monkeypatch.setattr(exact_match, "load_model", lambda name, device=None: name)
    out = tmp_path / "choice.json"
    assert C.main(["--pairs", "tiny-llada-long/long-prompt", "tiny-dream/pb-mini", "--candidates", "dual",
                   "--speed-models", "none", "--no-progress", "--out", str(out)]) == 130  # Ctrl-C: one line
    partial = tmp_path / "choice.partial.json"
    assert f"interrupted: 1 finished pair is saved in {partial}; --merge {partial} reuses them" in (
        capsys.readouterr().out)
    kept = json.loads(partial.read_text())
    assert calls == [("tiny-llada-long", 50), ("tiny-dream", 8)] and not out.exists()
    assert kept["accuracy"] == {"tiny-llada-long/long-prompt": {"none": 0.9, "dual": 0.89}}
    calls.clear()
    monkeypatch.setattr(C, "measure_speed", lambda models, cands, repeats, progress: (
        {"tiny-llada": {"none": 1.0, "dual": 5.0}}, {}))
    monkeypatch.setattr(compare_mod, "compare", lambda model, specs, names, n, **kw: [
        SamplerResult(s, 0.8, dict.fromkeys(names, 0.8), n * len(names), 2.0, 100, 1.5, 1.2, 100.0, 1.0)
        for s in specs])
    assert C.main(["--pairs", "tiny-dream/pb-mini", "--candidates", "dual", "--merge", str(partial), "--no-progress",
                   "--out", str(out)]) == 0
    done = json.loads(out.read_text())
    assert set(done["accuracy"]) == {"tiny-dream/pb-mini", "tiny-llada-long/long-prompt"} and done["winner"] == "dual"
    assert not partial.exists()  # superseded by the full result


def test_e2e_verdict_and_plot(tmp_path):
    rows = {e2e.FASTDLLM: {"accuracy": 0.80, "tokens_per_second": 100.0, "tokens_per_forward": 1.5,
                           "forwarded_tokens": 1000},
            "fast:cache=drift": {"accuracy": 0.85, "tokens_per_second": 150.0, "tokens_per_forward": 1.8,
                                 "forwarded_tokens": 1500}}
    v = e2e.verdict(rows, "fast:cache=drift")
    assert v == {"accuracy_delta_pt": 5.0, "speed_ratio": 1.5, "tpf_ratio": 1.2, "forwarded_ratio": 1.5,
                 "faster_every_round": None, "paired": None, "dominates": True}
    rows[e2e.FASTDLLM]["extra"] = {"solved": "0110"}
    rows["fast:cache=drift"]["extra"] = {"solved": "1111"}
    assert e2e.verdict(rows, "fast:cache=drift")["paired"] == {"only_ours": 2, "only_theirs": 0, "sign_test_p": 0.5}
    # a median win that is not a win in every (interleaved) round is within the noise: no dominance
    rows[e2e.FASTDLLM]["extra"] = {"wall_times": [3.0, 2.0, 3.0]}
    rows["fast:cache=drift"]["extra"] = {"wall_times": [2.0, 2.5, 2.0]}
    v = e2e.verdict(rows, "fast:cache=drift")
    assert v["faster_every_round"] is False and not v["dominates"]
    rows["fast:cache=drift"]["extra"] = {"wall_times": [2.0, 1.9, 2.0]}
    assert e2e.verdict(rows, "fast:cache=drift")["dominates"]
    rows["fast:cache=drift"]["accuracy"] = 0.79
    assert not e2e.verdict(rows, "fast:cache=drift")["dominates"]
    e2e.plot({"x/short": rows}, "fast:cache=drift", tmp_path / "e2e.png")
    assert (tmp_path / "e2e.png").stat().st_size > 1000
    assert e2e.specs("none")[1] == "fast" and e2e.specs("drift")[:2] == [e2e.FASTDLLM, "fast:cache=drift"]


@pytest.mark.slow
def test_e2e_runs_one_pair_on_the_given_device(tmp_path, capsys):
    import json

    assert e2e.main(["--pairs", "tiny-llada/pb-mini", "--n", "1", "--repeats", "1", "--device", "cpu", "--no-progress",
                     "--out", str(tmp_path)]) == 0
    out = json.loads((tmp_path / "e2e.json").read_text())
    rows = out["results"]["tiny-llada/pb-mini"]
    assert set(rows) == set(e2e.specs("auto")) and out["ours"] == "fast:cache=auto"
    tasks = len(rows[e2e.FASTDLLM]["per_task"])  # --n 1 is raised to the rule's resolving sample: 7 per task
    assert out["n_per_task"] == {"tiny-llada/pb-mini": 7} == {"tiny-llada/pb-mini": C.resolving_n(1, tasks)}
    assert all(r["examples"] == 7 * tasks for r in rows.values())
    v = out["verdicts"]["tiny-llada/pb-mini"]
    assert v["speed_ratio"] > 0 and f"tokens/s x{v['speed_ratio']:.2f}" in capsys.readouterr().out
    assert out["cuda_graphs"] is False
    # an eager file does not merge into a run with CUDA graphs (refused before the model loads, on any device)
    with pytest.raises(SystemExit):
        e2e.main(["--merge", str(tmp_path / "e2e.json"), "--cuda-graphs", "--out", str(tmp_path / "g")])
    assert "measured with cuda_graphs=False, this run with cuda_graphs=True" in capsys.readouterr().err


def test_e2e_cuda_graphs_on_a_cpu_model_are_refused_before_any_run(tmp_path, capsys):
    with pytest.raises(SystemExit) as exc:
        e2e.main(["--pairs", "tiny-llada/pb-mini", "--device", "cpu", "--cuda-graphs", "--no-progress",
                  "--out", str(tmp_path)])
    assert exc.value.code == 2
    assert "cuda_graphs=True captures CUDA graphs, but the model is on cpu" in capsys.readouterr().err
    assert not (tmp_path / "e2e.json").exists()


def test_paired_outcomes_count_discordant_examples_and_give_the_exact_sign_test():
    assert e2e.paired_outcomes("1110", "0001") == {"only_ours": 3, "only_theirs": 1, "sign_test_p": 0.625}
    assert e2e.paired_outcomes("111000", "000000") == {"only_ours": 3, "only_theirs": 0, "sign_test_p": 0.25}
    assert e2e.paired_outcomes("1010", "1010") == {"only_ours": 0, "only_theirs": 0, "sign_test_p": 1.0}
    ten = e2e.paired_outcomes("1" * 10 + "0" * 10, "0" * 10 + "1" * 10)
    assert ten["sign_test_p"] == 1.0  # an even split says nothing
    assert e2e.paired_outcomes("1" * 10, "0" * 10)["sign_test_p"] == 0.00195  # 2 / 2 ** 10, 3 significant digits
    assert e2e.paired_outcomes("1" * 40, "0" * 40)["sign_test_p"] == 1.82e-12  # not rounded to 0
    assert e2e.paired_outcomes("10", "101") is None and e2e.paired_outcomes(None, "1") is None


def test_e2e_writes_each_pair_as_it_finishes(tmp_path, monkeypatch, capsys):
    import json

    from dllm.eval import compare as compare_mod
    from dllm.scoring import exact_match
    from dllm.eval.compare import SamplerResult

    calls = []

    def fake_compare(model, specs, names, n, **kw):
        calls.append((model, n))
        if len(calls) == 2:
            raise KeyboardInterrupt  # the second pair never finishes (a timeout, a kill)
        return [SamplerResult(s, 0.9, {}, n * len(names), 2.0, 100, 1.5, 1.2, 100.0 + i, 1.0)
                for i, s in enumerate(specs)]

    monkeypatch.setattr(compare_mod, "compare", fake_compare)
    monkeypatch.setattr(exact_match, "load_model", lambda name, device=None: name)
    assert e2e.main(["--pairs", "tiny-llada/pb-mini", "tiny-llada-long/long-prompt", "--no-progress",
                     "--out", str(tmp_path)]) == 130  # Ctrl-C: the finished pair kept, one line
    assert f"interrupted: 1 finished pair is saved in {tmp_path / 'e2e.json'}" in capsys.readouterr().out
    assert calls == [("tiny-llada", 8), ("tiny-llada-long", 50)]  # long suite: the resolving sample
    out = json.loads((tmp_path / "e2e.json").read_text())
    assert list(out["results"]) == ["tiny-llada/pb-mini"] and out["n_per_task"] == {"tiny-llada/pb-mini": 8}
    assert (tmp_path / "e2e.png").stat().st_size > 1000
    calls.append("done")  # the rest of the run: the missing pair, merged with the kept one
    kept = tmp_path / "kept.json"
    kept.write_text((tmp_path / "e2e.json").read_text())
    assert e2e.main(["--pairs", "tiny-llada-long/long-prompt", "--merge", str(kept), "--no-progress",
                     "--out", str(tmp_path)]) == 0
    out = json.loads((tmp_path / "e2e.json").read_text())
    assert out["n_per_task"] == {"tiny-llada/pb-mini": 8, "tiny-llada-long/long-prompt": 50}
    assert set(out["results"]) == set(out["verdicts"]) == set(out["n_per_task"])


def test_dllm_bench_e2e_is_the_e2e_module(capsys):
    from dllm.cli import main

    with pytest.raises(SystemExit):
        main(["bench", "e2e", "--pairs", "tiny-llada/nope", "--out", "unused"])
    assert "['tiny-llada/nope'] are not pairs; valid:" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        main(["bench", "e2e", "--help"])
    assert "--repeats" in capsys.readouterr().out


def test_e2e_refuses_an_unknown_pair_and_device(capsys):
    with pytest.raises(SystemExit):
        e2e.main(["--pairs", "tiny-llada/nope", "--out", "unused"])
    assert "['tiny-llada/nope'] are not pairs; valid:" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        e2e.main(["--pairs", "tiny-llada/pb-mini", "--device", "nope", "--out", "unused"])
    assert "device 'nope' is not a device name; available devices:" in capsys.readouterr().err
