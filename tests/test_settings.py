"""``DecodeSettings.resolve``: every refused setting raises ``SettingError`` naming its field, and
``generate`` and the server refuse it with the same message (the server's ``param`` is that field,
never found by reading the message)."""

from __future__ import annotations

import pytest

import dllm
from dllm.options import SettingError
from dllm.serve.backends.base import BadRequest
from dllm.serve.backends.diffusion import DiffusionBackend
from dllm.serve.backends.jobs import JobRequest
from dllm.settings import DecodeSettings

PROMPT = "[BOS] sort D A C B [SEP]"

# (settings, gen_length, the field, the request's param)
BAD = [
    (DecodeSettings(sampler="nope"), 8, "sampler", "sampler"),
    (DecodeSettings(sampler="threshold:threshold=2.0"), 8, "sampler", "sampler"),
    (DecodeSettings.of(sampler="threshold", options={"threshold": 2.0}), 8, "threshold", "sampler_options.threshold"),
    (DecodeSettings.of(sampler="threshold", options={"treshold": 0.5}), 8, "sampler_options", "sampler_options"),
    (DecodeSettings.of(sampler="low_confidence", options={"k": 2}), 8, "k", "sampler_options"),
    (DecodeSettings(sampler="low_confidence:k=2"), 8, "k", "sampler_options"),
    (DecodeSettings.of(cache="dual", options={"refresh": 4}), 8, "refresh", "sampler_options.refresh"),
    (DecodeSettings(cache="nope"), 8, "cache", "cache"),
    (DecodeSettings(cache="block"), 8, "cache", "cache"),
    # a bad option value inside the cache spec is the cache's (it was the option's name, served as "sampler")
    (DecodeSettings(cache="dual:refresh=0"), 8, "cache", "cache"),
    (DecodeSettings(cache="dual:look_back=-1"), 8, "cache", "cache"),
    (DecodeSettings(cache="window:buffer=0"), 8, "cache", "cache"),
    (DecodeSettings(cache="drift:threshold=0"), 8, "cache", "cache"),
    (DecodeSettings(block_length=9), 8, "block_length", "block_length"),
    (DecodeSettings(steps=100), 8, "steps", "steps"),
    (DecodeSettings(block_length=4, steps=3), 8, "steps", "steps"),
    (DecodeSettings(temperature=-1.0), 8, "temperature", "temperature"),
    (DecodeSettings(sampler="fast", temperature=1.0), 8, "temperature", "temperature"),
    (DecodeSettings(seed=-3), 8, "seed", "seed"),
    (DecodeSettings(seed=[1, 2]), 8, "seed", "seed"),
    (DecodeSettings(), 0, "gen_length", "max_tokens"),
    # options that only the block size refuses, before any forward (``Sampler.block_refusal``)
    (DecodeSettings.of(sampler="sdar", block_length=4, options={"denoising_steps": 8}), 8, "denoising_steps",
     "sampler_options.denoising_steps"),
    (DecodeSettings(sampler="sdar:denoising_steps=8", block_length=4), 8, "denoising_steps", "sampler"),
    (DecodeSettings.of(sampler="fastdllm_v2", block_length=4, options={"small_block_size": 3}), 8, "small_block_size",
     "sampler_options.small_block_size"),
    # sizes no call can use: refused, never allocated (an int past int64, a layer list of 10**9)
    (DecodeSettings.of(sampler="threshold", options={"schedule_steps": 10**30}), 8, "schedule_steps",
     "sampler_options.schedule_steps"),
    (DecodeSettings.of(sampler="credit", options={"alpha": 10**30}), 8, "alpha", "sampler_options.alpha"),
    (DecodeSettings.of(sampler="dawn", options={"layers": 10**9}), 8, "layers", "sampler_options.layers"),
]


@pytest.fixture(scope="module")
def llada():
    return dllm.load("tiny-llada")


@pytest.fixture(scope="module")
def engine(llada):
    eng = DiffusionBackend(llada, name="tiny-llada")
    yield eng
    eng.close()


@pytest.mark.parametrize("settings,gen_length,field,param", BAD)
def test_every_entry_point_names_the_field_with_one_message(llada, engine, settings, gen_length, field, param):
    rows = [list(engine.encode_prompt(PROMPT))]
    with pytest.raises(SettingError) as resolved:
        settings.resolve(llada, rows, gen_length)
    assert resolved.value.field == field
    with pytest.raises(SettingError) as generated:
        dllm.generate(llada, PROMPT, gen_length=gen_length, **settings.generate_kwargs())
    assert (generated.value.field, str(generated.value)) == (field, str(resolved.value))
    if gen_length >= 1:  # the server checks max_tokens itself first
        with pytest.raises(BadRequest) as served:
            engine.submit(JobRequest(engine.encode_prompt(PROMPT), gen_length, settings))
        assert (served.value.param, str(served.value)) == (param, str(resolved.value))


def test_errors_keep_their_kind():
    """A SettingError is a ValueError; refused names and types are KeyError / TypeError as well."""
    model = dllm.load("tiny-llada")
    with pytest.raises(KeyError):
        dllm.generate(model, PROMPT, gen_length=4, sampler="nope")
    with pytest.raises(TypeError):
        dllm.generate(model, PROMPT, gen_length=4, sampler=3)
    with pytest.raises(TypeError, match="steps = gen_length / k"):
        dllm.generate(model, PROMPT, gen_length=4, k=2)


def test_good_settings_resolve_to_the_call_generate_makes(llada):
    s = DecodeSettings.of(sampler="threshold", cache="dual", block_length=4, options={"threshold": 0.8})
    r = s.resolve(llada, [[1, 2, 3]], 8)
    assert r.sampler.name == "threshold" and r.sampler.config.threshold == 0.8
    assert r.policy.name == "dual" and r.plan.block_length == 4 and len(r.plan.blocks) == 2
    assert s == DecodeSettings.of(sampler="threshold", cache="dual", block_length=4, options={"threshold": 0.8})


def test_a_schedule_longer_than_the_block_is_the_block_s():
    """``threshold:schedule_steps=S``: S past the block's width decodes as S = the width (its most
    steps), without a [B, S] table."""
    model = dllm.load("tiny-llada")
    kw = dict(gen_length=8, block_length=4, sampler="threshold")
    huge = dllm.generate(model, PROMPT, schedule_steps=10**9, **kw)
    assert huge.texts == dllm.generate(model, PROMPT, schedule_steps=4, **kw).texts
    assert huge.nfe == dllm.generate(model, PROMPT, schedule_steps=4, **kw).nfe


def test_a_cache_on_a_model_without_attention_is_a_setting_error():
    """A KV cache on a model with no attention layers (an oracle) is refused by ``resolve``, naming the
    field, before anything runs (it was a NotImplementedError from the buffers' allocation)."""
    from dllm import tasks
    from dllm.models.oracle import OracleLM, oracle_prompts

    model = OracleLM()
    rows = oracle_prompts(tasks.test_split("replace_random", 4, 8)[:1])
    for cache in ("prefix", "dual", "window", "drift", "auto"):
        with pytest.raises(SettingError, match="no attention layers.*cache='none'") as info:
            DecodeSettings(cache=cache).resolve(model, rows, 5)
        assert info.value.field == "cache"
        with pytest.raises(SettingError, match="no attention layers") as info:
            dllm.generate(model, rows, gen_length=5, steps=5, cache=cache)
        assert info.value.field == "cache"
    assert dllm.generate(model, rows, gen_length=5, steps=5, cache="none").nfe == 5
