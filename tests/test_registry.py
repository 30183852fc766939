import pytest

from dllm.registry import Registry, UnknownNameError


def test_register_alias_and_lookup():
    reg = Registry("widget")

    @reg.register("alpha", aliases=("a",))
    class Alpha:
        """First widget. More text."""

    assert reg.get("alpha") is Alpha and reg.get("a") is Alpha
    assert reg.entry("a").description == "First widget. More text."
    assert reg.names() == ["alpha"] and reg.names(aliases=True) == ["a", "alpha"]
    assert "a" in reg and "b" not in reg


def test_unknown_name_lists_valid_names():
    reg = Registry("widget")
    reg.add("alpha", 1)
    reg.add("beta", 2)
    with pytest.raises(UnknownNameError, match=r"Unknown widget 'gamma'\. Valid widgets: alpha, beta"):
        reg.get("gamma")


def test_set_alias_and_overwrite_warns():
    reg = Registry("widget")
    reg.add("alpha", 1)
    reg.set_alias("best", "alpha")
    assert reg.get("best") == 1
    with pytest.warns(UserWarning, match="registered again"):
        reg.add("alpha", 2)
    assert reg.get("alpha") == 2


def test_public_api_is_lazy_and_complete():
    import dllm

    names = [n for n, _ in dllm.list_samplers()]
    assert {"low_confidence", "threshold", "ssd", "lopa"} <= set(names)
    caches = dllm.list_caches()
    assert {"none", "prefix", "dual", "window"} <= {c if isinstance(c, str) else c[0] for c in caches}
    assert callable(dllm.load) and callable(dllm.generate)
    with pytest.raises(AttributeError):
        dllm.not_a_thing
