"""Leave-one-out views of a block for verifying committed tokens (WINO's "shadow block").

WINO (Feng-Hong/WINO-DLLM ``decoding_wino``) appends to the canvas a *shadow block*: one mask
token per block position, with duplicated position ids and a custom 4-D attention mask. Real rows
never see the shadow; shadow row k sees every real key except the real token it predicts, and all
shadow rows. Its logits are therefore a leave-one-out prediction of block column ``start + k``,
computed in the same forward as the ordinary logits (+W query rows, no extra NFE).

Two paths, one contract (``DiffusionLM.shadow_forward``):
- reference (any model, e.g. oracles): W masked copies of the canvas, ``[B*W, T]`` rows;
- shadow block (transformers): one forward of ``[B, T + W]`` rows with :func:`shadow_attn_mask`;
  under a KV cache the T rows are the policy's query columns and the real keys come from the
  buffers (:class:`ShadowCacheView`): the shadow rows read the same cached K/V as the real rows.
Both hide x_j from its own prediction's input; in a transformer with several layers the shadow
block hides it exactly at the first layer only: real rows attend to x_j, and shadow rows read
those real rows in later layers (as in WINO's release). The two paths are not equal for a transformer (a shadow row also
sees the other shadow rows' masks at duplicated positions, where a masked copy sees one mask at
j), so tests check each path's own contract rather than their equality.

Shifted families (Dream, ``logit_shift = 1``): the logits predicting column j come from the row at
j - 1, so shadow row k sits at the position of column ``start + k - 1`` (a mask token there) and
cannot see the real column ``start + k``; its raw logits predict ``start + k`` directly. This is
our generalisation: WINO's release covers LLaDA-layout models only.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

import torch

from dllm.models.core.kv import CacheView


def check_span(length: int, start: int, end: int, shift: int) -> None:
    """ValueError unless ``[start, end)`` is a non-empty span of a length-``length`` canvas that
    leaves room for the shift (a shifted family needs ``start >= 1``)."""
    if not (0 <= start - shift and start < end <= length):
        raise ValueError(f"shadow span [{start}, {end}) is not a non-empty span of a canvas of {length} "
                         f"columns (a logit shift of {shift} needs start >= {shift})")


def shadow_positions(positions: torch.Tensor, start: int, end: int, shift: int) -> torch.Tensor:
    """positions [B, T] -> [B, T + W]: the real positions, then those of the rows whose logits
    predict columns ``start .. end - 1`` (the columns themselves, or one earlier when shifted)."""
    return torch.cat([positions, positions[:, start - shift:end - shift]], dim=1)


def shadow_attn_mask(
    key_padding_mask: Optional[torch.Tensor],  # [B, L] bool (True = real) or None (all real)
    batch: int,
    length: int,
    start: int,
    end: int,
    device: torch.device,
    *,
    n_queries: Optional[int] = None,
    key_end: Optional[int] = None,
) -> torch.Tensor:
    """bool [B, 1, T + W, K + W], True = attend, for T real query rows (default T = L, the whole
    canvas; a cached forward's query columns otherwise), then the W shadow rows; keys are canvas
    columns ``[0, K)`` (default L; a cached forward reads them from its buffers), then the W shadow
    keys.

    Real queries: the padding rule of ``padding_attn_mask`` / ``CacheView.attn_mask`` over real
    keys, never a shadow key. Shadow query k: every real key except column ``start + k`` (and pads),
    every shadow key.
    """
    w = end - start
    t = length if n_queries is None else n_queries
    k_end = length if key_end is None else key_end
    real = (torch.ones(batch, length, dtype=torch.bool, device=device)
            if key_padding_mask is None else key_padding_mask)  # [B, L]
    mask = torch.zeros(batch, 1, t + w, k_end + w, dtype=torch.bool, device=device)
    mask[:, 0, :, :k_end] = real[:, None, :k_end]  # every query (pad and shadow ones too): the real keys
    mask[:, 0, t:, k_end:] = True
    k = torch.arange(w, device=device)
    mask[:, 0, t + k, start + k] = False  # leave the predicted token out
    return mask


@dataclass(frozen=True)
class ShadowCacheView(CacheView):
    """A cached forward whose first ``n_real`` query rows are canvas columns (their K/V go to the
    buffers as in ``CacheView``) and whose remaining rows are the shadow block: its K/V are appended
    to the attended keys for this forward only and never stored."""

    n_real: int = 0

    def check_queries(self, n_queries: int) -> None:
        super().check_queries(self.n_real)

    def key_positions(self, positions: torch.Tensor) -> torch.Tensor:
        """positions [R, T + W] -> the attended keys' positions [R, K + W] (block-causal models)."""
        n = self.n_real
        return torch.cat([super().key_positions(positions[:, :n]), positions[:, n:]], dim=1)

    def update(self, layer: int, k: torch.Tensor, v: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """k/v [R, Hkv, T + W, hd] -> attended keys/values [R, Hkv, K + W, hd]."""
        n = self.n_real
        keys, values = super().update(layer, k[:, :, :n], v[:, :, :n])  # [R, Hkv, K, hd]
        return torch.cat([keys, k[:, :, n:]], dim=2), torch.cat([values, v[:, :, n:]], dim=2)


def masked_copies(input_ids: torch.Tensor, start: int, end: int, mask_id: int) -> torch.Tensor:
    """[B, T] -> [B * W, T]: copy k of row b has column ``start + k`` masked (reference path)."""
    b, t = input_ids.shape
    w = end - start
    copies = input_ids[:, None, :].expand(b, w, t).clone()  # [B, W, T]
    k = torch.arange(w, device=input_ids.device)
    copies[:, k, start + k] = mask_id
    return copies.reshape(b * w, t)


def diagonal(logits: torch.Tensor, batch: int, start: int, end: int) -> torch.Tensor:
    """[B * W, T, V] logits of the masked copies -> [B, W, V]: copy k's logits at column start + k."""
    w = end - start
    per_copy = logits.reshape(batch, w, logits.shape[1], logits.shape[2])  # [B, W, T, V]
    k = torch.arange(w, device=logits.device)
    return per_copy[:, k, start + k]
