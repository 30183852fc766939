"""The rule that picks the ``fast`` alias (``dllm.eval.bench.choose.fast``), on hand-built results."""

import json
from dataclasses import asdict

import pytest

from dllm.eval.bench.choose.fast import choose, judge
from dllm.eval.compare import SamplerResult


def _r(label, acc, tpf, forwarded=100):
    return SamplerResult(label=label, accuracy=acc, per_task={}, examples=100, nfe_per_example=1.0,
                         forwarded_tokens=forwarded, tokens_per_forward=tpf, content_tokens_per_forward=tpf,
                         tokens_per_second=1.0, wall_time=1.0)


def _model(**cands):
    rows = [_r("low_confidence", 0.90, 1.0), _r("threshold", 0.88, 2.0)]
    return rows + [_r(k, a, t) for k, (a, t) in cands.items()]


def test_rule_each_condition():
    res = {"m": _model(a=(0.895, 3.0), b=(0.885, 3.0), c=(0.95, 1.9), d=(0.87, 5.0), e=(0.90, 2.39),
                       f=(0.90, 2.4))}
    assert judge(res, "a").passes  # within 1 pt of the reference, above threshold, 1.5x the TPF
    assert "- 1 pt" in judge(res, "b").reasons[0]  # 0.885 < 0.90 - 0.01
    assert "TPF 1.90 < 1.2 x threshold" in judge(res, "c").reasons[0]
    assert any("< threshold" in r for r in judge(res, "d").reasons)
    assert "TPF 2.39 < 1.2 x threshold 2.00" in judge(res, "e").reasons[0]  # more, but not 1.2x
    assert judge(res, "f").passes  # exactly 1.2x


def test_verdict_reports_forwarded_tokens_relative_to_the_baseline():
    res = {"m1": _model() + [_r("v", 0.9, 3.0, forwarded=300)], "m2": _model() + [_r("v", 0.9, 3.0, forwarded=100)]}
    assert judge(res, "v").forwarded_ratio == pytest.approx(2.0)  # (3x + 1x) / 2


def test_choose_needs_every_model_and_takes_the_fewest_forwarded_tokens():
    # threshold forwards 100 tokens on each model; a forwards 2x, c 1.5x, b 0.9x but fails on m2
    res = {"m1": _model() + [_r("a", 0.90, 3.0, 200), _r("b", 0.90, 4.0, 90), _r("c", 0.90, 2.5, 150)],
           "m2": _model() + [_r("a", 0.90, 3.0, 200), _r("b", 0.80, 9.0, 90), _r("c", 0.90, 2.8, 150)]}
    winner, verdicts = choose(res, ["a", "b", "c"])
    assert winner == "c"  # passes with the least compute; a has the higher TPF, b fails on m2
    assert [v.label for v in verdicts] == ["c", "a", "b"]
    assert verdicts[0].mean_tpf == pytest.approx(2.65) and verdicts[0].forwarded_ratio == pytest.approx(1.5)


def test_choose_breaks_a_tie_in_forwarded_tokens_by_tpf():
    res = {"m": _model() + [_r("a", 0.90, 2.5, 150), _r("b", 0.90, 3.0, 150)]}
    assert choose(res, ["a", "b"])[0] == "b"


def test_the_forwards_cost_takes_the_most_tokens_per_forward():
    """Same results, the other cost: c passes with the least compute, a with the most tokens per forward
    (the pick where a step costs its forwards); b still fails on m2; equal TPF: the fewer tokens."""
    res = {"m1": _model() + [_r("a", 0.90, 3.0, 200), _r("b", 0.90, 4.0, 90), _r("c", 0.90, 2.5, 150),
                             _r("d", 0.90, 3.0, 300)],
           "m2": _model() + [_r("a", 0.90, 3.0, 200), _r("b", 0.80, 9.0, 90), _r("c", 0.90, 2.8, 150),
                             _r("d", 0.90, 3.0, 300)]}
    assert choose(res, ["a", "b", "c", "d"])[0] == "c"
    winner, verdicts = choose(res, ["a", "b", "c", "d"], cost="forwards")
    assert winner == "a" and [v.label for v in verdicts] == ["a", "d", "c", "b"]
    with pytest.raises(ValueError, match="cost must be one of .*'tokens', 'forwards'.*got 'time'"):
        choose(res, ["a"], cost="time")


