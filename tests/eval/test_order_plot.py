"""The decoding-order picture: ``commit_steps``, ``plot_order`` and ``dllm generate --order-png``."""

import pytest
import torch

import dllm
from dllm.cli import main
from dllm.eval.order_plot import commit_steps, plot_order
from dllm.state import GenerationOutput

pytest.importorskip("matplotlib")

PROMPTS = ["[BOS] reverse A B C D [SEP]", "[BOS] sort D A C B [SEP]"]
G = 5  # the answer: 4 letters and the end token


@pytest.fixture(scope="module")
def model():
    from dllm.models import load

    return load("tiny-llada")


@pytest.fixture(scope="module")
def one_per_step(model):
    return dllm.generate(model, PROMPTS, sampler="low_confidence", gen_length=G, steps=G, return_trace=True)


def test_one_token_per_step_commits_a_permutation(one_per_step):
    steps = commit_steps(one_per_step)
    assert steps.dtype == torch.long and steps.shape == (2, G)
    assert torch.equal(steps, one_per_step.trace.long())
    for row in steps:
        assert sorted(row.tolist()) == list(range(G))  # each step commits exactly one position


def test_commit_steps_is_a_copy(one_per_step):
    steps = commit_steps(one_per_step)
    steps.fill_(-1)
    assert (one_per_step.trace >= 0).all()


def test_fast_sampler_commits_several_positions_in_a_step(model):
    out = dllm.generate(model, PROMPTS, sampler="fast", gen_length=G, return_trace=True)
    steps = commit_steps(out)
    assert (steps >= 0).all()
    counts = [torch.bincount(row).max().item() for row in steps]
    assert max(counts) > 1


def test_plot_writes_a_png(one_per_step, model, tmp_path):
    path = plot_order(one_per_step, tmp_path / "sub" / "order.png", tokenizer=model.tokenizer, title="t")
    assert path == tmp_path / "sub" / "order.png"
    assert path.read_bytes()[:4] == b"\x89PNG"
    plain = plot_order(one_per_step, str(tmp_path / "plain.png"))  # no tokenizer: no text, row numbers
    assert plain.read_bytes()[:4] == b"\x89PNG"


def test_never_committed_cells_are_allowed(one_per_step, tmp_path):
    out = GenerationOutput(**{**one_per_step.__dict__, "trace": one_per_step.trace.clone()})
    out.trace[0, -2:] = -1
    assert commit_steps(out)[0, -2:].tolist() == [-1, -1]
    assert plot_order(out, tmp_path / "o.png").read_bytes()[:4] == b"\x89PNG"


def test_errors_without_trace_and_for_a_bad_suffix(model, one_per_step, tmp_path):
    out = dllm.generate(model, PROMPTS[:1], sampler="low_confidence", gen_length=G, steps=G)
    with pytest.raises(ValueError, match="return_trace=True"):
        commit_steps(out)
    with pytest.raises(ValueError, match="return_trace=True"):
        plot_order(out, tmp_path / "o.png")
    with pytest.raises(ValueError, match=r"\.png"):
        plot_order(one_per_step, tmp_path / "o.jpg")
    assert not (tmp_path / "o.jpg").exists()


def test_cli_order_png_writes_the_file(tmp_path, capsys):
    path = tmp_path / "order.png"
    assert main(["generate", "--model", "tiny-llada", "--prompt", PROMPTS[0], "--gen-length", str(G),
                 "--order-png", str(path)]) == 0
    err = capsys.readouterr().err
    assert str(path) in err
    assert path.read_bytes()[:4] == b"\x89PNG"


def test_cli_order_png_bad_suffix_is_an_error(tmp_path, capsys):
    with pytest.raises(SystemExit) as exit_:  # an argparse error: before the model loads
        main(["generate", "--model", "tiny-llada", "--prompt", PROMPTS[0], "--gen-length", str(G),
              "--order-png", str(tmp_path / "order.svg")])
    assert exit_.value.code == 2
    assert "give a path ending in .png" in capsys.readouterr().err
