"""Builders shared by the sampler tests: hand-built probability rows, a ``StepInput`` whose block
is the whole query, a ``DecodeState`` over a canvas, and ordinary token ids of a model.

``tests/samplers`` has no ``__init__.py``, so pytest (``prepend`` import mode) puts this folder on
``sys.path`` before it imports a test module here: the tests import it as ``builders``.
"""

from __future__ import annotations

from typing import Any, Optional, Sequence, Union

import torch

from dllm.state import DecodeState, StepInput

MASK, V = 9, 10  # the mask id and vocabulary size of hand-built logits


def prob_row(top: float, tok: int, *, mask_id: Optional[int] = None, v: int = V) -> list[float]:
    """A probability row over ``v`` ids: ``top`` on ``tok``, the rest spread evenly over the other
    ids. With ``mask_id``, that id gets ~0 (1e-30, unless it is ``tok``) and no share."""
    others = [t for t in range(v) if t != tok and t != mask_id]
    row = [1e-30] * v
    for t in others:
        row[t] = (1 - top) / len(others)
    row[tok] = top
    return row


def log_probs(rows: Sequence) -> torch.Tensor:
    """Nested probability rows ([..., V] lists) -> float32 logits (the float64 log, rounded once)."""
    return torch.log(torch.tensor(rows, dtype=torch.float64)).float()


def step_input(logits: torch.Tensor, active: Any = None, *, tokens: Any = None,
               window: Optional[tuple[int, int]] = None, mask_id: int = MASK, **fields: Any) -> StepInput:
    """One step's input at query start 0, block step 0 of an adaptive sampler, temperature 0.

    logits: [B, Q, V]; tokens: [B, Q] (default: all masks); active: [B, Q] bool (default: the
    masks of ``tokens``); nested lists are accepted for both. window: the block in query
    coordinates (default: the whole query). ``fields`` set any other ``StepInput`` field.
    """
    bsz, width, _ = logits.shape
    tokens = torch.full((bsz, width), mask_id) if tokens is None else torch.as_tensor(tokens)
    active = tokens == mask_id if active is None else torch.as_tensor(active)
    base = dict(query_start=0, step=0, steps=None, temperature=0.0, generator=None)
    return StepInput(logits=logits, tokens=tokens, active=active, window=window or (0, width),
                     mask_id=mask_id, **{**base, **fields})


def decode_state(x: Union[torch.Tensor, tuple[int, int]], *, prompt_length: int = 0, mask_id: int = MASK,
                 key_padding_mask: Optional[torch.Tensor] = None, **fields: Any) -> DecodeState:
    """The decode state of canvas ``x`` [B, L] (a (B, L) shape: all masks), temperature 0.

    Prompt columns are [0, prompt_length); the current block is the generated region
    [prompt_length, L). RoPE positions count the real tokens of ``key_padding_mask`` [B, L] bool
    (default: no pads). ``fields`` set any other ``DecodeState`` field.
    """
    x = torch.full(x, mask_id) if isinstance(x, tuple) else x
    bsz, length = x.shape
    kpm = torch.ones_like(x, dtype=torch.bool) if key_padding_mask is None else key_padding_mask
    gen = length - prompt_length
    base = dict(
        positions=(kpm.long().cumsum(dim=1) - 1).clamp_min(0),
        prompt_mask=(torch.arange(length) < prompt_length).expand(bsz, length), gen_length=gen, temperature=0.0, generator=None, trace=torch.full((bsz, gen), -1),
        padded=not bool(kpm.all()), block_start=prompt_length, block_end=length,
    )
    return DecodeState(x=x, key_padding_mask=kpm, prompt_length=prompt_length, mask_id=mask_id,
                       **{**base, **fields})


def ordinary_ids(model, n: int, offset: int = 0) -> list[int]:
    """``n`` token ids of ``model`` that are no special token (mask, EOS, EoT, pad, BOS), spread over
    the vocabulary by a stride of 7 from ``offset``."""
    special = {model.mask_id, model.eos_id, model.eot_id, model.pad_id, model.bos_id}
    pool = [t for t in range(model.config.vocab_size) if t not in special]
    return [pool[(offset + 7 * i) % len(pool)] for i in range(n)]
