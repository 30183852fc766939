"""The ``dllm`` command, run in-process through ``dllm.cli.main``."""

import io
import json

import pytest

from dllm.cli import main
from dllm.cli.canvas import CanvasView


def test_samplers_lists_names_with_descriptions(capsys):
    assert main(["samplers"]) == 0
    out = capsys.readouterr().out
    for name in ("low_confidence", "random", "origin", "maskgit_plus", "topk_margin", "entropy"):
        assert any(line.startswith(name + " ") for line in out.splitlines()), name
    assert "LLaDA reference" in out


@pytest.mark.parametrize("name,family", [("tiny-random-llada", "llada"), ("tiny-random-dream", "dream")])
def test_info_prints_family_sizes_and_special_ids(capsys, name, family):
    assert main(["info", name]) == 0
    out = capsys.readouterr().out
    fields = dict(line.split(None, 1) for line in out.splitlines())
    assert fields["family"] == family
    for key in ("d_model", "n_layers", "n_heads", "n_kv_heads", "vocab_size", "mask_id", "eos_id", "pad_id"):
        assert fields[key].strip().isdigit(), key


def test_generate_prints_text_and_counters(capsys):
    assert main(["generate", "--model", "tiny-random-llada", "--prompt", "the answer is", "--gen-length", "8",
                 "--block-length", "4", "--steps", "4"]) == 0
    captured = capsys.readouterr()
    stats = json.loads(captured.err.strip().splitlines()[-1])
    assert stats["nfe"] == 4 and stats["generated_tokens"] == 8 and stats["tokens_per_forward"] == 2.0


def test_generate_show_redraws_the_canvas(capsys):
    assert main(["generate", "--model", "tiny-random-dream", "--prompt", "hi", "--gen-length", "6",
                 "--sampler", "maskgit_plus", "-o", "top_k=5", "--show"]) == 0
    lines = [l for l in capsys.readouterr().out.splitlines() if l.startswith("[step")]
    assert len(lines) == 6  # one frame per step (not a tty: frames are appended)
    assert lines[0].count(CanvasView.MASK) >= 5  # step 0 of Dream commits nothing
    assert CanvasView.MASK not in lines[-1]


def test_canvas_view_rewrites_in_place_on_a_tty():
    class Tty(io.StringIO):
        def isatty(self):
            return True

    import dllm
    from dllm.models import load

    model = load("tiny-random-llada")
    stream = Tty()
    dllm.generate(model, "the answer is", gen_length=4, callback=CanvasView(model, stream))
    assert stream.getvalue().count("\x1b[1A\x1b[J") == 3  # frames 2..4 erase the previous one


def test_canvas_frames_count_the_lines_they_wrap_to_at_the_terminals_width():
    """A frame's lines as the terminal wraps them (before: its length // 120 + 1, so a frame of exactly
    120 characters erased one line too many, and a narrower terminal left stale lines)."""
    from dllm.cli.canvas import screen_lines

    assert screen_lines("x" * 120, 120) == 1 and screen_lines("x" * 121, 120) == 2
    assert screen_lines("x" * 100, 40) == 3 and screen_lines("a\n\nb", 80) == 3


@pytest.mark.parametrize("argv,match", [
    (["generate", "--model", "tiny-random-llada", "--prompt", "x", "--sampler", "nope"], "Unknown sampler 'nope'"),
    (["generate", "--model", "tiny-random-llada", "--prompt", "x", "--gen-length", "0"], "gen_length must be"),
    (["generate", "--model", "tiny-random-llada", "--prompt", "x", "-o", "bogus=1"], "Unknown option"),
    (["info", "/no/such/model-dir"], "/no/such/model-dir"),
    # the command's flags, not generate's keyword arguments (before: "pass chat=False", "use cuda_graphs='static'")
    (["generate", "--model", "tiny-llada", "--prompt", "x", "--chat"], "drop --chat and give a raw --prompt"),
    (["generate", "--model", "tiny-llada", "--prompt", "x", "--cuda-graphs"],
     "--cuda-graphs replays CUDA graphs: it needs a CUDA model (--device cuda), but the model is on cpu"),
])
def test_bad_input_exits_2_with_a_message(capsys, argv, match):
    assert main(argv) == 2
    assert match in capsys.readouterr().err


