"""``dllm.scoring.setting``: one decode setting parsed once (sampler, options, cache, k, block length)."""

import pytest

from dllm.scoring.setting import DecodeSetting, cache_spec, steps_for


def test_parse_splits_k_and_cache_from_the_sampler_options():
    s = DecodeSetting.parse("threshold:threshold=0.8,cache=(dual:look_back=16,look_ahead=16)")
    assert (s.name, s.sampler_options, s.cache, s.k) == ("threshold", {"threshold": 0.8},
                                                         "dual:look_back=16,look_ahead=16", None)
    assert s.options == {"threshold": 0.8, "cache": "dual:look_back=16,look_ahead=16"}
    assert DecodeSetting.parse(s.spec) == DecodeSetting(s.spec, *list(vars(s).values())[1:])  # spec round-trips
    s = DecodeSetting.parse("low_confidence:k=2,cache=dual:look_back=16;look_ahead=16", block_length=4)
    assert (s.k, s.cache, s.block_length, s.options) == (2, "dual:look_back=16,look_ahead=16", 4, {"cache": s.cache})
    assert DecodeSetting.parse("fast").options == {}


def test_k_to_steps_is_written_once():
    assert steps_for(10, 4, 2) == 3 * 2  # 3 blocks (4, 4, 2) x ceil(4 / 2)
    assert steps_for(10, None, 3) == 4 and steps_for(10, 4, None) is None
    assert steps_for(5, 8, 1) == 5  # a block longer than the answer is the answer
    assert steps_for(4, 4, 8) == 1  # at most one step per position, at least one per block
    assert DecodeSetting.parse("low_confidence:k=2", block_length=4).steps(10) == 6


@pytest.mark.parametrize("text,kw,match", [
    ("low_confidence:k=0", {}, "sampler spec 'low_confidence:k=0': k must be an integer >= 1, got 0"),
    ("low_confidence:k=2", {"k": 2}, "sets k=2 and k=2 is given too; give it once"),
    ("fast:cache=dual", {"cache": "prefix"}, "sets cache='dual' and cache='prefix' is given too"),
    ("threshold:0.8", {}, "cannot parse sampler spec option '0.8'"),
    ("fast", {"block_length": 0}, "block_length must be an integer >= 1 (or None), got 0"),
])
def test_parse_errors_name_the_value(text, kw, match):
    with pytest.raises(ValueError, match=match.replace("(", r"\(").replace(")", r"\)")):
        DecodeSetting.parse(text, **kw)


def test_check_fails_before_decoding():
    with pytest.raises(ValueError, match="k applies to fixed-step samplers only"):
        DecodeSetting.parse("threshold:k=2").check()
    with pytest.raises(ValueError, match="Unknown sampler 'nope'"):
        DecodeSetting.parse("nope").check()
    with pytest.raises(ValueError, match="cache 'dual:bogus=1': Unknown option"):
        DecodeSetting.parse("fast:cache=dual:bogus=1").check()
    DecodeSetting.parse("fast:cache=(dual:look_back=16,look_ahead=16)").check()


def test_of_builds_from_the_keyword_form_and_refuses_an_option_twice():
    s = DecodeSetting.of("threshold", k=None, block_length=4, options={"threshold": 0.7, "cache": "dual"})
    assert (s.name, s.sampler_options, s.cache, s.block_length) == ("threshold", {"threshold": 0.7}, "dual", 4)
    with pytest.raises(ValueError, match=r"sets \['threshold'\] and they are given as options too"):
        DecodeSetting.of("threshold:threshold=0.9", options={"threshold": 0.7})
    with pytest.raises(ValueError, match="give a DecodeSetting alone"):
        DecodeSetting.of(s, k=2)
    assert DecodeSetting.of(s) is s


def test_cache_spec_reads_semicolons():
    assert cache_spec("dual:look_back=16;look_ahead=16") == "dual:look_back=16,look_ahead=16"
    assert cache_spec(None) is None and cache_spec("dual") == "dual"
