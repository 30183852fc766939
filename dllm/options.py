"""The option validators shared by every frozen ``Config`` (samplers, cache policies, tasks, training).

Each one raises ``SettingError`` (a ``ValueError``) naming the option, the valid range and the value
it got, so a bad ``generate(..., threshold=1.5)`` says ``threshold must be a number in (0, 1], got
1.5``, and the error's ``field`` is the option's name (the server answers with it as OpenAI's
``param``). Booleans are never numbers here (``True`` is not a threshold) and NaN is in no range.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any, Collection, Optional


class SettingError(ValueError):
    """A refused setting; ``field`` names it (an argument of ``generate``, a sampler or cache option)."""

    def __init__(self, field: Optional[str], message: str) -> None:
        super().__init__(message)
        self.field = field

    __str__ = Exception.__str__  # the message as given (a KeyError would quote it)


class SettingTypeError(SettingError, TypeError):
    """A refused setting of the wrong kind (a ``TypeError`` as well, for callers that catch that)."""


class SettingKeyError(SettingError, KeyError):
    """A refused name (an unknown sampler or cache; a ``KeyError`` as well)."""


def field_error(field: Optional[str], err: BaseException) -> SettingError:
    """``err`` (a ValueError, TypeError or KeyError) as a ``SettingError`` of ``field`` and of its own
    kind, its message kept; an error that already names a field keeps it."""
    if isinstance(err, SettingError):
        return err
    cls = (SettingKeyError if isinstance(err, KeyError) else SettingTypeError if isinstance(err, TypeError)
           else SettingError)
    return cls(field, str(err.args[0]) if isinstance(err, KeyError) and err.args else str(err))


INT64_MAX = 2**63 - 1  # the most an integer option may be: torch takes Python ints as int64


def is_number(value: Any) -> bool:
    """An int or float that is not a bool and not NaN (an int within int64: torch converts it)."""
    return (isinstance(value, (int, float)) and not isinstance(value, bool) and value == value
            and (isinstance(value, float) or -INT64_MAX <= value <= INT64_MAX))


def check_int(name: str, value: Any, low: int, *, high: Optional[int] = None, hint: str = "") -> None:
    """An integer (not a bool, not a float) in [low, high] (high: at most ``INT64_MAX``)."""
    ok = isinstance(value, int) and not isinstance(value, bool) and value >= low
    ok = ok and value <= (INT64_MAX if high is None else high)
    if not ok:
        huge = high is None and isinstance(value, int) and value > INT64_MAX
        rng = f"in [{low}, 2**63 - 1]" if huge else f">= {low}" if high is None else f"in [{low}, {high}]"
        raise SettingError(name, f"{name} must be an integer {rng}{hint}, got {value!r}")


def check_number(name: str, value: Any, *, low: Optional[float] = None, high: Optional[float] = None,
                 low_open: bool = False, high_open: bool = False, finite: bool = False, hint: str = "") -> None:
    """A real number in the interval given by ``low``/``high`` (closed unless ``*_open``)."""
    ok = is_number(value) and not (finite and math.isinf(value))
    if ok and low is not None:
        ok = value > low if low_open else value >= low
    if ok and high is not None:
        ok = value < high if high_open else value <= high
    if not ok:
        raise SettingError(name, f"{name} must be {_interval(low, high, low_open, high_open, finite)}{hint}, got {value!r}")


def check_unit(name: str, value: Any, *, low_open: bool = False, high_open: bool = False, hint: str = "") -> None:
    """A probability-like number in [0, 1] (ends open as asked)."""
    check_number(name, value, low=0.0, high=1.0, low_open=low_open, high_open=high_open, hint=hint)


def check_bool(name: str, value: Any) -> None:
    if not isinstance(value, bool):
        raise SettingError(name, f"{name} must be True or False, got {value!r}")


def check_choice(name: str, value: Any, choices: Collection[Any]) -> None:
    if value not in choices:
        raise SettingError(name, f"{name} must be one of {', '.join(map(repr, choices))}, got {value!r}")


def check_optional_int(name: str, value: Any, low: int, *, hint: str = "") -> None:
    """None or an integer >= low."""
    if value is not None:
        check_int(name, value, low, hint=hint + " (or None)")


def _interval(low, high, low_open, high_open, finite) -> str:
    kind = "a finite number" if finite else "a number"
    if low is not None and high is not None:
        return f"{kind} in {'(' if low_open else '['}{_fmt(low)}, {_fmt(high)}{')' if high_open else ']'}"
    if low is not None:
        return f"{kind} {'>' if low_open else '>='} {_fmt(low)}"
    if high is not None:
        return f"{kind} {'<' if high_open else '<='} {_fmt(high)}"
    return kind


def _fmt(v: float) -> str:
    return str(int(v)) if float(v).is_integer() else str(v)


class Overridable:
    """Mixin for a frozen dataclass (a training recipe): ``with_overrides(**kw)`` is a copy with the
    fields given a value replaced; None means "not given" (a command-line flag left out)."""

    def with_overrides(self, **kw: Any) -> Any:
        return dataclasses.replace(self, **{k: v for k, v in kw.items() if v is not None})


__all__ = ["Overridable", "SettingError", "SettingKeyError", "SettingTypeError", "field_error", "check_bool", "check_choice", "check_int", "check_number", "check_optional_int", "check_unit",
           "is_number"]