def test_bench_caches_prints_a_table(capsys):
    assert main(["bench", "caches", "--layers", "2", "--prompt-length", "24", "--gen-length", "8",
                 "--block-length", "4", "--samplers", "low_confidence", "--caches", "none", "dual",
                 "--threads", "1"]) == 0
    out = capsys.readouterr().out
    rows = [l for l in out.splitlines() if l.startswith("| none") or l.startswith("| dual")]
    assert len(rows) == 2 and "forwarded_tokens" in out


def _stats(err: str) -> dict:
    return json.loads(err.strip().splitlines()[-1])


def test_generate_takes_a_cache_spec_and_threads(capsys):
    argv = ["generate", "--model", "tiny-random-llada", "--prompt", "the answer is", "--gen-length", "8",
            "--block-length", "4", "--threads", "1"]
    assert main(argv) == 0
    plain = _stats(capsys.readouterr().err)
    assert main(argv + ["--cache", "dual:refresh=4"]) == 0
    cached = _stats(capsys.readouterr().err)
    assert cached["generated_tokens"] == plain["generated_tokens"] == 8
    assert cached["forwarded_tokens"] < plain["forwarded_tokens"]  # the cache forwards only the block
    assert main(argv + ["--cache", "nope"]) == 2
    assert "Unknown cache policy 'nope'" in capsys.readouterr().err


@pytest.mark.parametrize("argv,match", [
    (["compare", "--n", "0"], "argument --n: must be an integer >= 1, got 0"),
    (["compare", "--block-length", "0"], "argument --block-length: must be an integer >= 1, got 0"),
    (["compare", "--threads", "0"], "argument --threads: must be an integer >= 1, got 0"),
    (["bench", "throughput", "--threads", "-1"], "argument --threads: must be an integer >= 1, got -1"),
    (["bench", "throughput", "--batch-size", "0"], "argument --batch-size: must be an integer >= 1, got 0"),
    (["bench", "throughput", "--repeats", "0"], "argument --repeats: must be an integer >= 1, got 0"),
    (["bench", "caches", "--repeats", "0"], "argument --repeats: must be an integer >= 1, got 0"),
    (["eval-tasks", "--model", "oracle", "--per-size", "0"], "argument --per-size: must be an integer >= 1, got 0"),
    (["generate", "--model", "m", "--prompt", "x", "--threads", "0"], "argument --threads: must be an integer >= 1"),
    (["generate", "--model", "m", "--prompt", "x", "-o", "top_p"], "expected key=value"),
])
def test_out_of_range_arguments_are_argparse_errors(capsys, argv, match):
    with pytest.raises(SystemExit) as exit_:
        main(argv)
    assert exit_.value.code == 2
    assert match in capsys.readouterr().err


@pytest.fixture
def no_model_load(monkeypatch):
    """Fail the test if a command loads a model: its checks must come first."""
    import dllm.models

    def load(*args, **kwargs):
        raise AssertionError("a model was loaded before the arguments were checked")

    monkeypatch.setattr(dllm.models, "load", load)


def test_compare_out_on_an_existing_file_fails_before_decoding(tmp_path, capsys, no_model_load):
    out = tmp_path / "results.json"
    out.write_text("keep me")
    assert _status(["compare", "--model", "oracle", "--n", "1", "--out", str(out), "--no-progress"]) == 2
    assert f"argument --out: '{out}' is a file; give a directory" in capsys.readouterr().err
    assert out.read_text() == "keep me"


