"""Bad cache settings fail early with errors that name the value and what is valid."""

import pytest

import dllm
from dllm.cache import DualCache, WindowCache, list_caches, make_cache
from dllm.registry import parse_spec as parse_cache_spec
from dllm.models import tiny
from dllm.models.oracle import OracleLM


@pytest.fixture(scope="module")
def model():
    return tiny("llada", seed=0)


@pytest.mark.parametrize("cache,exc,match", [
    ("nope", ValueError, r"Unknown cache policy 'nope'\. Valid cache policies: auto, block, drift, dual, none, prefix, subblock, window"),
    ("window:buffer=2", ValueError, r"window buffer=2 is smaller than block_length=4"),
    ("prefix:refresh=0", ValueError, r"refresh must be an integer >= 1 .*got 0"),
    ("dual:refresh=-2", ValueError, r"refresh must be an integer >= 1 .*got -2"),
    ("window:refresh=1.5", ValueError, r"refresh must be an integer >= 1 .*got 1.5"),
    ("dual:look_back=-1", ValueError, r"look_back must be an integer >= 0, got -1"),
    ("window:buffer=0", ValueError, r"buffer must be an integer >= 1, got 0"),
    ("dual:refrsh=2", TypeError, r"Unknown option\(s\) 'refrsh' for cache policy 'dual'\. Valid options: refresh"),
    ("none:refresh=2", TypeError, r"Unknown option\(s\) 'refresh' for cache policy 'none'\. Valid options: \(none\)"),
    ("dual:refresh", ValueError, r"cannot parse cache policy option .refresh."),
    ({"refresh": 2}, ValueError, r"needs a 'name' key"),
    (3, TypeError, r"cache policy must be a registered name"),
])
def test_bad_cache_settings(model, cache, exc, match):
    with pytest.raises(exc, match=match):
        dllm.generate(model, [[5, 6, 7]], gen_length=8, block_length=4, cache=cache)


def test_refresh_true_is_not_an_integer():
    with pytest.raises(ValueError, match="got True"):
        DualCache(refresh=True)


def test_instance_with_options_is_rejected():
    with pytest.raises(TypeError, match="together with a cache policy instance"):
        make_cache(DualCache(), refresh=2)


def test_model_without_attention_cannot_cache():
    with pytest.raises(NotImplementedError, match="OracleLM has no KV cache.*cache='none'"):
        make_cache("prefix").allocate(OracleLM(), 1, 8)


def test_spec_forms_agree():
    assert parse_cache_spec("dual:refresh=4, look_ahead=8") == ("dual", {"refresh": 4, "look_ahead": 8})
    assert parse_cache_spec("window:buffer=none") == ("window", {"buffer": None})
    a = make_cache("dual:refresh=4")
    b = make_cache({"name": "dual", "refresh": 4})
    c = make_cache("dual", refresh=4)
    assert a.config == b.config == c.config == DualCache(refresh=4).config
    assert make_cache(WindowCache(buffer=8)).config.buffer == 8
    assert {name for name, _ in list_caches()} == {"none", "prefix", "dual", "window", "drift", "auto", "block",
                                                     "subblock"}
