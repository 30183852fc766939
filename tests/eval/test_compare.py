"""`dllm compare` on the oracle model: the table, the JSON, the plot, the Pareto front."""

import json

import pytest

from dllm.cli import main
from dllm.eval.compare import SamplerResult, SamplerSpec, mark_pareto


def test_spec_parsing():
    s = SamplerSpec.parse("threshold:threshold=0.8")
    assert (s.name, s.options, s.k) == ("threshold", {"threshold": 0.8}, None)
    s = SamplerSpec.parse("low_confidence:k=2")
    assert (s.name, s.options, s.k) == ("low_confidence", {}, 2)
    with pytest.raises(ValueError, match="k must be an integer >= 1, got 0"):
        SamplerSpec.parse("low_confidence:k=0")
    with pytest.raises(ValueError, match="expected key=value"):
        SamplerSpec.parse("threshold:0.8")


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


def test_k_on_adaptive_sampler_is_rejected(tmp_path, capsys):
    assert main(["compare", "--model", "oracle", "--samplers", "threshold:k=2", "--tasks", "copy",
                 "--n", "1", "--out", str(tmp_path), "--no-progress"]) == 2
    assert "k applies to fixed-step samplers only" in capsys.readouterr().err