@pytest.mark.parametrize("argv,match", [
    (["eval-tasks", "--model", "oracle", "--sampler", "threshold", "--k", "1", "2", "4"],
     "sampler 'threshold': k applies to fixed-step samplers only ('threshold' is adaptive"),
    (["compare", "--model", "oracle", "--samplers", "low_confidence", "threshold:k=2"],
     "sampler 'threshold:k=2': k applies to fixed-step samplers only"),
    (["compare", "--model", "oracle", "--samplers", "nope"], "Unknown sampler 'nope'"),
])
def test_sampler_misuse_fails_before_decoding(capsys, no_model_load, argv, match):
    assert main(argv) == 2
    assert match in capsys.readouterr().err


def test_eval_tasks_adaptive_sampler_gets_one_column(capsys, tmp_path):
    path = tmp_path / "r.json"
    assert main(["eval-tasks", "--model", "oracle", "--sampler", "threshold", "--tasks", "copy",
                 "--per-size", "1", "--json", str(path)]) == 0
    head = capsys.readouterr().out.splitlines()[0]
    assert head.split()[-1] == "adaptive" and "k=" not in head
    assert json.loads(path.read_text())["tasks"]["copy"] == {"adaptive": 1.0}


@pytest.mark.parametrize("flag", [[], ["--no-progress"]])
def test_bench_caches_progress_on_stderr(capsys, flag):
    assert main(["bench", "caches", "--layers", "1", "--prompt-length", "8", "--gen-length", "4",
                 "--block-length", "4", "--samplers", "low_confidence", "--caches", "none", "dual",
                 "--threads", "1", *flag]) == 0
    err = capsys.readouterr().err
    assert ("bench caches" in err and "2/2" in err) == (not flag)


def test_bench_kernels_ctrl_c_keeps_the_finished_shapes(capsys, monkeypatch, tmp_path):
    """Ctrl-C during the second shape: the first shape's rows are printed and written, one line, 130."""
    import dllm.eval.bench.kernels as bench

    real, calls = bench.run_kernel_bench, []

    def interrupt_second(shapes, backends=None, **kw):
        calls.append(shapes)
        if len(calls) == 2:
            raise KeyboardInterrupt
        return real(shapes, backends=("reference",), **kw)

    monkeypatch.setattr(bench, "run_kernel_bench", interrupt_second)
    path = tmp_path / "kernels.json"
    assert main(["bench", "kernels", "--device", "cpu", "--repeats", "1", "--json", str(path)]) == 130
    captured = capsys.readouterr()
    rows = json.loads(path.read_text())
    assert [r["backend"] for r in rows] == ["reference"] and rows[0]["shape"] in captured.out
    shapes = len(bench.default_shapes(bench.torch.device("cpu")))
    assert captured.err.splitlines()[-1] == (f"dllm bench kernels: interrupted; finished rows (1 of {shapes} shapes) "
                                             f"are in {path} and printed above")
    assert "bench kernels" in captured.err  # the bar


@pytest.mark.parametrize("command", [["eval", "tasks", "--model", "oracle"], ["eval-tasks", "--model", "oracle"],
                                     ["bench", "caches"], ["bench", "kernels"], ["bench", "throughput"]])
def test_a_json_path_that_cannot_be_written_is_refused_before_the_run(command, tmp_path, capsys, no_model_load):
    with pytest.raises(SystemExit) as exit_:
        main([*command, "--json", str(tmp_path)])
    assert exit_.value.code == 2
    assert f"argument --json: '{tmp_path}' is a directory; give a file path" in capsys.readouterr().err
    (tmp_path / "a-file").write_text("")
    with pytest.raises(SystemExit):
        main([*command, "--json", str(tmp_path / "a-file" / "r.json")])
    assert f"'{tmp_path / 'a-file'}' is a file, not a directory" in capsys.readouterr().err


