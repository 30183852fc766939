"""Random draws with one generator per row: a row of a batch draws exactly what it draws alone.

``generate(seed=[s0, s1, ...])`` gives each row its own ``torch.Generator`` (``RowGenerators``).
Every random draw of a sampler goes through the functions here; with a ``RowGenerators`` they draw
row by row, each row from its own generator and in the shape it would have alone:

- a tensor over the query columns ([B, Q, ...] with ``query_start`` given) loses the row's left
  padding: alone, the row's canvas has no padding, so a query that starts inside the padding is
  narrower by the columns it covers there (``RowGenerators.cut``); those columns get a filler
  (0.5 for uniforms), never read since padding is never a mask;
- a tensor over block-window columns ([B, W, ...]) is the same shape alone: row r draws ``[W, ...]``;
- a flat draw over rows of several batch rows (Dream's masked positions, a [B*W, V] multinomial)
  is split into the batch rows' consecutive segments;
- a row whose block is done while others still step (adaptive samplers: rows fill a block at
  different steps) draws nothing until the next block (``RowGenerators.live``, set by the block loop
  from its test of the block's masks): alone it runs no such step, so it starts the next block with
  its generator where it would be alone. Its draws there get a filler, never read (it has no mask).

With a plain ``torch.Generator`` (or None: the global one) every function is the one torch call it
replaces, so seeded single-generator decodes keep their streams. Draws read the per-row segment
sizes on the host only where the sampler already did (Dream's masked rows).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Optional, Sequence, Union

import torch


@dataclass(frozen=True)
class RowGenerators:
    """One generator per batch row, and each row's left padding on the canvas (columns)."""

    generators: tuple[torch.Generator, ...]
    pads: tuple[int, ...]
    # the rows that draw at this step (None: every row). Alone, a row's adaptive block loop stops once
    # its block is done; in a batch it steps on with the other rows, and must not draw there
    live: Optional[tuple[bool, ...]] = None

    def __post_init__(self) -> None:
        if len(self.generators) != len(self.pads) or not self.generators:
            raise ValueError(f"RowGenerators needs one generator and one pad per row, got {len(self.generators)} "
                             f"generators and {len(self.pads)} pads")
        if self.live is not None and len(self.live) != len(self.generators):
            raise ValueError(f"RowGenerators.live needs a flag per row, got {len(self.live)} for "
                             f"{len(self.generators)} rows")

    def only(self, live: Optional[Sequence[bool]]) -> "RowGenerators":
        """The same generators, drawing for the rows flagged in ``live`` only (None: every row); the
        others get the draw functions' filler, and their generators do not move."""
        return dataclasses.replace(self, live=None if live is None else tuple(bool(x) for x in live))

    def streams(self) -> list[Optional[torch.Generator]]:
        """Each row's generator, None for a row that draws nothing at this step (``live``)."""
        if self.live is None:
            return list(self.generators)
        return [g if on else None for g, on in zip(self.generators, self.live)]

    @classmethod
    def seeded(cls, seeds: Sequence[int], pads: Sequence[int], device: torch.device) -> "RowGenerators":
        return cls(tuple(torch.Generator(device=device).manual_seed(int(s)) for s in seeds), tuple(pads))

    def __len__(self) -> int:
        return len(self.generators)

    @property
    def device(self) -> torch.device:
        return self.generators[0].device

    def cut(self, row: int, query_start: Optional[int]) -> int:
        """Leading columns of a query starting at canvas column ``query_start`` that lie in ``row``'s
        left padding (0 for a window tensor: ``query_start`` None)."""
        return 0 if query_start is None else max(0, self.pads[row] - query_start)

    def check_rows(self, n: int, what: str) -> None:
        if n != len(self.generators):
            raise ValueError(f"per-row seeds: {what} has {n} rows for a batch of {len(self.generators)} "
                             f"(one seed per prompt); this sampler's draws are not row-separable")


@dataclass(frozen=True)
class WindowRows(RowGenerators):
    """The per-row generators of a running decode's rows (``dllm.engine.running``), whose current
    blocks end one shared window: row r's block is the last ``widths[r]`` of the window's ``window``
    columns. A draw over the window gives each row what it draws alone over its block (``cut``: the
    window's columns left of it get the filler); a draw over the query (``chunked.window_uniforms``)
    gives the block's part of what the row draws alone over its whole canvas, ``queries[r]`` =
    (its query length, its block's start and end in it). ``pads`` is ``cut`` of every row."""

    widths: tuple[int, ...] = ()
    queries: tuple[tuple[int, int, int], ...] = ()
    window: int = 0

    def __post_init__(self) -> None:
        super().__post_init__()
        n = len(self.generators)
        if len(self.widths) != n or len(self.queries) != n or not all(0 < w <= self.window for w in self.widths):
            raise ValueError(f"WindowRows needs a width in [1, {self.window}] and a query per row, got "
                             f"{self.widths} and {self.queries} for {n} rows")

    def cut(self, row: int, query_start: Optional[int]) -> int:
        return self.window - self.widths[row]


Generator = Union[torch.Generator, RowGenerators, None]


def per_row(generator: Generator) -> bool:
    return isinstance(generator, RowGenerators)


