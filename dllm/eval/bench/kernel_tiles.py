"""The Triton attention kernel at other tile shapes and warps: ``dllm bench kernels --tiles``.

The kernel's launch settings (``BLOCK_M`` query rows and ``BLOCK_N`` keys per tile, ``num_warps``) are
first guesses, and what a tile costs on a GPU is for a GPU's timing to say: compiled for sm_90 here
(``benchmarks/results/kernel-compile.txt``, its last table) the choices differ in registers, shared
memory and so in blocks per SM, not in what they compute. Each ``Tile`` is one more backend row of
``dllm.eval.bench.kernels`` named ``triton[MxNwW]`` (the default, 32 x 64 with 4 warps up to head
dim 128, is the row ``triton``), timed on the same inputs with its error against the reference.
"""

from __future__ import annotations

import functools
import re
from dataclasses import dataclass
from typing import Any, Callable, Optional, Sequence

import torch

_NAME = re.compile(r"^triton\[(\d+)x(\d+)w(\d+)\]$")


@dataclass(frozen=True)
class Tile:
    """One launch setting of the attention kernel: ``block_m`` x ``block_n`` tiles, ``num_warps`` warps."""

    block_m: int
    block_n: int
    num_warps: int

    def __post_init__(self) -> None:
        for name in ("block_m", "block_n", "num_warps"):
            value = getattr(self, name)
            low = 1 if name == "num_warps" else 16
            if not isinstance(value, int) or value < low or value & (value - 1):
                raise ValueError(f"Tile.{name} must be a power of two >= {low}, got {value!r}")

    @property
    def name(self) -> str:
        return f"triton[{self.block_m}x{self.block_n}w{self.num_warps}]"

    @classmethod
    def parse(cls, name: str) -> Optional["Tile"]:
        """The tile a backend name ``triton[MxNwW]`` names, else None."""
        m = _NAME.match(name)
        return None if m is None else cls(*(int(g) for g in m.groups()))


# the alternatives timed by --tiles (the default 32 x 64, 4 warps, is the row `triton`)
TILES = (Tile(16, 32, 4), Tile(16, 64, 4), Tile(32, 32, 4), Tile(32, 64, 8), Tile(64, 32, 4), Tile(64, 64, 4))


def tile_names(tiles: Sequence[Tile] = TILES) -> list[str]:
    return [t.name for t in tiles]


def tiled_attention(tile: Tile) -> Callable[..., tuple[torch.Tensor, None]]:
    """The ``triton`` attention backend's function (same signature) launched at ``tile``."""
    from dllm.kernels.triton.attention import triton_attention

    return functools.partial(triton_attention, block_m=tile.block_m, block_n=tile.block_n, num_warps=tile.num_warps)


def best_triton(rows: Sequence[dict[str, Any]]) -> Optional[dict[str, Any]]:
    """The fastest timed ``triton`` row of one attention shape's rows (the default or a tile), or None."""
    timed = [r for r in rows if r["backend"].startswith("triton") and r.get("ms")]
    return min(timed, key=lambda r: r["ms"]) if timed else None


__all__ = ["TILES", "Tile", "best_triton", "tile_names", "tiled_attention"]
