"""Names a package exports but imports only on first use (PEP 562 module ``__getattr__``), so that
``import dllm`` or ``import dllm.drafters`` stays cheap and loads no torch-heavy module it does not need.

    __getattr__, __dir__ = lazy_exports(__name__, {"Plan": ("dllm.drafters.plan", "Plan"), ...})
"""

from __future__ import annotations

import contextlib
import importlib
import importlib.util
import io
import logging
import sys
import warnings
from typing import Any, Callable, Iterator, Mapping, Union

Target = Union[str, tuple[str, str]]  # "submodule" (of the package, same attribute name) or (module, attribute)


def lazy_exports(package: str, table: Mapping[str, Target]) -> tuple[Callable[[str], Any], Callable[[], list[str]]]:
    """``(__getattr__, __dir__)`` for ``package``: a name of ``table`` is imported when first asked for
    and then kept in the package's namespace; any other name is the usual AttributeError."""

    def resolve(name: str) -> Any:
        target = table.get(name)
        if target is None:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        module, attr = (f"{package}.{target}", name) if isinstance(target, str) else target
        value = getattr(importlib.import_module(module), attr)
        setattr(importlib.import_module(package), name, value)  # resolved once
        return value

    def listing() -> list[str]:
        return sorted(set(vars(importlib.import_module(package))) | set(table))

    return resolve, listing


# loggers that report, at import, compiled kernels this machine cannot load (torchao's CUDA-only
# extensions) and a deprecation inside torch's pytree registry: noise for a run that does not use them
NOISY_LOGGERS = ("torchao", "torch.utils._pytree")


@contextlib.contextmanager
def quiet_loggers(names: tuple[str, ...] = NOISY_LOGGERS) -> Iterator[None]:
    """Raise the named loggers to ERROR for the duration (their levels restored after)."""
    loggers = [logging.getLogger(n) for n in names]
    levels = [lg.level for lg in loggers]
    for lg in loggers:
        lg.setLevel(logging.ERROR)
    try:
        yield
    finally:
        for lg, level in zip(loggers, levels):
            lg.setLevel(level)


@contextlib.contextmanager
def quiet_import_chatter() -> Iterator[None]:
    """Import-time chatter of optional libraries kept quiet: their loggers, stdout/stderr prints and
    deprecation warnings (``torch.jit.script_method`` inside torchao)."""
    sink = io.StringIO()
    with contextlib.redirect_stdout(sink), contextlib.redirect_stderr(sink), quiet_loggers(), \
            warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        yield


def preimport_quietly(module: str) -> None:
    """Import an optional package now, quietly, if it is installed and not imported yet, so that a
    library importing it later (transformers imports torchao when it builds a model) prints nothing."""
    if module in sys.modules or importlib.util.find_spec(module) is None:
        return
    with quiet_import_chatter():
        try:
            importlib.import_module(module)
        except Exception:  # a broken optional package: its importer will report it when it matters
            pass

