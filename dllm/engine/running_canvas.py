"""The canvas of a ``RunningDecode`` (``dllm.engine.running``): its rows and how they join, leave and move.

Every row's current block ends at the same canvas column E. A row that joins pads the others when
it reaches further left or right; rows that leave trim the columns no row needs; a row that moves
to its next block is rolled left by that block's width. Each change maps the canvas' [R, L]
tensors (ids, key-padding mask, positions, prompt columns) and, under a cache, the K/V buffers
[R, Hkv, L, hd] of every layer (new and padded columns are zeros: a padding key is masked, and
0 x a finite value is 0). ``RunningCanvas`` is a mixin of ``RunningDecode``: it reads and writes
the decode's attributes.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Hashable, Optional

import torch

from dllm.models.core.kv import KVCache
from dllm.samplers.draws import fresh_seed

Blocks = tuple[tuple[int, int, int], ...]  # an answer's blocks as ``generate`` plans them: (start, end, steps or 0)


@dataclass
class RunningRow:
    """One row of a ``RunningDecode``: its request, its place in the canvas and its progress."""

    tag: Hashable
    prompt_length: int
    gen_length: int
    blocks: Blocks  # the answer's blocks, in answer columns
    left: int = 0  # canvas column of the row's first token (its prompt's first)
    block: int = 0  # the current block
    block_step: int = 0  # steps taken in it
    steps: int = 0  # steps taken in all
    nfe: int = 0  # forwards it took part in (its step's, its variants')
    forwarded: int = 0  # tokens its own call would have forwarded so far
    carried: bool = False  # its next step reads the logits its last step's variants left (LoPA's reuse)
    generator: Optional[torch.Generator] = None  # its own draws (temperature > 0)

    @property
    def end(self) -> int:
        """The current block's end, in answer columns."""
        return self.blocks[self.block][1]

    @property
    def width(self) -> int:
        return self.blocks[self.block][1] - self.blocks[self.block][0]

    @property
    def answer(self) -> int:
        """Canvas column of the row's first answer position."""
        return self.left + self.prompt_length

    @property
    def own_block(self) -> tuple[int, int, int]:
        """(its own canvas' length, its current block's start and end in it): the row alone, unpadded."""
        return (self.prompt_length + self.gen_length, self.prompt_length + self.blocks[self.block][0],
                self.prompt_length + self.end)



