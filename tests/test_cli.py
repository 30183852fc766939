"""The ``dllm`` command, run in-process through ``dllm.cli.main``."""

import io
import json

import pytest

from dllm.cli import CanvasView, main


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
    assert main(["generate", "--model", "tiny-random-llada", "--prompt", "the cat", "--gen-length", "8",
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
    dllm.generate(model, "the cat", gen_length=4, callback=CanvasView(model, stream))
    assert stream.getvalue().count("\x1b[1A\x1b[J") == 3  # frames 2..4 erase the previous one


@pytest.mark.parametrize("argv,match", [
    (["generate", "--model", "tiny-random-llada", "--prompt", "x", "--sampler", "nope"], "Unknown sampler 'nope'"),
    (["generate", "--model", "tiny-random-llada", "--prompt", "x", "--gen-length", "0"], "gen_length must be"),
    (["generate", "--model", "tiny-random-llada", "--prompt", "x", "-o", "bogus=1"], "Unknown option"),
    (["info", "/no/such/model-dir"], "/no/such/model-dir"),
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
