"""What a model's forward takes and returns, beside ``dllm.models.base.DiffusionLM``: the special token
ids (``SpecialIds``), the output (``ModelOutput``), the positions and padding masks of a left-padded
batch (``default_positions``, ``padding_attn_mask`` and its reference ``square_padding_mask``), and the
one-position shift of Dream's and Fast-dLLM v2's logits (``shifted_by_one``)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Optional

import torch


@dataclass(frozen=True)
class SpecialIds:
    """Token ids the decoder needs. eot = end of turn (LLaDA ``<|eot_id|>``, Dream ``<|im_end|>``)."""

    mask_id: int
    eos_id: int
    pad_id: int
    eot_id: Optional[int] = None
    bos_id: Optional[int] = None

    def check(self, vocab_rows: int) -> None:
        """ValueError when an id is outside [0, vocab_rows) or the mask id collides with pad/eos."""
        for name in ("mask_id", "eos_id", "pad_id", "eot_id", "bos_id"):
            value = getattr(self, name)
            if value is None and name in ("eot_id", "bos_id"):
                continue
            if not isinstance(value, int) or isinstance(value, bool) or not 0 <= value < vocab_rows:
                raise ValueError(f"{name} = {value!r} is not a token id of a vocabulary with "
                                 f"{vocab_rows} rows (valid: 0 .. {vocab_rows - 1})")
        if self.mask_id in (self.pad_id, self.eos_id):
            raise ValueError(f"mask_id ({self.mask_id}) must differ from pad_id ({self.pad_id}) and "
                             f"eos_id ({self.eos_id}): prompts are told apart from masks by id")


@dataclass
class ModelOutput:
    """logits [B, T, V] (model dtype; logits[:, i] predicts position i), hidden {layer: [B, T, D]},
    attn {layer: [B, H, T, T] float32 probabilities}."""

    logits: torch.Tensor
    hidden: dict[int, torch.Tensor] = field(default_factory=dict)
    attn: dict[int, torch.Tensor] = field(default_factory=dict)


def default_positions(input_ids: torch.Tensor, key_padding_mask: Optional[torch.Tensor]) -> torch.Tensor:
    """[B, T] int64 positions: arange, or ``cumsum(mask) - 1`` clamped at 0 for left-padded rows
    (the first real token gets position 0, pads get 0)."""
    b, t = input_ids.shape
    if key_padding_mask is None:
        return torch.arange(t, device=input_ids.device).expand(b, t)
    return (key_padding_mask.long().cumsum(dim=-1) - 1).clamp_min(0)


def padding_attn_mask(key_padding_mask: torch.Tensor) -> torch.Tensor:
    """bool [B, T] (True = real) -> bool [B, 1, 1, T] (True = attend), broadcast over the queries.

    Every query attends to the real keys only. A pad query's output is never read, and it stays
    finite (every row has real columns: the generated ones). Until 2026-12-02 this was the
    [B, 1, T, T] mask ``keys | pad_queries`` (pad queries attending to everything): real queries
    get bit-identical outputs either way, but sdpa on CPU runs a full [T, T] boolean mask ~1.4x
    slower than a broadcast key mask (4 rows x 4 heads x 2,500 columns: 0.82 s vs 0.58 s).
    """
    return key_padding_mask[:, None, None, :]  # [B, 1, 1, T]


def square_padding_mask(key_padding_mask: torch.Tensor) -> torch.Tensor:
    """bool [B, T] -> bool [B, 1, T, T] ``keys | pad_queries``: the reference beside
    ``padding_attn_mask`` (what the models built until 2026-12-02; pad queries attend to every key).
    Real queries see the same keys under both, so their outputs are identical."""
    return key_padding_mask[:, None, None, :] | ~key_padding_mask[:, None, :, None]


_SHIFT_INDEX: dict[tuple[int, torch.device, bool], torch.Tensor] = {}  # (T, device, inference) -> [T] long


def shifted_by_one(raw: torch.Tensor) -> torch.Tensor:
    """Logits of a one-position-shift family (Dream, Fast-dLLM v2): raw [B, T, V] -> [B, T, V] with
    ``[:, 0] = raw[:, 0]`` (never used) and ``[:, i] = raw[:, i - 1]``, the official
    ``cat(raw[:, :1], raw[:, :-1])`` as one ``index_select`` (the index made once per length)."""
    t = raw.shape[1]
    key = (t, raw.device, torch.is_inference_mode_enabled())  # an inference tensor cannot serve autograd
    index = _SHIFT_INDEX.get(key)
    if index is None:
        if len(_SHIFT_INDEX) >= 64:  # full forwards of many lengths: keep the table small
            _SHIFT_INDEX.clear()
        index = _SHIFT_INDEX[key] = (torch.arange(t, device=raw.device) - 1).clamp_min(0)  # [0, 0, 1, ..]
    return raw.index_select(1, index)


__all__ = ["ModelOutput", "SpecialIds", "default_positions", "padding_attn_mask", "shifted_by_one",
           "square_padding_mask"]
