import subprocess
import sys

import pytest

from dllm.registry import Registry, UnknownNameError, format_spec, parse_spec


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


def test_public_api_is_complete():
    import dllm

    names = [n for n, _ in dllm.list_samplers()]
    assert {"low_confidence", "threshold", "ssd", "lopa"} <= set(names)
    caches = dllm.list_caches()
    assert {"none", "prefix", "dual", "window"} <= {c if isinstance(c, str) else c[0] for c in caches}
    assert callable(dllm.load) and callable(dllm.generate)
    with pytest.raises(AttributeError, match="has no attribute 'not_a_thing'"):
        dllm.not_a_thing


@pytest.mark.slow
def test_import_dllm_is_lazy():
    """``import dllm`` loads no torch and no subpackage (only ``dllm.lazy``, its loader); the first
    attribute access loads its own."""
    code = (
        "import sys, dllm\n"
        "heavy = sorted(m for m in sys.modules if m == 'torch' or (m.startswith('dllm.') and m != 'dllm.lazy'))\n"
        "assert heavy == [], heavy\n"
        "dllm.list_caches\n"
        "assert 'dllm.cache' in sys.modules and 'dllm.engine' not in sys.modules\n"
        "print('ok')\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0 and out.stdout.strip() == "ok", out.stderr


# ---- one spec grammar ----------------------------------------------------------------------------

@pytest.mark.parametrize("spec,expected", [
    ("dual", ("dual", {})),
    ("dual:refresh=4, look_ahead=8", ("dual", {"refresh": 4, "look_ahead": 8})),
    ("window:buffer=none", ("window", {"buffer": None})),
    ("threshold:threshold=0.8,stats=fused", ("threshold", {"threshold": 0.8, "stats": "fused"})),
    ("prophet:early_threshold=inf", ("prophet", {"early_threshold": float("inf")})),
    ("lopa:bonus=False,branches=3", ("lopa", {"bonus": False, "branches": 3})),
])
def test_parse_spec(spec, expected):
    assert parse_spec(spec) == expected
    name, options = expected
    assert parse_spec(format_spec(name, options)) == expected  # format_spec reads back


@pytest.mark.parametrize("spec,match", [
    ("dual:refresh", r"cannot parse spec option 'refresh'; expected key=value \(in 'dual:refresh'\)"),
    (":x=1", r"cannot parse spec ':x=1'; expected NAME or NAME:key=value"),
    ("dual:refresh=1,refresh=2", r"sets 'refresh' twice"),
])
def test_parse_spec_errors(spec, match):
    with pytest.raises(ValueError, match=match):
        parse_spec(spec)


def test_configurable_make_from_every_form():
    from dataclasses import dataclass

    from dllm.registry import Configurable

    @dataclass(frozen=True)
    class Cfg:
        size: int = 1
        name_: str = "x"

    class Base(Configurable):
        kind = "widget"

    reg = Registry("widget", base=Base)

    @reg.register_class("w", aliases=("ww",))
    class W(Base):
        Config = Cfg

    assert W.name == "w"
    assert reg.make("w:size=3").config == Cfg(3) == reg.make({"name": "ww", "size": 3}).config
    assert reg.make("w", size=4).config.size == 4 == reg.make({"name": "w"}, size=4).config.size
    assert reg.make("w:size=3", name_="y").config == Cfg(3, "y")  # keywords add to the spec's options
    # an option in both the spec (or mapping) and the keywords: an error naming both, no winner
    with pytest.raises(ValueError, match=r"widget option\(s\) given twice \('size': 3 in the spec 'w:size=3' "
                                         r"and 4 as a keyword\); give each option once"):
        reg.make("w:size=3", size=4)
    with pytest.raises(ValueError, match=r"'size': 3 in the mapping \{'name': 'w', 'size': 3\} and 4 as a keyword"):
        reg.make({"name": "w", "size": 3}, size=4)
    with pytest.raises(ValueError, match=r"'size': 3 in the spec 'w:size=3' and 4 as a keyword"):
        reg.make({"name": "w:size=3"}, size=4)
    inst = W(size=5)
    assert reg.make(inst) is inst and inst.spec == "w:size=5" and W().spec == "w"
    with pytest.raises(TypeError, match=r"Unknown option\(s\) 'colour' for widget 'w'\. Valid options: size, name_"):
        reg.make("w:colour=red")
    with pytest.raises(TypeError, match="together with a widget instance"):
        reg.make(inst, size=1)
    with pytest.raises(ValueError, match="a widget mapping needs a 'name' key"):
        reg.make({"size": 1})
    with pytest.raises(TypeError, match=r"widget must be a registered name, a spec string .* got int 3"):
        reg.make(3)
    with pytest.raises(TypeError, match=r"config of widget 'w' must be a Cfg"):
        W(config={"size": 2})


def test_nested_spec_in_parentheses_round_trips():
    from dllm.registry import format_spec, parse_spec

    name, opts = parse_spec("fast:cache=(dual:look_back=16,look_ahead=16),branches=4")
    assert (name, opts) == ("fast", {"cache": "dual:look_back=16,look_ahead=16", "branches": 4})
    assert parse_spec(format_spec(name, opts)) == (name, opts)
    assert parse_spec("fast:cache=dual:look_back=16") == ("fast", {"cache": "dual:look_back=16"})
    for bad in ("fast:cache=(dual:look_back=16", "fast:cache=dual)"):
        with pytest.raises(ValueError, match="unbalanced"):
            parse_spec(bad)