class RunningCanvas:
    """The layout operations of ``RunningDecode`` (module docstring)."""

    def _apply(self, fn: Callable[[torch.Tensor], torch.Tensor],
               kv_fn: Optional[Callable[[torch.Tensor], torch.Tensor]] = None) -> None:
        """``fn`` of each [R, L] tensor of the canvas: ids, key-padding mask, positions, prompt columns;
        ``kv_fn`` of each K/V buffer [R, Hkv, L, hd] (None: ``fn``, which then takes rows only, and
        maps the carried logits [R, W, V] too)."""
        self.x, self.kpm, self.positions, self.prompt_mask = (
            fn(t) for t in (self.x, self.kpm, self.positions, self.prompt_mask))
        if kv_fn is None and self._carried is not None:
            self._carried = fn(self._carried)
        if self.kv is not None:
            kv_fn = kv_fn or fn
            self.kv = KVCache([kv_fn(t) for t in self.kv.k], [kv_fn(t) for t in self.kv.v])

    def _pad(self, left: int, right: int) -> None:
        """Pad every row ``left`` columns on the left and ``right`` on the right."""
        if left or right:
            pad = torch.nn.functional.pad
            self.x = pad(self.x, (left, right), value=self.pad_id)
            self.kpm = pad(self.kpm, (left, right), value=False)
            self.positions = pad(self.positions, (left, right), value=0)
            self.prompt_mask = pad(self.prompt_mask, (left, right), value=True)
            if self.kv is not None:  # zeros: a padding key is masked, and 0 x a finite value is 0
                self.kv = KVCache([pad(t, (0, 0, left, right)) for t in self.kv.k],
                                  [pad(t, (0, 0, left, right)) for t in self.kv.v])
            for row in self.rows:
                row.left += left
            self.block_end += left
            self._stale = True

    def _trim(self) -> None:
        """Drop the columns no row needs: left of every row, right of every answer."""
        if not self.rows:
            self.x = self.kpm = self.positions = self.prompt_mask = self._window = self.kv = self._carried = None
            self.block_end, self.state = 0, None
            return
        c0 = min(row.left for row in self.rows)
        c1 = self.block_end + max(row.gen_length - row.end for row in self.rows)
        if c0 or c1 < self.x.shape[1]:
            self._apply(lambda t: t[:, c0:c1], lambda t: t[:, :, c0:c1].contiguous())
            for row in self.rows:
                row.left -= c0
            self.block_end -= c0
            self._stale = True

    def _keep(self, keep: list[int]) -> None:
        """Only rows ``keep`` stay (one upload of their indices)."""
        self.rows = [self.rows[i] for i in keep]
        if keep:
            idx = torch.tensor(keep, device=self.device)
            self._apply(lambda t: t.index_select(0, idx))
        self._stale = True
        self._trim()

    def _join(self) -> None:
        """Append the queued rows, each padded so that its first block ends at column E (the others
        padded further when a joining row reaches further left or right)."""
        joining, self._joining = self._joining, []
        new = [RunningRow(tag, len(ids), g, self._plan(g)[1], generator=self._generator(seed))
               for ids, g, seed, tag in joining]
        if self.x is None:
            self.x = self.kpm = self.positions = self.prompt_mask = torch.zeros((0, 0), dtype=torch.long,
                                                                                device=self.device)
            self.kpm, self.prompt_mask = self.kpm.bool(), self.prompt_mask.bool()
            if self.policy is not None:
                self.kv = self.model.new_kv_cache(0, 0)
        e_old, right_old = self.block_end, self.x.shape[1] - self.block_end
        e_new = max([e_old] + [row.prompt_length + row.end for row in new])
        right_new = max([right_old] + [row.gen_length - row.end for row in new])
        self._pad(e_new - e_old, right_new - right_old)
        width = e_new + right_new
        ids_rows, kpm_rows, pos_rows, prompt_rows = [], [], [], []
        for (ids, g, _, _), row in zip(joining, new):
            row.left = e_new - row.prompt_length - row.end
            right = width - row.left - len(ids) - g
            ids_rows.append([self.pad_id] * row.left + ids + [self.mask_id] * g + [self.pad_id] * right)
            kpm_rows.append([0] * row.left + [1] * (len(ids) + g) + [0] * right)
            pos_rows.append([0] * row.left + list(range(len(ids) + g)) + [0] * right)
            prompt_rows.append([1] * (row.left + len(ids)) + [0] * g + [1] * right)
        t = torch.tensor([ids_rows, kpm_rows, pos_rows, prompt_rows], dtype=torch.long, device=self.device)
        self.x = torch.cat([self.x, t[0]])
        self.kpm = torch.cat([self.kpm, t[1].bool()])
        self.positions = torch.cat([self.positions, t[2]])
        self.prompt_mask = torch.cat([self.prompt_mask, t[3].bool()])
        if self.kv is not None:  # a joining row's K/V are written by its first step, a full forward
            self.kv = KVCache([torch.cat([b, b.new_zeros((len(new), *b.shape[1:]))]) for b in self.kv.k],
                              [torch.cat([b, b.new_zeros((len(new), *b.shape[1:]))]) for b in self.kv.v])
        if self._carried is not None:  # a joining row's first step forwards
            self._carried = torch.cat([self._carried, self._carried.new_zeros((len(new), *self._carried.shape[1:]))])
        self.rows.extend(new)
        self._sort_rows()
        self.block_end = e_new
        self._stale = True

    def _sort_rows(self) -> None:
        """Rows by length (the step's calls take runs of rows), under a cache by their block's width
        first (a cached call takes the rows of one width)."""
        def key(r: int) -> tuple[int, int]:
            row = self.rows[r]
            return (row.width if self.kv is not None else 0), row.prompt_length + row.gen_length
        order = sorted(range(len(self.rows)), key=key)
        if order != list(range(len(self.rows))):
            idx = torch.tensor(order, device=self.device)
            self._apply(lambda t: t.index_select(0, idx))
            self.rows = [self.rows[r] for r in order]
            self._stale = True

    def _generator(self, seed: Optional[int]) -> Optional[torch.Generator]:
        """A row's own generator (temperature > 0): seeded as ``generate(seed=...)`` seeds it."""
        if self.temperature == 0:
            return None
        return torch.Generator(device=self.device).manual_seed(fresh_seed() if seed is None else seed)

    def _advance(self, r: int) -> None:
        """Row ``r`` moves to its next block: shifted left by that block's width (a roll of its row),
        so that the block ends at E. Its K/V buffers stay: its next step is a full forward."""
        row = self.rows[r]
        row.block, row.block_step = row.block + 1, 0
        shift = row.width
        if row.left < shift:  # not enough columns left of it: pad every row
            self._pad(shift - row.left, 0)
        for t in (self.x, self.kpm, self.positions, self.prompt_mask):
            t[r].copy_(t[r].roll(-shift))  # the pads it rolls out of the left come in on the right
        row.left -= shift
        self._stale = True  # its calls' widths, maybe the window


__all__ = ["Blocks", "RunningCanvas", "RunningRow"]
