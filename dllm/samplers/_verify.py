"""Verification by variants, shared by the samplers that check guesses with extra forwards.

A *variant* is a copy of one row's canvas whose block window differs from the canvas (some masks
filled with guessed tokens). The engine forwards any number of variants in ONE batch
(``StepInput.forward_variants``; it counts the forward and, under a KV cache, runs each variant's
block query on a copy of the buffers). ``ssd`` and ``spec_threshold`` verify drafted commits with
nested variants (variant k fills the first k drafts); ``lopa`` scores one-token lookahead variants.

Every function is pure and batched; none reads a tensor back to the host.
"""

from __future__ import annotations

from typing import Optional

import torch

from dllm.samplers.chunked import column_ids, constant
from dllm.state import StepInput


def every_row_runs(n_rows: int, n: int, device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
    """(``arange(R)`` [R], each row ``n`` times in runs [R * n]) long on ``device``: constants made
    once per shape (``dllm.samplers.chunked.constant``)."""
    rows = column_ids(n_rows, device)  # [R]
    return rows, constant(("every row runs", n_rows, n, device), lambda: rows.repeat_interleave(n))


def forward_window_variants(inp: StepInput, window_tokens: torch.Tensor, rows: Optional[torch.Tensor] = None,
                            host_rows: Optional[list[int]] = None) -> torch.Tensor:
    """ONE batched forward of variants that differ from the canvas only inside the block window.

    window_tokens: [R, N, W] long, N variants of each of R batch rows (their block-window tokens);
    rows: [R] long, the batch row of each (default: every row in order, R = B); ``host_rows``: the same
    on the host when the caller has them (a running decode then reads nothing back).
    Returns the window's logits [R * N, W, V], the N variants of a row next to each other.
    """
    assert inp.forward_variants is not None, "the engine must provide forward_variants"
    n_rows, n, _ = window_tokens.shape
    ws, we = inp.window
    if (ws, we) == (0, inp.tokens.shape[1]):  # the window is the whole view
        full = window_tokens  # [R, N, Q]
    else:
        base = inp.tokens if rows is None else inp.tokens[rows]  # [R, Q]
        full = base[:, None, :].expand(-1, n, -1).clone(memory_format=torch.contiguous_format)  # [R, N, Q] a copy
        full[:, :, ws:we] = window_tokens
    every_row = rows is None  # known here without reading rows back: every batch row, in order
    if rows is None:
        variant_rows = every_row_runs(n_rows, n, window_tokens.device)[1]  # [R * N] each row n times, in runs
    else:
        variant_rows = rows[:, None].expand(n_rows, n).reshape(-1)
    kwargs = {} if host_rows is None else {"host_rows": host_rows}
    return inp.forward_variants(full.reshape(n_rows * n, -1), variant_rows, n, every_row=every_row, **kwargs)
