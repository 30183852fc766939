"""A full forward of a long padded batch without its padding: one forward per group of rows with the
same run of real columns, over those columns only, unmasked.

``dllm.kernels.packed`` skips the padded keys inside attention; every other part of a layer (the
projections, the MLP, the norms) still runs on the pad columns. For a forward without a cache the
rows of a ragged batch are independent (a real position attends to its row's real keys only), so
the model can run each group of rows whose real columns are ``[start, end)`` as a batch of its own,
with no mask at all, and scatter the logits back:

    logits[rows, start:end] = forward(input_ids[rows, start:end], positions[rows, start:end])

The same values at every real position up to float summation order (a shifted family's first real
column predicts nothing in either path). Pad columns get zeros (the padded forward gives them
values no caller reads), except, for a shifted family (``logit_shift = 1``: Dream, Fast-dLLM v2),
the column just after a row's last real one: there ``logits[:, i]`` predicts position i from the
last real token, as in the padded forward (the next token of a right-padded row). Left-padded
batches (the engine's prompts) and right-padded ones (training's examples) alike. Taken only for a
model that opts in (``packs_padded_rows``), without a cache, without requested attention maps or
hidden states, when the batch has >= 2 rows, at least ``MIN_WORK`` query x key pairs per row, >= 1/8
of its columns padded
(``dllm.kernels.packed.padding_groups``: one host sync per forward; off the CPU at most
``MAX_GROUPS_OFF_CPU`` groups), and, with ``logits_rows=(a, b)``, every group's real columns
covering ``[a, b)``. Otherwise the caller runs the padded forward, which stays the reference
(tests/models/core/test_packed_rows.py).
"""

from __future__ import annotations

from typing import Any, Optional

import torch

from dllm.kernels.packed import MIN_WORK, few_enough, padding_groups
from dllm.models.core.views.packed import PackedView

# share of pad columns below which a short batch runs padded (on a CPU the packing breaks even near
# 1/10 of the columns padded: benchmarks/packed_tokens.py)
MIN_PADDED_TOKENS = 1 / 8


def packed_rows_logits(model: Any, input_ids: torch.Tensor, positions: torch.Tensor,
                       attn_mask: Optional[torch.Tensor], head_rows: Optional[tuple[int, int]]
                       ) -> Optional[torch.Tensor]:
    """The logits of ``model.forward`` (shifted, [B, T, V] or the ``head_rows`` [B, b - a, V]) computed
    per group of rows with the same real columns, or for short rows on a CPU from their packed tokens
    (``packed_tokens_logits``); None when the batch does not qualify (see the module)."""
    b, t = input_ids.shape
    if attn_mask is None or b < 2 or attn_mask.dtype != torch.bool or attn_mask.dim() != 4 or attn_mask.shape[2] != 1:
        return None
    if t * t < MIN_WORK:  # short rows: their tokens packed, or the padded forward
        if not packs_tokens(model, input_ids.device):
            return None
        return packed_tokens_logits(model, input_ids, positions, attn_mask, head_rows)
    groups = padding_groups(attn_mask)
    if groups is None or not few_enough(groups, input_ids.device) or (
            head_rows is not None and not all(s0 <= head_rows[0] and head_rows[1] <= e0 for s0, e0, _ in groups)):
        return None
    out: Optional[torch.Tensor] = None
    shift = int(getattr(model, "logit_shift", 0))
    for s0, e0, rows_at in groups:
        rows = rows_at.to(input_ids.device)
        rows_head = None if head_rows is None else (head_rows[0] - s0, head_rows[1] - s0)
        raw, _, _ = model._raw_forward(input_ids[rows, s0:e0], positions[rows, s0:e0], None, (), (),
                                       **model._head_kwargs(rows_head))
        logits = model._final_logits(raw, rows_head)  # [G, e0 - s0 | b - a, V]
        if out is None:
            width = t if head_rows is None else head_rows[1] - head_rows[0]
            out = logits.new_zeros(b, width, logits.shape[-1])
        rows_out = rows.to(out.device)  # the head may sit on another device (device_map)
        if head_rows is None:
            out[rows_out, s0:e0] = logits
            past = min(shift, t - e0)  # a shifted family: the columns after e0 the last real rows predict
            if past > 0:
                out[rows_out, e0:e0 + past] = raw[:, raw.shape[1] - shift:raw.shape[1] - shift + past].to(out.device)
        else:
            out[rows_out] = logits
    return out


def packs_tokens(model: Any, device: torch.device) -> bool:
    """Whether ``model`` on ``device`` runs a short padded batch as its packed tokens (``PackedView``):
    on a CPU (on an accelerator a short batch is bound by launches, which the packing adds to), for a
    model that packs padded rows (``packs_padded_rows``) and whose attention masks are the batch's key
    mask alone (not block-causal)."""
    return (device.type == "cpu" and bool(getattr(model, "packs_padded_rows", False))
            and getattr(model, "block_size", None) is None)


def packed_tokens_logits(model: Any, input_ids: torch.Tensor, positions: torch.Tensor, attn_mask: torch.Tensor,
                         head_rows: Optional[tuple[int, int]]) -> Optional[torch.Tensor]:
    """The padded forward's logits from one forward of the batch's real tokens (``PackedView``):
    input_ids / positions [B, T], attn_mask [B, 1, 1, T] bool -> [B, T | b - a, V]; None when fewer
    than ``MIN_PADDED_TOKENS`` of the columns are pads (one host read: the real tokens)."""
    view = PackedView.of(attn_mask.reshape(input_ids.shape), most=int((1 - MIN_PADDED_TOKENS) * input_ids.numel()))
    if view is None:
        return None
    raw, _, _ = model._raw_forward(view.pack(input_ids), view.pack(positions), attn_mask, (), (), cache=view,
                                   **model._head_kwargs(head_rows))
    return model._final_logits(raw, head_rows)


__all__ = ["packed_rows_logits", "packed_tokens_logits", "packs_tokens"]
