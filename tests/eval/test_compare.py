"""`dllm compare` on the oracle model: the table, the JSON, the plot, the Pareto front."""

import json

import pytest
import torch

from dllm.cli import main
from dllm.eval.compare import SamplerResult, mark_pareto
from dllm.settings import DecodeSettings


def test_spec_parsing():
    s = DecodeSettings.parse("threshold:threshold=0.8")
    assert (s.name, s.sampler_options, s.tokens_per_step) == ("threshold", {"threshold": 0.8}, None)
    s = DecodeSettings.parse("low_confidence:k=2")
    assert (s.name, s.sampler_options, s.tokens_per_step) == ("low_confidence", {}, 2)
    with pytest.raises(ValueError, match="k must be an integer >= 1, got 0"):
        DecodeSettings.parse("low_confidence:k=0")
    with pytest.raises(ValueError, match="expected key=value"):
        DecodeSettings.parse("threshold:0.8")


def _r(label, acc, tpf):
    return SamplerResult(label, acc, {}, 1, 1.0, 1, tpf, tpf, 1.0, 1.0)


def test_pareto_front():
    rs = [_r("a", 1.0, 1.0), _r("b", 0.9, 2.0), _r("c", 0.8, 1.5), _r("d", 1.0, 1.2)]
    mark_pareto(rs)
    assert [r.pareto for r in rs] == [False, True, False, True]


def test_compare_on_oracle_writes_table_json_and_plot(tmp_path, capsys):
    out = tmp_path / "cmp"
    assert main(["compare", "--model", "oracle", "--samplers", "low_confidence", "low_confidence:k=2",
                 "threshold", "--tasks", "copy", "shuffle", "--n", "3", "--out", str(out),
                 "--no-progress"]) == 0
    table = capsys.readouterr().out
    assert "low_confidence:k=2" in table and "TPF" in table
    data = json.loads((out / "compare.json").read_text())
    res = {r["label"]: r for r in data["results"]}
    # exact posteriors: one token per step solves both tasks; k = 2 breaks shuffle (tied marginals)
    assert res["low_confidence"]["accuracy"] == 1.0
    assert res["low_confidence"]["tokens_per_forward"] == pytest.approx(1.0)
    assert res["low_confidence:k=2"]["per_task"] == {"copy": 1.0, "shuffle": 0.0}
    assert res["threshold"]["accuracy"] == 1.0
    assert res["threshold"]["nfe_per_example"] < res["low_confidence"]["nfe_per_example"]
    assert (out / "compare.png").stat().st_size > 1000
    from dllm.eval.bench.timing import reset_peak_memory

    if reset_peak_memory(torch.device("cpu")):  # Linux: the peak resident set of the run, model included
        assert all(r["peak_memory_mb"] > 10 for r in data["results"]) and "peak MiB" in table


def test_k_on_adaptive_sampler_is_rejected(tmp_path, capsys):
    assert main(["compare", "--model", "oracle", "--samplers", "threshold:k=2", "--tasks", "copy",
                 "--n", "1", "--out", str(tmp_path), "--no-progress"]) == 2
    assert "k applies to fixed-step samplers only" in capsys.readouterr().err


def test_repeats_report_the_median_wall_and_refuse_runs_that_differ(tmp_path):
    from dataclasses import replace

    from dllm.eval.compare import median_wall

    base = replace(_r("a", 0.5, 2.0), tokens_per_second=100.0, wall_time=2.0)
    runs = [base, replace(base, wall_time=4.0, tokens_per_second=50.0), replace(base, wall_time=1.0,
                                                                            tokens_per_second=200.0)]
    m = median_wall(runs)
    assert m.wall_time == 2.0 and m.tokens_per_second == 100.0 and m.extra["wall_times"] == [2.0, 4.0, 1.0]
    m = median_wall(runs[1:])  # even count: the mean of the middle two
    assert m.wall_time == 2.5 and m.tokens_per_second == pytest.approx(50.0 * 4.0 / 2.5)
    assert median_wall([replace(base, peak_memory_mb=5.0), replace(base, peak_memory_mb=9.0),
                        replace(base, peak_memory_mb=None)]).peak_memory_mb == 9.0  # the largest peak
    with pytest.raises(RuntimeError, match="a: repeated runs differ"):
        median_wall([base, replace(base, forwarded_tokens=7)])
    out = tmp_path / "cmp"
    assert main(["compare", "--model", "oracle", "--samplers", "threshold", "low_confidence", "--tasks", "copy",
                 "--n", "2", "--repeats", "3", "--out", str(out), "--no-progress"]) == 0
    data = json.loads((out / "compare.json").read_text())
    assert data["repeats"] == 3
    for r in data["results"]:
        walls = r["extra"]["wall_times"]
        assert len(walls) == 3 and r["wall_time"] == sorted(walls)[1]
    with pytest.raises(SystemExit):
        main(["compare", "--model", "oracle", "--repeats", "0", "--out", str(out), "--no-progress"])


