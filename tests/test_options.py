"""The shared option validators: each error names the option, the valid range and the value."""

import math

import pytest

from dllm.options import check_bool, check_choice, check_int, check_number, check_optional_int, check_unit


@pytest.mark.parametrize("value", [0, 1, 0.5])
def test_unit_accepts_the_closed_interval(value):
    check_unit("p", value)


@pytest.mark.parametrize("value,kw,match", [
    (1.5, {}, r"p must be a number in \[0, 1\], got 1.5"),
    (0, {"low_open": True}, r"p must be a number in \(0, 1\], got 0"),
    (1.0, {"high_open": True}, r"p must be a number in \[0, 1\), got 1.0"),
    (True, {}, r"got True"),
    (float("nan"), {}, r"got nan"),
    ("0.5", {}, r"got '0.5'"),
])
def test_unit_rejects(value, kw, match):
    with pytest.raises(ValueError, match=match):
        check_unit("p", value, **kw)


def test_number_bounds_and_finiteness():
    check_number("g", math.inf, low=0)
    with pytest.raises(ValueError, match=r"g must be a finite number >= 0, got inf"):
        check_number("g", math.inf, low=0, finite=True)
    with pytest.raises(ValueError, match=r"f must be a number > 0, got 0"):
        check_number("f", 0, low=0, low_open=True)


def test_int_bool_choice_optional():
    check_int("k", 3, 1)
    for bad in (0, 2.0, True, "3"):
        with pytest.raises(ValueError, match=r"k must be an integer >= 1"):
            check_int("k", bad, 1)
    with pytest.raises(ValueError, match=r"k must be an integer in \[1, 4\], got 5"):
        check_int("k", 5, 1, high=4)
    check_optional_int("refresh", None, 1)
    with pytest.raises(ValueError, match=r"refresh must be an integer >= 1 \(or None\), got 0"):
        check_optional_int("refresh", 0, 1)
    with pytest.raises(ValueError, match=r"flag must be True or False, got 1"):
        check_bool("flag", 1)
    with pytest.raises(ValueError, match=r"mode must be one of 'a', 'b', got 'c'"):
        check_choice("mode", "c", ("a", "b"))
