"""What a fused static LoPA step writes (``LoPA._fused_lookahead``), kept from one step to the next so
that a step allocates nothing: ``lopa_propose``'s outputs, two sets of variant statistics and winners
(the last step's, which a reused anchor reads in place, and this step's), and ``lopa_select``'s commit
and tokens, which the engine consumes before the next step. One ``StepBuffers`` belongs to one step at
a time: the sampler hands it on through its carried slot, which a step empties when it starts, so a
decode that steps the same sampler meanwhile (a served greenlet while this step's variants forward)
makes its own and never writes these.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch


@dataclass
class StepBuffers:
    """Outputs of the fused static step for ``key`` = (rows N, variants K, width W, device)."""

    key: tuple[int, int, int, torch.device]
    propose: tuple[torch.Tensor, torch.Tensor, torch.Tensor]  # variants [N, K, W], at [N, K], anchor [N, W]
    select: tuple[torch.Tensor, torch.Tensor]  # commit [N, W] bool, tokens [N, W] long
    stats: tuple[tuple[torch.Tensor, torch.Tensor], ...]  # 2 x (idx [N*K, W, 2] int64, val [N*K, W, 6] float32)
    wins: tuple[torch.Tensor, ...]  # 2 x [N] long: rows of the variant batch
    turn: int = field(default=0)  # stats[turn], wins[turn]: the last step's (what a reuse reads)
    # the first N rows of each stats set, [N, W, 2] / [N, W, 6]: where a step whose anchor reads no
    #   carried statistics writes the block's (views made once, not per step)
    heads: tuple[tuple[torch.Tensor, torch.Tensor], ...] = field(default=(), repr=False)

    def __post_init__(self) -> None:
        n = self.key[0]
        self.heads = tuple((idx[:n], val[:n]) for idx, val in self.stats)

    @classmethod
    def make(cls, n_rows: int, k: int, width: int, device: torch.device) -> "StepBuffers":
        from dllm.kernels.triton.lopa import propose_buffers, select_buffers
        from dllm.kernels.triton.stats import stats_buffers

        commit, tokens, win = select_buffers(n_rows, width, device)
        stats = tuple(stats_buffers((n_rows * k, width), device) for _ in range(2))  # the variants' [N*K, W]
        return cls((n_rows, k, width, device), propose_buffers(n_rows, k, width, device), (commit, tokens),
                   stats, (win, torch.empty_like(win)))

    def last(self) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """(idx, val, win) the last step wrote: its variant statistics and winners."""
        return (*self.stats[self.turn], self.wins[self.turn])

    def last_heads(self) -> tuple[torch.Tensor, torch.Tensor]:
        """The first N rows of ``last``'s statistics (idx, val): the block's own when nothing is carried."""
        return self.heads[self.turn]

    def next(self) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """(idx, val, win) this step writes (never what it reads: ``last``)."""
        return (*self.stats[1 - self.turn], self.wins[1 - self.turn])

    def flip(self) -> None:
        """This step's outputs become the last step's."""
        self.turn = 1 - self.turn


__all__ = ["StepBuffers"]