def test_a_mixture_of_experts_model_gets_an_experts_per_forward_column():
    """LLaDA 2 MoE (random tiny): each row counts the distinct experts its forwards woke, as
    count_experts does over the same decode; a dense model has no such column."""
    from dllm.eval.compare import compare, format_results, task_examples
    from dllm.models import load
    from dllm.models.core.layer.moe import count_experts
    from dllm.models.tiny import tiny
    from dllm.scoring.exact_match import decode_and_score

    moe = tiny("llada2")  # block-causal, block 4
    specs = ["low_confidence:cache=block", "low_confidence:k=2,cache=block"]
    results = compare(moe, specs, ["copy"], 3, show_progress=False)
    assert all(r.experts_per_forward is not None and r.experts_per_forward > 0 for r in results)
    with count_experts(moe) as counter:
        decode_and_score(moe, task_examples(["copy"], 3), specs[0], by_task=True)
    assert results[0].experts_per_forward == round(counter.mean_distinct(), 2)
    table = format_results(results)
    assert "experts/fwd" in table.splitlines()[0]
    dense = compare(load("tiny-llada"), ["low_confidence"], ["copy"], 2, show_progress=False)
    assert dense[0].experts_per_forward is None and "experts/fwd" not in format_results(dense)


def test_cuda_graphs_reach_every_run_and_change_no_token(monkeypatch):
    """``compare(cuda_graphs=...)`` hands the option to each ``generate`` call: the static step (the path
    CUDA graphs capture, run eagerly here) replays the cached forwards and gives the rows of eager."""
    from dllm.engine.graphs import StepGraphs
    from dllm.eval.compare import compare
    from dllm.models import load

    model = load("tiny-llada")
    specs = ["low_confidence:cache=dual", "fast:cache=dual"]  # one token a step: cached steps after the first
    eager = compare(model, specs, ["sort", "copy"], 2, show_progress=False)
    calls = []
    real = StepGraphs.forward

    def counted(self, *args, **kwargs):
        calls.append(self.mode)
        return real(self, *args, **kwargs)

    monkeypatch.setattr(StepGraphs, "forward", counted)
    static = compare(model, specs, ["sort", "copy"], 2, show_progress=False, cuda_graphs="static")
    assert calls and set(calls) == {"static"}
    for a, b in zip(eager, static):
        assert (a.label, a.accuracy, a.per_task, a.forwarded_tokens, a.nfe_per_example, a.extra["solved"]) == \
               (b.label, b.accuracy, b.per_task, b.forwarded_tokens, b.nfe_per_example, b.extra["solved"])


def test_cuda_graphs_on_a_cpu_model_are_refused_before_any_run(tmp_path, capsys):
    out = tmp_path / "cmp"
    assert main(["compare", "--model", "oracle", "--samplers", "threshold", "--tasks", "copy", "--n", "1",
                 "--out", str(out), "--no-progress", "--cuda-graphs"]) == 2
    err = capsys.readouterr().err
    assert "cuda_graphs=True captures CUDA graphs, but the model is on cpu" in err
    assert not (out / "compare.json").exists()


def test_cuda_graphs_on_a_moe_model_capture_and_leave_out_the_expert_count(monkeypatch):
    """Counting experts runs their loop (a read of their counts, which a capture cannot hold): with graphs
    the rows have no experts/fwd, and the forwards are captured."""
    from dllm.engine.graphs import StepGraphs
    from dllm.eval.compare import compare
    from dllm.models.tiny import tiny

    moe = tiny("llada2", dtype=torch.bfloat16)  # grouped expert matmuls on a CPU
    refused = []
    real = StepGraphs.__init__

    def init(self, *args, **kwargs):
        real(self, *args, **kwargs)
        refused.append(self.refused)

    monkeypatch.setattr(StepGraphs, "__init__", init)
    rows = compare(moe, ["low_confidence:cache=block"], ["copy"], 1, block_length=4, show_progress=False,
                   cuda_graphs="static")
    assert refused and set(refused) == {None} and rows[0].experts_per_forward is None


def test_n_past_a_tasks_test_split_is_refused_before_the_model_loads(tmp_path, capsys, monkeypatch):
    import dllm.eval.compare as compare_mod
    from dllm import tasks as T
    from dllm.eval.compare import task_examples

    picked = task_examples(["latin4"], 50)  # one size: its whole split
    assert len(picked) == 50 and all(T.is_test_prompt(ex) for ex in picked)
    with pytest.raises(ValueError, match=r"n=51 .* 'latin4' holds 50 \(50 per size \[4\]\)"):
        task_examples(["latin4"], 51)
    with pytest.raises(ValueError, match=r"'copy' holds 150"):
        task_examples(["copy"], 151)

    def no_load(*args, **kw):
        raise AssertionError("the model was loaded before the bad --n was refused")

    monkeypatch.setattr(compare_mod, "load_model", no_load)
    assert main(["compare", "--model", "oracle", "--samplers", "low_confidence", "--tasks", "copy", "latin4",
                 "--n", "60", "--out", str(tmp_path / "cmp"), "--no-progress"]) == 2
    assert "'latin4' holds 50" in capsys.readouterr().err


def test_a_task_listed_twice_is_refused_by_the_python_api():
    """compare_samplers(task_names=["copy", "copy"]) would decode copy twice and weigh it double in the
    overall accuracy; refused as `dllm stress` does (the CLI's --tasks already refuses a repeated value)."""
    from dllm.eval.compare import check_compare

    with pytest.raises(ValueError, match=r"tasks list a task twice: \['copy', 'copy'\]"):
        check_compare(["low_confidence"], 1, None, ["copy", "copy"])
