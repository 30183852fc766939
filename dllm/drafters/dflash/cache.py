"""The DFlash draft KV cache: the injected context K/V of every draft layer, kept across rounds.

In DFlash (arXiv 2602.06036; z-lab/dflash ``dflash/model.py``) each draft layer attends from the
block's queries to ``[K/V of the target context features; K/V of the block]``. The context part
only grows: each round adds the features of the tokens the target just committed. The reference
appends context *and* block K/V to a ``DynamicCache`` and crops it back to the committed length
right after the draft forward; here the block's K/V are never stored, which leaves the same cache
after every round without a crop.

Rows of a batch may commit different numbers of tokens per round. A round appends the same number
of slots to every row, with a validity mask for the padding; every slot keeps its RoPE position,
so attention masks (padding, causal, sliding window) are built from positions, not from slot
indices. ``num_tokens[b]`` counts row b's real context tokens, i.e. the position of its next one.
"""

from __future__ import annotations

from typing import Optional

import torch


class DraftKVCache:
    """Per-layer context keys/values (RoPE applied) with their positions and a padding mask.

    Attributes (S = stored slots, the same for every row):
      keys[i], values[i]: [B, Hkv, S, hd] of draft layer i (None before the first round)
      positions: [B, S] long, the RoPE position of each slot
      valid: [B, S] bool (True = a real token), or None while every slot is real
      num_tokens: [B] long, real context tokens per row
    """

    def __init__(self, num_layers: int) -> None:
        if not isinstance(num_layers, int) or num_layers < 1:
            raise ValueError(f"DraftKVCache needs num_layers >= 1, got {num_layers!r}")
        self.num_layers = num_layers
        self.keys: list[Optional[torch.Tensor]] = [None] * num_layers
        self.values: list[Optional[torch.Tensor]] = [None] * num_layers
        self.positions: Optional[torch.Tensor] = None
        self.valid: Optional[torch.Tensor] = None
        self.num_tokens: Optional[torch.Tensor] = None

    @property
    def length(self) -> int:
        """Stored slots S (padding included); 0 for an empty cache."""
        return 0 if self.positions is None else int(self.positions.shape[1])

    @property
    def batch_size(self) -> Optional[int]:
        return None if self.positions is None else int(self.positions.shape[0])

    def tokens_so_far(self, batch: int, device: torch.device) -> torch.Tensor:
        """[B] real context tokens per row (zeros for an empty cache); checks the batch size."""
        if self.num_tokens is None:
            return torch.zeros(batch, dtype=torch.long, device=device)
        if self.num_tokens.shape[0] != batch:
            raise ValueError(f"the draft cache holds {self.num_tokens.shape[0]} rows, but this round has "
                             f"{batch}; use a fresh DraftKVCache or cache.select(rows)")
        return self.num_tokens

    def joined(self, layer: int, keys: torch.Tensor, values: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Layer ``layer``'s stored K/V followed by this round's context K/V [B, Hkv, N, hd] (not stored)."""
        old_k, old_v = self.keys[layer], self.values[layer]
        if old_k is None or old_v is None:
            return keys, values
        return torch.cat([old_k, keys], dim=2), torch.cat([old_v, values], dim=2)

    def slot_meta(
        self, positions: torch.Tensor, valid: Optional[torch.Tensor]
    ) -> tuple[torch.Tensor, Optional[torch.Tensor]]:
        """(positions [B, S+N], valid [B, S+N] or None) of stored slots followed by N new ones."""
        if self.positions is None:
            return positions, valid
        all_pos = torch.cat([self.positions, positions], dim=1)
        if self.valid is None and valid is None:
            return all_pos, None
        old = self.valid if self.valid is not None else _ones_like(self.positions)
        new = valid if valid is not None else _ones_like(positions)
        return all_pos, torch.cat([old, new], dim=1)

    def commit(
        self,
        keys: list[torch.Tensor],  # per layer [B, Hkv, S+N, hd]: the result of joined()
        values: list[torch.Tensor],
        positions: torch.Tensor,  # [B, S+N] long
        valid: Optional[torch.Tensor],  # [B, S+N] bool or None
        added: torch.Tensor,  # [B] long, real tokens among the N new slots
    ) -> None:
        """Replace the stored state by the joined one (all layers at once, after a full forward)."""
        if len(keys) != self.num_layers or len(values) != self.num_layers:
            raise ValueError(f"commit needs K/V for {self.num_layers} layers, got {len(keys)}")
        self.keys, self.values = list(keys), list(values)
        self.positions, self.valid = positions, valid
        base = self.num_tokens if self.num_tokens is not None else torch.zeros_like(added)
        self.num_tokens = base + added

    def crop(self, length: int) -> None:
        """Keep the first ``length`` slots (the reference's ``cache.crop`` back to a committed length)."""
        if not isinstance(length, int) or isinstance(length, bool) or not 0 <= length <= self.length:
            raise ValueError(f"crop length must be an int in [0, {self.length}], got {length!r}")
        if self.positions is None or length == self.length:
            return
        self.keys = [k[:, :, :length] for k in self.keys]  # type: ignore[index]
        self.values = [v[:, :, :length] for v in self.values]  # type: ignore[index]
        self.positions = self.positions[:, :length]
        if self.valid is None:
            self.num_tokens = torch.full_like(self.num_tokens, length)  # type: ignore[arg-type]
        else:
            self.valid = self.valid[:, :length]
            self.num_tokens = self.valid.sum(dim=1)

    def select(self, rows: torch.Tensor) -> None:
        """Keep only the batch rows ``rows`` ([R] long indices or [B] bool), e.g. drop finished rows."""
        if self.positions is None:
            return
        self.keys = [k[rows] for k in self.keys]  # type: ignore[index]
        self.values = [v[rows] for v in self.values]  # type: ignore[index]
        self.positions = self.positions[rows]
        self.valid = None if self.valid is None else self.valid[rows]
        self.num_tokens = self.num_tokens[rows]  # type: ignore[index]


def _ones_like(positions: torch.Tensor) -> torch.Tensor:
    return torch.ones(positions.shape, dtype=torch.bool, device=positions.device)


__all__ = ["DraftKVCache"]
