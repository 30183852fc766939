"""Translation between official checkpoint key names and the shared transformer's parameter names.

Each family (``llada.py``, ``dream.py``) declares one ``KeyMap``: a table of model-level names, a
per-layer prefix with ``{i}`` for the layer index, and a table of per-layer suffixes.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Optional

# Internal names of dllm.models.core.transformer.Transformer parameters (the right-hand side of maps).
INTERNAL_LAYER_PREFIX = "layers.{i}."


def _prefix_regex(template: str) -> re.Pattern[str]:
    """'model.layers.{i}.' -> ^model\\.layers\\.(\\d+)\\.(.+)$"""
    head, tail = template.split("{i}")
    return re.compile("^" + re.escape(head) + r"(\d+)" + re.escape(tail) + "(.+)$")


@dataclass(frozen=True)
class KeyMap:
    """Official <-> internal names.

    global_names: (official, internal) pairs for model-level tensors.
    layer_prefix: official per-layer prefix containing ``{i}``.
    layer_names: (official suffix, internal suffix) pairs inside a layer.
    ignored: regexes of official keys that are skipped when loading (e.g. stored RoPE buffers).
    """

    global_names: tuple[tuple[str, str], ...]
    layer_prefix: str
    layer_names: tuple[tuple[str, str], ...]
    ignored: tuple[str, ...] = ()
    _official_re: re.Pattern[str] = field(init=False, repr=False, compare=False)
    _internal_re: re.Pattern[str] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        if "{i}" not in self.layer_prefix:
            raise ValueError(f"KeyMap.layer_prefix must contain '{{i}}', got {self.layer_prefix!r}")
        object.__setattr__(self, "_official_re", _prefix_regex(self.layer_prefix))
        object.__setattr__(self, "_internal_re", _prefix_regex(INTERNAL_LAYER_PREFIX))

    def to_official(self, internal: str) -> str:
        """Internal parameter name -> official key; KeyError for a name the map does not know."""
        for off, intern in self.global_names:
            if intern == internal:
                return off
        m = self._internal_re.match(internal)
        if m is not None:
            for off, intern in self.layer_names:
                if intern == m.group(2):
                    return self.layer_prefix.format(i=m.group(1)) + off
        raise KeyError(f"no official name for internal parameter {internal!r}")

    def to_internal(self, official: str) -> Optional[str]:
        """Official key -> internal parameter name, or None when the key is not part of the format."""
        for off, intern in self.global_names:
            if off == official:
                return intern
        m = self._official_re.match(official)
        if m is not None:
            for off, intern in self.layer_names:
                if off == m.group(2):
                    return INTERNAL_LAYER_PREFIX.format(i=m.group(1)) + intern
        return None

    def is_ignored(self, official: str) -> bool:
        return any(re.search(p, official) for p in self.ignored)
