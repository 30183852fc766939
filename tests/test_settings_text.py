"""``DecodeSettings.parse``: the evaluation commands' text form (sampler, options, cache, k, block
length) parsed into the one settings object, checked by the code ``generate`` runs."""

import pytest

import dllm
from dllm.options import SettingError
from dllm.settings import DecodeSettings, cache_spec, plan_steps, steps_for


def test_parse_splits_k_and_cache_from_the_sampler_options():
    s = DecodeSettings.parse("threshold:threshold=0.8,cache=(dual:look_back=16,look_ahead=16)")
    assert (s.name, s.sampler_options, s.cache, s.tokens_per_step) == ("threshold", {"threshold": 0.8},
                                                                       "dual:look_back=16,look_ahead=16", None)
    assert DecodeSettings.parse(s.spec) == s  # the spec round-trips (the label is not compared)
    s = DecodeSettings.parse("low_confidence:k=2,cache=dual:look_back=16;look_ahead=16", block_length=4)
    assert (s.tokens_per_step, s.cache, s.block_length, s.options) == (2, "dual:look_back=16,look_ahead=16", 4, ())
    assert s.label == "low_confidence:k=2,cache=dual:look_back=16;look_ahead=16"
    assert DecodeSettings.parse("fast") == DecodeSettings("fast")


def test_k_to_steps_is_written_once():
    assert steps_for(10, 4, 2) == 3 * 2  # 3 blocks (4, 4, 2) x ceil(4 / 2)
    assert steps_for(10, None, 3) == 4 and steps_for(10, 4, None) is None
    assert steps_for(5, 8, 1) == 5  # a block longer than the answer is the answer
    assert steps_for(4, 4, 8) == 1  # at most one step per position, at least one per block


def test_with_steps_turns_k_into_generates_steps(tiny_llada):
    s = DecodeSettings.parse("low_confidence:k=2", block_length=4)
    rows = [[5, 6, 7]]
    assert s.with_steps(tiny_llada, rows, 10).steps == steps_for(10, 4, 2) == 6
    assert s.with_steps(tiny_llada, rows, 10).tokens_per_step is None
    with pytest.raises(ValueError, match="call with_steps"):
        s.generate_kwargs()
    plan = s.resolve(tiny_llada, rows, 10).plan  # resolve plans the k's steps too
    assert sum(b[2] for b in plan.blocks) == 6 and plan_steps(plan, 2) == 6


@pytest.mark.parametrize("text,kw,match", [
    ("low_confidence:k=0", {}, "sampler spec 'low_confidence:k=0': k must be an integer >= 1, got 0"),
    ("low_confidence:k=2", {"k": 2}, "sets k=2 and k=2 is given too; give it once"),
    ("fast:cache=dual", {"cache": "prefix"}, "sets cache='dual' and cache='prefix' is given too"),
    ("threshold:0.8", {}, "cannot parse sampler spec option '0.8'"),
    ("fast", {"block_length": 0}, "block_length must be an integer >= 1 (or None), got 0"),
    ("threshold:threshold=0.9", {"options": {"threshold": 0.7}}, "sets ['threshold'] and they are given as options"),
])
def test_parse_errors_name_the_value(text, kw, match):
    with pytest.raises(ValueError, match=match.replace("(", r"\(").replace(")", r"\)").replace("[", r"\[")):
        DecodeSettings.parse(text, **kw)


@pytest.mark.parametrize("text,field,match", [
    ("threshold:k=2", "tokens_per_step", "k applies to fixed-step samplers only"),
    ("nope", "sampler", "Unknown sampler 'nope'"),
    ("fast:cache=dual:bogus=1", "cache", "bogus"),
    ("threshold:threshold=1.5", "threshold", "threshold must be a number in"),
])
def test_check_fails_before_decoding_with_the_field(text, field, match):
    with pytest.raises(ValueError, match=match) as info:
        DecodeSettings.parse(text).check()
    assert info.value.field == field
    DecodeSettings.parse("fast:cache=(dual:look_back=16,look_ahead=16)").check()


def test_check_gives_the_message_generate_gives(tiny_llada):
    """The text form and ``generate`` refuse a bad value with one message (the same code checks it)."""
    for text, kw in (("threshold:threshold=1.5", {"threshold": 1.5}), ("nope", {}), ("fast:cache=dual:bogus=1", {})):
        with pytest.raises(ValueError) as parsed:
            DecodeSettings.parse(text).check()
        name, cache = text.split(":")[0], text.partition("cache=")[2] or "none"
        with pytest.raises(ValueError) as called:
            dllm.generate(tiny_llada, [[5, 6, 7]], name, gen_length=4, cache=cache, **kw)
        assert str(parsed.value) == str(called.value)


def test_parse_takes_generates_other_keywords():
    s = DecodeSettings.parse("threshold", options={"threshold": 0.7, "cache": "dual", "temperature": 0.5})
    assert (s.name, s.sampler_options, s.cache, s.temperature) == ("threshold", {"threshold": 0.7}, "dual", 0.5)
    assert s.generate_kwargs() == {"sampler": "threshold", "cache": "dual", "block_length": None, "steps": None,
                                   "temperature": 0.5, "cfg_scale": 0.0, "seed": None, "threshold": 0.7}


@pytest.fixture(scope="module")
def tiny_llada():
    return dllm.load("tiny-llada")


def test_cache_spec_reads_semicolons():
    assert cache_spec("dual:look_back=16;look_ahead=16") == "dual:look_back=16,look_ahead=16"
    assert cache_spec(None) is None and cache_spec("dual") == "dual"


@pytest.mark.parametrize("text,k,match", [
    ("low_confidence", 0, "k must be an integer >= 1"),  # was a ZeroDivisionError
    ("threshold:k=2", None, "k applies to fixed-step samplers only"),  # was steps=4, then ignored
])
def test_with_steps_refuses_what_check_refuses(tiny_llada, text, k, match):
    settings = DecodeSettings.parse(text, k=k)
    with pytest.raises(SettingError, match=match) as info:
        settings.with_steps(tiny_llada, [[5, 6, 7]], 8)
    assert info.value.field == "tokens_per_step"
    assert DecodeSettings.parse("low_confidence", k=2).with_steps(tiny_llada, [[5, 6, 7]], 8).steps == 4


def test_spec_of_mapping_and_instance_settings_reads_back():
    """A sampler or cache given as a mapping or an instance has a spec that parses back to the same
    sampler and cache options (before: a TypeError from the spec parser, or an instance's repr)."""
    from dllm.cache import make_cache
    from dllm.samplers import make_sampler

    given = [DecodeSettings(sampler={"name": "threshold", "threshold": 0.8}, cache={"name": "dual", "refresh": 4}),
             DecodeSettings(sampler=make_sampler("threshold:threshold=0.7"), cache=make_cache("prefix"))]
    for settings in given:
        back = DecodeSettings.parse(settings.spec)
        assert make_sampler(back.sampler, **dict(back.options)).config == make_sampler(settings.sampler).config
        assert make_cache(back.cache).spec == make_cache(settings.cache).spec
