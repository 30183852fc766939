"""``dllm.eval.bench.kernels`` and its report (``kernel_report``): one row per (shape, backend), errors measured, refusals reported."""

from __future__ import annotations

import pytest
import torch

from dllm.eval.bench.kernel_report import COLUMNS, RATIO_COLUMNS, format_table, sdpa_ratios
from dllm.eval.bench.kernels import AttnShape, StatsShape, default_shapes, run_kernel_bench, tiny_shapes

from .conftest import DEVICE, INTERPRETED


def test_run_kernel_bench_rows():
    shapes = [AttnShape(1, 2, 1, 16, 64, 32, "fp32", pad=8), AttnShape(1, 2, 2, 16, 32, 16, "bf16"),
              StatsShape(2, 256, "fp32"), StatsShape(2, 256, "fp32", temperature=1.0)]
    rows = run_kernel_bench(shapes, ("triton", "sdpa", "reference"), device=DEVICE, repeats=1, warmup=0)
    assert [(r["kind"], r["backend"]) for r in rows] == [
        *[("attention", b) for b in ("triton", "sdpa", "reference")] * 2,
        *[("stats", b) for b in ("triton", "reference")] * 2,
    ]
    assert rows[0]["shape"] == "B1-H2-Hkv1-Tq16-Tk64-D32-fp32-pad8"
    for r in rows:
        assert set(COLUMNS) <= set(r)
        if r["kind"] == "attention" and r["shape"].endswith("bf16") and r["backend"] == "triton" and INTERPRETED:
            assert r["ms"] is None and "bf16" in r["note"]
            continue
        if r["shape"].endswith("bf16"):
            continue  # the bf16 reference comparison is loose: only the fp32 rows are checked below
        assert r["ms"] > 0 and r["max_abs_err"] < 1e-4, r
        assert r["interpreted"] == (INTERPRETED and r["backend"] == "triton")
    assert "argmax agree 1.0000, sample agree 1.0000" in rows[-2]["note"]
    table = format_table(rows)
    assert table.count("\n") == len(rows) + 1 and "| kind | shape | backend |" in table


def test_default_shapes_are_realistic_on_gpu():
    import torch

    gpu = default_shapes(torch.device("cuda"))
    assert any(isinstance(s, AttnShape) and s.heads == 32 and s.head_dim == 128 and s.kv_len == 4096 and s.q_len == 32
               for s in gpu)
    assert any(isinstance(s, StatsShape) and s.vocab == 126464 for s in gpu)


def test_ratios_to_sdpa_and_the_auto_choice():
    rows = run_kernel_bench(tiny_shapes()[:1], ("triton", "sdpa", "auto"), device=DEVICE, repeats=1, warmup=0)
    by = {r["backend"]: r for r in rows}
    assert by["sdpa"]["vs_sdpa"] == 1.0
    assert by["auto"]["vs_sdpa"] == round(by["auto"]["ms"] / by["sdpa"]["ms"], 2)
    assert by["auto"]["note"].startswith("chose ") and by["auto"]["max_abs_err"] < 1e-4
    (line,) = sdpa_ratios(rows)
    assert line["shape"] == rows[0]["shape"] and line["sdpa_ms"] == by["sdpa"]["ms"]
    assert line["auto_chose"] in ("sdpa", "triton") and line["auto/sdpa"] == by["auto"]["vs_sdpa"]
    if INTERPRETED:
        assert line["auto_chose"] == "sdpa" and "not probed" in by["auto"]["note"]
        assert str(line["triton/sdpa"]).endswith("(interpreted)")
    assert "| shape | sdpa_ms | triton/sdpa | auto/sdpa | auto_chose |" in format_table([line], RATIO_COLUMNS)


def test_fast_step_rows_time_the_kernels_against_the_torch_path():
    from dllm.eval.bench.kernels import LoPAShape

    rows = run_kernel_bench([LoPAShape(2, 8, 256, "fp32")], ("triton", "sdpa", "reference"), device=DEVICE,
                            repeats=1, warmup=0)
    assert [(r["kind"], r["backend"]) for r in rows] == [("lopa", "triton"), ("lopa", "reference")]
    assert rows[0]["shape"] == "fast-step-B2-W8-V256-fp32"
    for r in rows:
        assert r["ms"] > 0 and r["note"] == "same commits", r
        assert r["interpreted"] == (INTERPRETED and r["backend"] == "triton")
    assert rows[1]["speedup"] == 1.0
    assert any(isinstance(s, LoPAShape) and s.vocab == 126464 for s in default_shapes(__import__("torch").device("cuda")))


def test_tile_rows_time_the_kernel_at_other_launch_settings():
    from dllm.eval.bench.kernel_tiles import TILES, Tile, tile_names
    from dllm.eval.bench.kernel_report import TILE_COLUMNS, format_report

    names = tile_names(TILES[:2])
    rows = run_kernel_bench(tiny_shapes()[:1], ("triton", "sdpa", *names), device=DEVICE, repeats=1, warmup=0)
    by = {r["backend"]: r for r in rows}
    for name in names:  # the same outputs as the default launch, within float error
        assert by[name]["ms"] is not None and by[name]["max_abs_err"] < 1e-4, by[name]
        assert by[name]["interpreted"] == by["triton"]["interpreted"]
    (line,) = sdpa_ratios(rows)
    fastest = min((r for r in rows if r["backend"].startswith("triton")), key=lambda r: r["ms"])
    assert line["best_triton"] == fastest["backend"]
    assert "| best_triton | best/sdpa |" in format_table([line], TILE_COLUMNS) and "best_triton" in format_report(rows)
    assert Tile.parse("triton[32x64w8]") == Tile(32, 64, 8) and Tile.parse("triton") is None
    with pytest.raises(ValueError, match="Tile.block_n must be a power of two >= 16, got 48"):
        Tile(32, 48, 4)


def test_flash_attention_refuses_bad_launch_options():
    from dllm.kernels.triton.attention import flash_attention

    q = torch.randn(1, 2, 16, 32)
    with pytest.raises(ValueError, match="num_warps must be a power of two from 1 to 16, got 3"):
        flash_attention(q, q, q, num_warps=3)
    with pytest.raises(ValueError, match="num_stages must be an int >= 1, got 0"):
        flash_attention(q, q, q, num_stages=0)