def test_no_winner_and_missing_results():
    res = {"m": _model(a=(0.5, 3.0))}
    winner, verdicts = choose(res, ["a"])
    assert winner is None and not verdicts[0].passes
    with pytest.raises(KeyError, match="lack"):
        judge(res, "zzz")


def _compare_files(tmp_path, **models) -> list[str]:
    """One saved `dllm compare` payload per model (8 examples per task), as --results reads them."""
    paths = []
    for model, cands in models.items():
        p = tmp_path / f"{model}.json"
        p.write_text(json.dumps({"model": model, "n_per_task": 8, "results": [asdict(r) for r in _model(**cands)]}))
        paths.append(str(p))
    return paths


def test_cli_judges_saved_compare_results(tmp_path, capsys):
    from dllm.eval.bench.choose.fast import main

    paths = _compare_files(tmp_path, m1=dict(a=(0.90, 3.0), b=(0.5, 4.0)), m2=dict(a=(0.89, 2.5), b=(0.9, 9.0)))
    out = tmp_path / "choice.json"
    assert main(["--results", *paths, "--out", str(out)]) == 0
    printed = capsys.readouterr().out
    assert "fast = a" in printed and "PASS  a" in printed and "fail  b" in printed
    saved = json.loads(out.read_text())
    assert saved["winner"] == "a" and {v["label"] for v in saved["verdicts"]} == {"a", "b"}
    assert saved["cost"] == "tokens"
    assert main(["--results", *paths, "--out", str(out), "--cost", "forwards"]) == 0
    printed = capsys.readouterr().out
    assert "the most tokens per forward wins" in printed and "by forwards = a" in printed
    assert json.loads(out.read_text())["cost"] == "forwards"


def test_cli_rejudges_an_earlier_choice_file(tmp_path, capsys):
    """An earlier --out holds every model's results and what could not run: judging it again gives
    the same verdicts without decoding anything."""
    from dllm.eval.bench.choose.fast import main

    first = tmp_path / "first.json"
    paths = _compare_files(tmp_path, m1=dict(a=(0.90, 3.0)), m2=dict(a=(0.90, 2.5)))
    assert main(["--results", *paths, "--out", str(first)]) == 0
    saved = json.loads(first.read_text())
    saved["skipped"] = {"m2": {"b": "reads attention"}}  # b ran on m1 only
    saved["results"]["m1"].append(saved["results"]["m1"][-1] | {"label": "b"})
    first.write_text(json.dumps(saved))
    capsys.readouterr()
    again = tmp_path / "again.json"
    assert main(["--results", str(first), "--out", str(again)]) == 0
    printed = capsys.readouterr().out
    assert "fast = a" in printed and "m2: cannot run (reads attention)" in printed
    assert json.loads(again.read_text())["n_per_task"] == 8


def _choice_file(tmp_path, name, **models) -> str:
    """A saved choose-fast --out holding every model's rows (8 examples per task)."""
    p = tmp_path / name
    p.write_text(json.dumps({"n_per_task": 8, "results": {m: [asdict(r) for r in rows] for m, rows in models.items()}}))
    return str(p)


def test_cli_merges_new_candidates_into_an_earlier_run(tmp_path, capsys):
    """New candidates decoded beside an earlier run: the rows merge per model by label, and the
    candidate with the fewest forwarded tokens over BOTH runs wins."""
    from dllm.eval.bench.choose.fast import main

    old = _choice_file(tmp_path, "old.json", m1=_model() + [_r("a", 0.90, 3.0, 170)],
                       m2=_model() + [_r("a", 0.9, 3.0, 170)])
    new = _choice_file(tmp_path, "new.json", m1=_model() + [_r("n", 0.90, 2.6, 130)],
                       m2=_model() + [_r("n", 0.9, 2.5, 130)])
    out = tmp_path / "merged.json"
    assert main(["--results", old, new, "--out", str(out)]) == 0
    assert "fast = n" in capsys.readouterr().out
    saved = json.loads(out.read_text())
    assert [v["label"] for v in saved["verdicts"]] == ["n", "a"]
    assert sorted(r["label"] for r in saved["results"]["m2"]) == ["a", "low_confidence", "n", "threshold"]