def test_generate_quantization_flag(capsys):
    """--quantization int8 loads the model quantized; the tiny model still sorts; a bad value is one
    line and status 2; the flag's choices are the quantization registry's."""
    pytest.importorskip("torchao")
    from dllm.cli.args import QUANTIZATION_CHOICES
    from dllm.models.quantize import QUANTIZATIONS

    assert tuple(QUANTIZATIONS) == QUANTIZATION_CHOICES
    assert main(["generate", "--model", "tiny-llada", "--prompt", "[BOS] sort D A C B [SEP]", "--gen-length", "5",
                 "--quantization", "int8", "--threads", "1"]) == 0
    assert capsys.readouterr().out.strip() == "A B C D"
    with pytest.raises(SystemExit) as err:
        main(["generate", "--model", "tiny-llada", "--prompt", "x", "--quantization", "int3"])
    assert err.value.code == 2 and "int3" in capsys.readouterr().err


def test_info_shows_block_causal_attention_and_moe(capsys):
    assert main(["info", "tiny-random-sdar"]) == 0
    fields = dict(line.split(None, 1) for line in capsys.readouterr().out.splitlines())
    assert fields["attention"].strip() == "block_causal" and fields["block_size"].strip().isdigit()
    assert main(["info", "tiny-random-llada"]) == 0
    fields = dict(line.split(None, 1) for line in capsys.readouterr().out.splitlines())
    assert fields["attention"].strip() == "bidirectional" and "block_size" not in fields and "n_experts" not in fields


def test_info_shows_the_experts_of_a_moe_checkpoint(capsys, tmp_path):
    from dllm.models.families.llada2 import tiny_llada2

    tiny_llada2().save_pretrained(tmp_path / "m")
    assert main(["info", str(tmp_path / "m")]) == 0
    fields = dict(line.split(None, 1) for line in capsys.readouterr().out.splitlines())
    assert fields["family"].strip() == "llada2" and fields["attention"].strip() == "block_causal"
    assert (fields["n_experts"].strip(), fields["experts_per_token"].strip(), fields["shared_experts"].strip()) == ("8", "2", "1")


@pytest.mark.parametrize("name", ["tiny-llada", "tiny-dream", "tiny-sdar"])
def test_a_newcomers_first_command_answers(capsys, name):
    """No flag but the model and the prompt: the model's default length (a task model's answer
    length) gives the answer, on the command line and in Python alike."""
    import dllm

    prompt = "[BOS] sort D A C B [SEP]"
    main(["generate", "--model", name, "--prompt", prompt])
    assert capsys.readouterr().out.strip().splitlines()[0] == "A B C D"
    assert dllm.generate(dllm.load(name), prompt).texts == ["A B C D"]


def test_the_default_length_of_a_free_text_prompt_is_128():
    import dllm
    from dllm.settings import DEFAULT_GEN_LENGTH, default_gen_length

    model = dllm.load("tiny-llada")
    assert default_gen_length(model, [model.generation_prompt("[BOS] sort D A C B [SEP]")]) == 5
    assert default_gen_length(model, [[5, 6, 7]]) == DEFAULT_GEN_LENGTH == 128


def test_compare_ctrl_c_keeps_the_finished_samplers(capsys, monkeypatch, tmp_path):
    """Ctrl-C during the second sampler: the first one's row is printed and written, exit 130."""
    import dllm.eval.compare as cmp

    real, calls = cmp.run_sampler, []

    def interrupt_third(*a, **kw):  # the warm-up, the first sampler, then Ctrl-C
        calls.append(1)
        if len(calls) == 3:
            raise KeyboardInterrupt
        return real(*a, **kw)

    monkeypatch.setattr(cmp, "run_sampler", interrupt_third)
    out = tmp_path / "cmp"
    assert main(["compare", "--model", "oracle", "--samplers", "low_confidence:k=1", "low_confidence:k=2",
                 "--tasks", "copy", "--n", "2", "--out", str(out), "--no-progress"]) == 130
    captured = capsys.readouterr()
    saved = json.loads((out / "compare.json").read_text())
    assert [r["label"] for r in saved["results"]] == ["low_confidence:k=1"] and saved["interrupted"]
    assert captured.out.strip().splitlines()[-1] == f"interrupted: 1 finished sampler row is saved in {out / 'compare.json'}"


