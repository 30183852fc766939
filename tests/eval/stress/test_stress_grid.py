"""The ``dllm stress`` grid: syntax, expansion, and clear errors before any decoding."""

import pytest

from dllm.cli import main
from dllm.eval.stress.sweep import StressConfig
from dllm.eval.stress.grid import build_grid, parse_block_lengths, parse_grid_entry


def test_one_option_swept():
    settings = build_grid(["low_confidence:k=1,2,4,8"], [0])
    assert [s.k for s in settings] == [1, 2, 4, 8]
    assert {s.family for s in settings} == {"low_confidence"}
    assert [s.point for s in settings] == ["k=1", "k=2", "k=4", "k=8"]
    assert settings[1].label == "low_confidence:k=2" and settings[1].decode.options == ()


def test_fixed_options_name_the_family_and_block_lengths_cross_every_setting():
    settings = build_grid(["random:k=1,2,ties=first", "threshold:threshold=0.5,0.9", "fast"], [0, 4])
    assert len(settings) == 2 * 2 + 2 * 2 + 2
    rnd = [s for s in settings if s.sampler == "random"]
    assert {s.family for s in rnd} == {"random:ties=first"}
    assert all(dict(s.decode.options) == {"ties": "first"} for s in rnd)
    assert [s.label for s in rnd] == ["random:ties=first,k=1", "random:ties=first,k=2",
                                      "random:ties=first,k=1 block=4", "random:ties=first,k=2 block=4"]
    thr = [s for s in settings if s.sampler == "threshold"]
    assert [(s.k, dict(s.decode.options)["threshold"], s.block_length) for s in thr] == [
        (None, 0.5, 0), (None, 0.9, 0), (None, 0.5, 4), (None, 0.9, 4)]
    assert thr[2].curve == "threshold block=4"
    fast = [s for s in settings if s.sampler == "fast"]
    assert [(s.k, s.point, s.label) for s in fast] == [(None, "", "fast"), (None, "", "fast block=4")]
    assert len({s.label for s in settings}) == len(settings)


def test_fixed_step_sampler_without_k_runs_one_token_per_step():
    (s,) = build_grid(["low_confidence"], [0])
    assert s.k == 1


def test_entry_parsing():
    e = parse_grid_entry("factor:factor=0.7,1.0,1.9")
    assert e.values == (("factor", (0.7, 1.0, 1.9)),) and e.swept == ("factor",) and e.family == "factor"


@pytest.mark.parametrize("grid,message", [
    ("low_confidence:k=0,1", r"k must be an integer >= 1 \(tokens per step\), got 0"),
    ("low_confidence:k=1,2.5", r"k must be an integer >= 1 \(tokens per step\), got 2.5"),
    ("threshold:threshold=0.5,1.5", r"threshold must be a number in \(0, 1\], got 1.5"),
    ("threshold:threshold=0,0.5", r"threshold must be a number in \(0, 1\], got 0"),
    ("factor:factor=-1", "factor"),
    ("nosuch:k=1", "Unknown sampler 'nosuch'. Valid samplers: .*low_confidence"),
    ("threshold:gamma=0.5", "Unknown option.*'gamma'.*Valid options: threshold"),
    ("threshold:k=2", "k applies to fixed-step samplers only"),
    ("low_confidence:1,2", "comes before any OPTION="),
    ("low_confidence:k=1,2,k=4", "sets option 'k' twice"),
    ("low_confidence:k=1,2,2", "lists k=2 twice"),
    ("low_confidence:=3", "has no option name"),
])
def test_invalid_grid_values_name_the_value_and_what_is_valid(grid, message):
    with pytest.raises(ValueError, match=message) as err:
        build_grid([grid], [0])
    assert repr(grid) in str(err.value) or "Unknown sampler" in str(err.value)


def test_one_family_per_entry():
    with pytest.raises(ValueError, match="same family 'low_confidence'"):
        build_grid(["low_confidence:k=1", "low_confidence:k=2"], [0])
    with pytest.raises(ValueError, match="grid is empty"):
        build_grid([], [0])


@pytest.mark.parametrize("text,message", [("-1", "block length must be an integer >= 0"),
                                          ("a", "got 'a'"), ("0,4,0", "twice"), ("", "at least one")])
def test_invalid_block_lengths(text, message):
    with pytest.raises(ValueError, match=message):
        parse_block_lengths(text)
    assert parse_block_lengths("0, 4,8") == (0, 4, 8)


def test_config_checks_everything_without_a_model():
    with pytest.raises(ValueError, match="Unknown task 'nosuch'"):
        StressConfig("oracle", grid=("fast",), tasks=("nosuch",))
    with pytest.raises(ValueError, match="per_size must be an integer >= 1"):
        StressConfig("oracle", grid=("fast",), tasks=("copy",), per_size=0)
    with pytest.raises(ValueError, match="threshold must be"):
        StressConfig("oracle", grid=("threshold:threshold=2",), tasks=("copy",))


def test_cli_rejects_a_bad_grid_before_decoding(tmp_path, capsys):
    out = tmp_path / "st"
    assert main(["stress", "--model", "oracle", "--grid", "low_confidence:k=1,0", "--tasks", "copy",
                 "--out", str(out), "--no-progress"]) == 2
    err = capsys.readouterr().err
    assert "dllm stress: error:" in err and "k must be an integer >= 1" in err and "low_confidence:k=1,0" in err
    assert not out.exists()