def test_cli_refuses_runs_that_decoded_the_same_sampler_differently(tmp_path):
    from dllm.eval.bench.choose.fast import main

    other = [_r("low_confidence", 0.90, 1.0), _r("threshold", 0.85, 2.0), _r("n", 0.9, 2.6)]  # threshold: 0.88 before
    old = _choice_file(tmp_path, "old.json", m1=_model(a=(0.9, 3.0)))
    new = _choice_file(tmp_path, "new.json", m1=other)
    with pytest.raises(ValueError, match="'threshold' decoded differently in .*new.json"):
        main(["--results", old, new, "--out", str(tmp_path / "x.json")])


def test_cli_refuses_runs_of_different_n(tmp_path, capsys):
    from dllm.eval.bench.choose.fast import main

    old = _choice_file(tmp_path, "old.json", m1=_model(a=(0.9, 3.0)))
    p = tmp_path / "n4.json"
    p.write_text(json.dumps({"model": "m1", "n_per_task": 4, "results": [asdict(r) for r in _model(n=(0.9, 2.6))]}))
    with pytest.raises(SystemExit):
        main(["--results", old, str(p), "--out", str(tmp_path / "x.json")])
    assert "different numbers of examples per task [4, 8]" in capsys.readouterr().err


@pytest.mark.parametrize("threads", ["0", "-2"])
def test_cli_rejects_threads_below_one(threads, capsys):
    from dllm.eval.bench.choose.fast import main

    with pytest.raises(SystemExit):
        main(["--threads", threads, "--results", "unused.json"])
    assert f"--threads must be >= 1, got {threads}" in capsys.readouterr().err


def test_a_candidate_a_model_cannot_run_fails_with_the_reason():
    from dllm.eval.bench.choose.fast import cannot_run
    from dllm.models import load

    oracle = load("oracle", dtype=None)
    assert "attention" in cannot_run(oracle, "dawn") and cannot_run(oracle, "threshold:threshold=0.8") is None
    assert cannot_run(oracle, "low_confidence:k=2") is None
    res = {"m1": _model(a=(0.9, 3.0)), "m2": _model()}
    verdict = judge(res, "a", skipped={"m2": {"a": "reads attention"}})
    assert not verdict.passes and "m2: cannot run (reads attention)" in verdict.reasons


def test_ctrl_c_keeps_the_models_that_finished(tmp_path, capsys, monkeypatch):
    """Ctrl-C during the second model's run: the first model's rows are written, unjudged, and
    --results reads them back."""
    from dllm.eval.bench.choose import fast

    def compare(model, specs, tasks, n, show_progress=True):
        if model == "m2":
            raise KeyboardInterrupt
        return _model(a=(0.90, 3.0))

    monkeypatch.setattr(fast, "compare", compare)
    monkeypatch.setattr("dllm.scoring.exact_match.load_model", lambda name: name)
    monkeypatch.setattr(fast, "cannot_run", lambda model, spec: None)
    out = tmp_path / "choice.json"
    assert fast.main(["--models", "m1", "m2", "--candidates", "a", "--out", str(out), "--no-progress"]) == 130
    assert f"interrupted: 1 finished model is saved in {out}" in capsys.readouterr().out
    saved = json.loads(out.read_text())
    assert saved["interrupted"] and saved["winner"] is None and list(saved["results"]) == ["m1"]
    assert main_judges(str(out), tmp_path) == "a"


def main_judges(path: str, tmp_path) -> str:
    from dllm.eval.bench.choose.fast import main

    again = tmp_path / "again.json"
    assert main(["--results", path, "--out", str(again)]) == 0
    return json.loads(again.read_text())["winner"]


@pytest.mark.parametrize("n", ["0", "-3"])
def test_cli_refuses_n_below_one(n, capsys):
    from dllm.eval.bench.choose.fast import main

    with pytest.raises(SystemExit):
        main(["--n", n, "--results", "unused.json"])
    assert "--n" in capsys.readouterr().err