def test_eval_tasks_ctrl_c_keeps_the_finished_columns(capsys, monkeypatch, tmp_path):
    import dllm.eval.task_eval as te

    real, calls = te.evaluate, []

    def interrupt_second(*a, **kw):
        calls.append(1)
        if len(calls) == 2:
            raise KeyboardInterrupt
        return real(*a, **kw)

    monkeypatch.setattr(te, "evaluate", interrupt_second)
    path = tmp_path / "r.json"
    assert main(["eval", "tasks", "--model", "oracle", "--tasks", "copy", "--k", "1", "2", "--per-size", "1",
                 "--json", str(path)]) == 130
    saved = json.loads(path.read_text())
    assert list(saved["summary"]) == ["1"] and saved["interrupted"] and saved["tasks"]["copy"] == {"1": 1.0}
    assert capsys.readouterr().out.strip().splitlines()[-1] == f"interrupted: 1 finished column is saved in {path}"


def test_bench_kernels_tiles_adds_the_kernels_launch_settings(capsys, monkeypatch):
    """``--tiles`` times the Triton kernel at every tile of ``kernel_tiles.TILES`` too (the rows' backends)."""
    import dllm.eval.bench.kernels as bench
    from dllm.eval.bench.kernel_tiles import tile_names

    seen = []

    def record(shapes, backends=None, **kw):
        seen.append(tuple(backends))
        return []

    monkeypatch.setattr(bench, "run_kernel_bench", record)
    assert main(["bench", "kernels", "--tiny", "--tiles", "--no-progress"]) == 0
    assert main(["bench", "kernels", "--tiny", "--no-progress"]) == 0
    with_tiles, without = seen[0], seen[-1]
    assert with_tiles == without + tuple(tile_names()) and "triton" in without


@pytest.mark.parametrize("argv,match", [
    (["bench", "e2e", "--threads", "0"], "argument --threads: must be an integer >= 1, got 0"),
    (["bench", "frontier", "--threads", "-1"], "argument --threads: must be an integer >= 1, got -1"),
    (["bench", "choose-cache", "--threads", "0"], "argument --threads: must be an integer >= 1, got 0"),
    (["generate", "--model", "tiny-llada", "--prompt", "x", "--order-png", "o.txt"], "the plot is written as PNG"),
    (["bench", "trees", "--png", "t.txt"], "argument --png: 't.txt': the plot is written as PNG"),
    (["eval-tasks", "--model", "oracle", "--json", "/proc/x/r.json"], "no file can be written under '/proc'"),
    (["bench", "spec", "--out", "/proc/x/r.json"], "argument --out: '/proc/x/r.json': no file can be written"),
    (["bench", "breakdown", "--json", "/proc/x/b.json"], "argument --json: '/proc/x/b.json': no file can be"),
    (["bench", "spec", "--methods", "ngram", "--seed", "-1"], "--seed must be an integer in [0, 2**64 - 1], got -1"),
    (["compare", "--model", "oracle", "--tasks", "sort", "copy", "sort"], "argument --tasks: 'sort' is given twice"),
    (["eval-tasks", "--model", "oracle", "--k", "1", "1"], "argument --k: 1 is given twice"),
])
def test_outputs_and_numbers_are_refused_before_the_run(capsys, argv, match):
    """Before anything loads or runs: an output path no file can be written at, a plot path that is
    not a PNG, a thread count below 1, a seed out of range (each once found only after the run)."""
    assert _status(argv) == 2
    assert match in capsys.readouterr().err


