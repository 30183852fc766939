"""``dllm.eval.bench.caches``: one row per (policy, sampler) with consistent counts."""

import pytest

from dllm.cache import DualCache
from dllm.eval.bench.caches import COLUMNS, format_table, run_cache_bench
from dllm.models import tiny


def test_run_cache_bench_rows():
    model = tiny("llada", seed=0)
    rows = run_cache_bench(model, prompt_len=10, gen_len=8, block=4,
                           samplers=["low_confidence", "threshold:threshold=0.5"],
                           policies=["dual", "none", DualCache(refresh=1)], warmup=False)
    assert [(r["policy"], r["sampler"]) for r in rows] == [
        ("none", "low_confidence"), ("dual", "low_confidence"), ("dual:refresh=1", "low_confidence"),
        ("none", "threshold:threshold=0.5"), ("dual", "threshold:threshold=0.5"),
        ("dual:refresh=1", "threshold:threshold=0.5"),
    ]
    for r in rows:
        assert set(COLUMNS) <= set(r)
        assert r["generated_tokens"] == 8 and r["wall_s"] > 0 and r["speedup"] is not None
    none, dual, every = rows[:3]
    assert none["kv_cache_mb"] == 0 and dual["kv_cache_mb"] > 0
    assert dual["forwarded_tokens"] < none["forwarded_tokens"] == every["forwarded_tokens"]
    assert every["match_none"] == 1.0  # refresh every step is exact
    table = format_table(rows)
    assert table.count("\n") == len(rows) + 1 and "| policy |" in table


def test_a_bad_sampler_spec_is_refused_before_any_run():
    model = tiny("llada", seed=0)
    rows: list = []
    with pytest.raises(ValueError, match="nope"):
        run_cache_bench(model, prompt_len=6, gen_len=4, block=4, samplers=["low_confidence", "nope"],
                        policies=["none"], warmup=False, results=rows)
    assert rows == []  # not one run was made (and lost) before the refusal
