"""The per-component step breakdown (dllm.eval.bench.breakdown) on a small model."""

import pytest
import torch

from dllm.eval.bench.breakdown import format_rows, main, reference_statistics_seconds, run_case
from dllm.eval.bench.timing import StepClock
from dllm.models.tiny import tiny


def _model(layers=2):
    return tiny("llada", tokenizer=False, n_layers=layers, d_model=64, n_heads=4, n_kv_heads=4, mlp_hidden=128,
                vocab_size=512, max_positions=1024)


@pytest.mark.parametrize("cache", ["none", "dual"])
def test_components_add_up_to_the_step(cache):
    r = run_case(_model(), cache=cache, sampler="threshold", prompt_length=40, block_length=16, steps=2,
                 device=torch.device("cpu"))
    assert r["steps_timed"] == 2
    parts = [2 * r["layer_s"], r["embedding_s"], r["head_s"], r["statistics_s"], r["engine_s"]]
    assert all(p >= 0 for p in parts) and r["layer_s"] > 0 and r["head_s"] > 0
    assert sum(parts) == pytest.approx(r["step_s"], rel=1e-6, abs=1e-9)
    # the query: the whole canvas without a cache, the block with the dual cache; threshold reads the
    # block only, so the head runs on its 16 rows either way (the reference's on the whole query)
    assert r["query_rows"] == (56 if cache == "none" else 16) and r["logits_rows"] == 16
    assert r["reference_head_s"] > 0 and r["reference_statistics_s"] > 0
    assert 0 <= r["engine_share"] <= 1
    assert r["projected_step_32_s"] > r["step_s"]  # 32 layers instead of 2
    assert "dual" in format_rows([{"dtype": "float32", **r}]) or cache == "none"


def test_a_sampler_forward_is_not_counted_as_statistics():
    """``fast`` forwards verification variants inside its step: that time is forward time."""
    r = run_case(_model(), cache="none", sampler="fast", prompt_length=40, block_length=16, steps=2,
                 device=torch.device("cpu"))
    assert r["statistics_s"] >= 0 and r["layer_s"] > 0


def test_a_graphed_case_reports_its_captures():
    """``--cuda-graphs`` (on a CPU the static step run eagerly): the row says how the call's one dual-cache
    shape ran: its first forward eagerly, captured at the second, replayed after (no CUDA memory here)."""
    r = run_case(_model(), cache="dual", sampler="threshold", prompt_length=40, block_length=16, steps=2,
                 device=torch.device("cpu"), cuda_graphs="static")
    assert r["steps_timed"] == 2
    assert (r["graph_first_runs"], r["graph_captures"]) == (1, 1) and r["graph_replays"] >= 2
    assert r["graph_mb"] == 0
    eager = run_case(_model(), cache="dual", sampler="threshold", prompt_length=40, block_length=16, steps=2,
                     device=torch.device("cpu"))
    assert "graph_captures" not in eager


def test_the_clock_ignores_untimed_calls():
    model = _model(1)
    clock = StepClock(model, type("S", (), {"step": lambda self, i, s: None})(), torch.device("cpu"), 1)
    with torch.no_grad():
        model(torch.zeros(1, 8, dtype=torch.long))
    clock.close()
    assert dict(clock.total) == {} and clock.layer_calls == 0


def test_reference_statistics_time_a_float64_softmax():
    assert reference_statistics_seconds(torch.randn(1, 8, 300)) > 0


@pytest.mark.parametrize("argv, message", [(["--layers", "0"], "--layers must be >= 1"),
                                           (["--dtypes", "float8"], "float8")])
def test_bad_flags_are_refused(argv, message, capsys):
    with pytest.raises(SystemExit):
        main(argv)
    assert message in capsys.readouterr().err


def test_the_cli_hands_its_flags_to_the_bench(capsys):
    from dllm.cli import main as cli

    with pytest.raises(SystemExit):
        cli(["bench", "breakdown", "--layers", "0"])
    assert "dllm bench breakdown: error: --layers must be >= 1, got 0" in capsys.readouterr().err