def _status(argv) -> int:
    """``main(argv)``'s exit status, from its return or from argparse's SystemExit."""
    try:
        return main(argv)
    except SystemExit as exit_:
        return exit_.code


def test_json_inputs_that_are_not_the_commands_output_name_the_file(tmp_path, capsys):
    empty, bad = tmp_path / "empty.json", tmp_path / "bad.json"
    empty.write_text("{}")
    bad.write_text("x")
    for argv, match in (
            (["bench", "choose-fast", "--results", str(empty)], f"--results {empty}: expected the JSON object "
                                                                  f"`dllm compare --out`"),
            (["bench", "choose-fast", "--results", str(bad)], f"--results {bad}: not JSON"),
            (["bench", "e2e", "--merge", str(empty), "--n", "1"], f"--merge {empty}: expected the JSON object "
                                                                    f"`dllm bench e2e --out` writes, with 'ours'"),
            (["bench", "choose-cache", "--merge", str(empty), "--n", "1"], f"--merge {empty}: expected the JSON "
                                                                             f"object `dllm bench choose-cache")):
        assert _status(argv) == 2
        assert match in capsys.readouterr().err


def test_bench_caches_keeps_its_finished_runs_on_ctrl_c(tmp_path, capsys, monkeypatch):
    import dllm.eval.bench.caches as caches

    def one_then_interrupt(*args, results, **kwargs):
        results.append({"policy": "none", "sampler": "low_confidence", "wall_s": 0.1})
        raise KeyboardInterrupt

    monkeypatch.setattr(caches, "run_cache_bench", one_then_interrupt)
    out = tmp_path / "c.json"
    argv = ["bench", "caches", "--layers", "1", "--prompt-length", "8", "--gen-length", "4", "--block-length", "4",
            "--json", str(out), "--no-progress"]
    assert main(argv) == 130
    assert "interrupted: 1 finished run is saved in" in capsys.readouterr().out
    assert json.loads(out.read_text())[0]["policy"] == "none"
    for flag, value, match in (("--device", "bogus", "device 'bogus' is not a device name"),
                               ("--dtype", "bogus", "dtype 'bogus' is not supported")):
        assert main(argv[:-3] + [flag, value]) == 2
        assert match in capsys.readouterr().err


def test_tasks_listing_columns_line_up(capsys):
    """Every description starts in the same column, also after the wide sizes ("24..2040")."""
    assert main(["tasks"]) == 0
    lines = capsys.readouterr().out.splitlines()
    starts = {line.index("  ", line.index("..")) for line in lines}  # where the description column begins
    assert len(lines) > 10 and len(starts) == 1, sorted(starts)


@pytest.mark.parametrize("command", [["generate", "--prompt", "x"], ["serve", "--port", "0"]])
def test_a_sampler_option_given_twice_is_refused_not_dropped(capsys, no_model_load, command):
    """``-o threshold=0.5 -o threshold=0.7`` ran at 0.7 without a word about the 0.5."""
    argv = [command[0], "--model", "tiny-llada", "--sampler", "threshold", "-o", "threshold=0.5",
            "-o", "threshold=0.7", *command[1:]]
    assert main(argv) == 2
    assert "-o threshold given twice (threshold=0.5 and threshold=0.7)" in capsys.readouterr().err


def test_serve_closes_its_socket_when_the_model_fails_to_load(capsys, monkeypatch):
    import dllm.cli.serve as serve
    import dllm.models

    socks = []
    monkeypatch.setattr(serve, "bind", lambda host, port: socks.append(serve.socket.socket()) or socks[-1])
    monkeypatch.setattr(dllm.models, "load", lambda *a, **k: (_ for _ in ()).throw(ValueError("no such model")))
    assert main(["serve", "--model", "tiny-llada", "--port", "0"]) == 2
    assert "dllm serve: error: no such model" in capsys.readouterr().err
    assert len(socks) == 1 and socks[0].fileno() == -1  # closed, not left to the garbage collector
