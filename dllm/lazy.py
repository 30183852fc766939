"""Names a package exports but imports only on first use (PEP 562 module ``__getattr__``), so that
``import dllm`` or ``import dllm.drafters`` stays cheap and loads no torch-heavy module it does not need.

    __getattr__, __dir__ = lazy_exports(__name__, {"Plan": ("dllm.drafters.plan", "Plan"), ...})
"""

from __future__ import annotations

import importlib
from typing import Any, Callable, Mapping, Union

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