def test_ctrl_c_keeps_the_finished_rows(tmp_path, monkeypatch, capsys):
    """Ctrl-C after the first case: its row printed and written to --json, one line said, status 130."""
    import json

    from dllm.eval.bench import breakdown as B

    real = B.run_case
    calls = []

    def interrupt_second(*args, **kw):
        calls.append(1)
        if len(calls) == 2:
            raise KeyboardInterrupt
        return real(*args, **kw)

    monkeypatch.setattr(B, "build_model", lambda layers, dtype, device, **k: _model(1).to(dtype))
    monkeypatch.setattr(B, "run_case", interrupt_second)
    out = tmp_path / "b.json"
    assert main(["--dtypes", "float32", "--caches", "none,dual", "--prompt-length", "8", "--block-length", "4",
                 "--steps", "1", "--device", "cpu", "--json", str(out)]) == 130
    assert [r["cache"] for r in json.loads(out.read_text())["rows"]] == ["none"]
    assert f"interrupted: 1 finished row is saved in {out}" in capsys.readouterr().out


@pytest.mark.skipif(torch.cuda.is_available(), reason="needs a machine without CUDA")
def test_cuda_without_cuda_is_refused_before_a_model_is_built(monkeypatch, capsys):
    from dllm.eval.bench import breakdown as B

    monkeypatch.setattr(B, "build_model", lambda *a, **k: pytest.fail("a model was built"))
    with pytest.raises(SystemExit):
        main(["--device", "cuda"])
    assert "--device: device 'cuda': CUDA is not available" in capsys.readouterr().err


def test_layer_paths_are_timed_and_counted_each():
    """``--layer-paths fused,ops``: a row per path; the one-launch operators issue fewer kernel-like
    ops per layer than the ATen norms and RoPE (counted on the CPU model: what a GPU launches)."""
    model = _model().to(torch.bfloat16)
    rows = {path: run_case(model, cache="dual", sampler="threshold", prompt_length=40, block_length=16, steps=1,
                           device=torch.device("cpu"), layer_path=path) for path in ("fused", "ops")}
    assert {r["layer_path"] for r in rows.values()} == {"fused", "ops"}
    assert rows["ops"]["kernels_per_layer"] < rows["fused"]["kernels_per_layer"]
    assert "ops" in format_rows([{"dtype": "bfloat16", **rows["ops"]}])
    with pytest.raises(ValueError, match="layer_path must be one of"):
        run_case(model, cache="dual", sampler="threshold", prompt_length=40, block_length=16, steps=1,
                 device=torch.device("cpu"), layer_path="fastest")


def test_a_bad_layer_path_flag_is_refused(capsys):
    with pytest.raises(SystemExit):
        main(["--layer-paths", "fused,turbo", "--width", "tiny"])
    assert "--layer-paths: ['turbo'] not valid" in capsys.readouterr().err


def test_the_benchmark_model_is_built_on_its_device():
    """``build_model`` makes and draws the weights on the device it is given (an 8B-width layer drawn
    on one CPU thread and copied took seconds a layer); on the CPU the same weights as ``tiny``."""
    from dllm.eval.bench.breakdown import build_model

    device = "cuda" if torch.cuda.is_available() else "cpu"
    model = build_model(1, torch.bfloat16, device, width="tiny")
    assert {p.device.type for p in model.parameters()} == {device}
    assert {p.dtype for p in model.parameters()} == {torch.bfloat16}
    if device == "cpu":
        ref = tiny("llada", tokenizer=False, n_layers=1, max_positions=8192, seed=0, d_model=64, n_heads=4,
                   n_kv_heads=4, mlp_hidden=128, vocab_size=512).to(torch.bfloat16)
        assert all(torch.equal(a, b) for a, b in zip(model.state_dict().values(), ref.state_dict().values()))
    ids = torch.randint(5, 60, (1, 8), device=device)
    assert model(ids).logits.shape == (1, 8, 512)