def rand(shape: Sequence[int], generator: Generator, device: torch.device, dtype: torch.dtype = torch.float32,
         query_start: Optional[int] = None) -> torch.Tensor:
    """``torch.rand(shape)``; per row: row r draws ``shape[1:]`` (without its padding columns of dim 1
    when ``query_start`` is given; those hold 0.5)."""
    if not isinstance(generator, RowGenerators):
        return torch.rand(tuple(shape), dtype=dtype, generator=generator, device=device)
    generator.check_rows(shape[0], f"a draw of shape {tuple(shape)}")
    out = torch.full(tuple(shape), 0.5, dtype=dtype, device=device)
    for r, g in enumerate(generator.streams()):
        if g is not None:
            c = generator.cut(r, query_start)
            out[r, c:] = torch.rand((shape[1] - c, *shape[2:]), dtype=dtype, generator=g, device=device)
    return out


def rand_segments(lengths: Sequence[int], generator: Generator, device: torch.device,
                  dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """``torch.rand(sum(lengths))`` for a flat tensor whose consecutive segments belong to the batch
    rows in order; per row: segment r from generator r."""
    if not isinstance(generator, RowGenerators):
        return torch.rand(int(sum(lengths)), dtype=dtype, generator=generator, device=device)
    generator.check_rows(len(lengths), "a flat draw")
    return torch.cat([torch.full((int(n),), 0.5, dtype=dtype, device=device) if g is None else
                      torch.rand(int(n), dtype=dtype, generator=g, device=device)
                      for n, g in zip(lengths, generator.streams())])


def race(probs: torch.Tensor, num_samples: int, generator: Optional[torch.Generator], replacement: bool
         ) -> torch.Tensor:
    """``torch.multinomial(probs [N, V], num_samples, replacement, generator)`` without its host reads.

    For one sample, or samples without replacement, torch draws ``q = empty_like(probs).exponential_(1)``
    and takes the arg-max (top-k) of ``probs / q`` (aten ``multinomial_out``'s fast path), after reading
    two sanity checks of ``probs`` back to the host (finite and non-negative; no row summing to 0): a
    sync per call on CUDA. This is that path without the checks, the same draws from the same generator
    (tests/samplers/test_row_seeds.py compares it with torch's); the callers' probabilities are softmax
    outputs, which pass the checks. Samples with replacement (another algorithm) stay torch's. (The
    speculative loop's ``dllm.drafters.verify.sample_categorical`` races too, in float32 with the zero
    draw clamped: other draws than torch's, which it need not match.)"""
    if replacement and num_samples > 1:
        return torch.multinomial(probs, num_samples, replacement=True, generator=generator)
    q = torch.empty_like(probs).exponential_(1, generator=generator)  # [N, V]
    ratio = probs / q
    if num_samples == 1:
        return ratio.argmax(dim=-1, keepdim=True)  # [N, 1]
    return torch.topk(ratio, num_samples).indices  # [N, k]


def multinomial(probs: torch.Tensor, num_samples: int, generator: Generator, *, replacement: bool = False,
                segments: Optional[Sequence[int]] = None) -> torch.Tensor:
    """``torch.multinomial(probs [N, V], num_samples)`` (``race``: no host read); per row: the N rows split
    into the batch rows' consecutive segments (``segments``; default N / B each), each drawn from its row's
    generator."""
    if not isinstance(generator, RowGenerators):
        return race(probs, num_samples, generator, replacement)
    b = len(generator)
    if segments is None:
        if probs.shape[0] % b:
            generator.check_rows(probs.shape[0], "a multinomial's distributions")
        segments = [probs.shape[0] // b] * b
    generator.check_rows(len(segments), "a multinomial's segments")
    parts = [race(p, num_samples, g, replacement) if g is not None else p.topk(num_samples).indices  # filler
             for p, g, n in zip(probs.split([int(n) for n in segments]), generator.streams(), segments) if n]
    if not parts:
        return torch.empty((0, num_samples), dtype=torch.long, device=probs.device)
    return torch.cat(parts)


def fresh_seed() -> int:
    """A seed for a row given none, from the global generator (so ``torch.manual_seed`` fixes it)."""
    return int(torch.randint(0, 2**62, ()))


def make_generator(seed: Union[int, Sequence[Optional[int]], None], rows: list[list[int]],
                   device: torch.device) -> Generator:
    """``generate``'s generator: None (the global one), one seeded ``torch.Generator``, or per-row
    generators (``seed`` a list, one per row, checked by ``DecodeSettings.resolve``; a None entry gets
    a fresh seed from the global generator) with each row's left padding, so a row draws what it
    draws alone."""
    if not isinstance(seed, (list, tuple)):
        return None if seed is None else torch.Generator(device=device).manual_seed(seed)
    fresh = [fresh_seed() if s is None else s for s in seed]
    longest = max(len(r) for r in rows)
    return RowGenerators.seeded(fresh, [longest - len(r) for r in rows], device)


__all__ = ["Generator", "RowGenerators", "WindowRows", "fresh_seed", "make_generator", "multinomial", "per_row", "rand",
           "rand_segments"]
