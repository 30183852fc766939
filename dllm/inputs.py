"""Prompt encoding and left padding with the checks every generate call needs, the initial decode
state (the canvas), and the text of generated ids."""

from __future__ import annotations

import operator
from typing import Callable, Optional, Sequence, Union

import torch

from dllm.state import DecodeState

Prompts = Union[str, Sequence[str], Sequence[Sequence[int]], torch.Tensor]  # the forms ``prompt_rows`` accepts


def encode_prompts(model, prompts: Prompts, *, chat: bool = False) -> list[list[int]]:
    """``prompt_rows`` for a dllm model: strings through ``model.generation_prompt`` (unknown words a
    ValueError naming them), ids checked against the model's vocabulary and its mask token."""
    return prompt_rows(prompts, lambda text: _encode_text(model, text, chat), model.config.vocab_size,
                       mask_id=model.mask_id, empty_text_ok=chat)


def prompt_rows(prompts: Prompts, encode_text: Optional[Callable[[str], list[int]]], vocab_size: int, *,
                mask_id: Optional[int] = None, empty_text_ok: bool = False,
                no_encoder: str = "string prompts need a tokenizer", vocab_name: str = "") -> list[list[int]]:
    """Turn the accepted prompt forms into a list of token-id lists (one per row), validated: the
    one prompt encoder of ``dllm.generate`` and ``dllm.speculative_generate``.

    Accepted: a string, a list of strings, a list of token-id lists or 1-D integer tensors (ragged
    rows), a LongTensor [B, Lp] (rows taken as unpadded) or [Lp]. Strings go through
    ``encode_text`` (None: a ValueError saying ``no_encoder``); it is where unknown words are refused. Token ids must be integers in
    [0, vocab_size) (``vocab_name`` says whose, in the error): a float (7.5, also 7.0) or a bool is a ValueError, never truncated; ``mask_id``
    (a diffusion model's mask token) may not appear. A list mixing forms is a TypeError.
    """
    def text(p: str, j: Optional[int] = None) -> list[int]:
        if encode_text is None:
            raise ValueError(f"{no_encoder}: pass tokenizer=..., or token-id lists")
        if not p.strip() and not empty_text_ok:
            which = "prompt" if j is None else f"prompt {j} ({p!r})"
            raise ValueError(f"{which} is empty; every prompt needs at least one token")
        return list(encode_text(p))

    if isinstance(prompts, torch.Tensor):
        if prompts.dim() == 1:
            prompts = prompts[None]
        dtype = prompts.dtype
        if prompts.dim() != 2 or dtype.is_floating_point or dtype.is_complex or dtype == torch.bool:
            raise ValueError(f"a prompt tensor must be integer token ids of shape [B, Lp] or [Lp], "
                             f"got dtype {prompts.dtype} shape {tuple(prompts.shape)}")
        rows = [list(map(int, r)) for r in prompts.tolist()]
    elif isinstance(prompts, str):
        rows = [text(prompts)]
    elif isinstance(prompts, Sequence) and len(prompts) > 0:
        if all(isinstance(p, str) for p in prompts):
            rows = [text(p, j) for j, p in enumerate(prompts)]
        elif all(isinstance(p, (list, tuple)) or _id_row_tensor(p) for p in prompts):
            rows = [_token_ids(j, p.tolist() if isinstance(p, torch.Tensor) else p) for j, p in enumerate(prompts)]
        else:
            kinds = sorted({_kind(p) for p in prompts})
            got = f"a list mixing {kinds}" if len(kinds) > 1 else f"a list of {kinds[0]}"
            if kinds == ["int"]:
                got += f" (one prompt's token ids are a row: [{prompts!r:.60}])"
            raise TypeError("prompts must be a string, a list of strings, a list of token-id lists (or 1-D "
                            f"integer tensors) or a tensor; got {got}")
    else:
        raise ValueError(f"prompts must be a non-empty string, list or tensor, got {prompts!r}")
    for j, row in enumerate(rows):
        if len(row) == 0:
            raise ValueError(f"prompt {j} is empty; every prompt needs at least one token")
        if mask_id is not None and mask_id in row:
            raise ValueError(f"prompt {j} contains the mask token (id {mask_id}) at position "
                             f"{row.index(mask_id)}; prompts must not contain masks")
        bad = [t for t in row if not 0 <= t < vocab_size]
        if bad:
            raise ValueError(f"prompt {j} has token ids outside {vocab_name}[0, {vocab_size}): {bad[:5]}")
    return rows


def _id_row_tensor(p: object) -> bool:
    """A 1-D tensor: one prompt's token ids (``_token_ids`` refuses float and bool ids)."""
    return isinstance(p, torch.Tensor) and p.dim() == 1


def _kind(p: object) -> str:
    """What a refused list element is, for the error: its type, and a tensor's shape and dtype."""
    if isinstance(p, torch.Tensor):
        return f"Tensor {p.dtype} {list(p.shape)}"
    return type(p).__name__


def _token_ids(j: int, row: Sequence) -> list[int]:
    """A list of token ids as ints: Python or NumPy integers, or one-element integer tensors."""
    out = []
    for i, t in enumerate(row):
        if not isinstance(t, bool) and not (isinstance(t, torch.Tensor) and t.dtype == torch.bool):
            try:
                out.append(operator.index(t))
                continue
            except TypeError:
                pass
        raise ValueError(f"prompt {j}: token ids must be integers, got {t!r} ({type(t).__name__}) at "
                         f"position {i}; pass integer ids (a float id is not truncated)")
    return out


def _encode_text(model, text: str, chat: bool) -> list[int]:
    if not text.strip() and not chat:
        raise ValueError("prompt is empty; every prompt needs at least one token")
    return list(model.generation_prompt(text, chat=chat))


def left_pad(rows: list[list[int]], pad_id: int, device) -> tuple[torch.Tensor, torch.Tensor]:
    """Left-pad rows to the longest. Returns (ids [B, Lp] long, valid [B, Lp] bool), uploaded as one
    tensor (each row's pad count in column 0) and the mask made on the device."""
    width = max(len(r) for r in rows)
    packed = torch.tensor([[width - len(r)] + [pad_id] * (width - len(r)) + list(r) for r in rows],
                          dtype=torch.long).to(device)  # [B, 1 + Lp] one upload
    valid = torch.arange(width, device=device) >= packed[:, :1]  # [B, Lp]
    return packed[:, 1:], valid


def model_device(model) -> torch.device:
    try:
        return next(model.parameters()).device
    except (StopIteration, AttributeError):
        return torch.device(getattr(model, "device", "cpu"))


def init_state(model, rows: list[list[int]], gen_length: int, temperature: float,
                generator: Optional[torch.Generator], device: torch.device) -> DecodeState:
    mask_id = int(model.mask_id)
    pad_id = int(model.pad_id if model.pad_id is not None else model.eos_id)
    prompt_ids, valid = left_pad(rows, pad_id, device)  # [B, Lp], [B, Lp]
    bsz, lp = prompt_ids.shape
    gen = torch.full((bsz, gen_length), mask_id, dtype=torch.long, device=device)
    x = torch.cat([prompt_ids, gen], dim=1)  # [B, L]
    kpm = torch.cat([valid, torch.ones_like(gen, dtype=torch.bool)], dim=1)  # [B, L]
    positions = (kpm.long().cumsum(dim=1) - 1).clamp_min(0)  # [B, L]
    prompt_mask = torch.zeros_like(kpm)
    prompt_mask[:, :lp] = True
    return DecodeState(
        x=x, key_padding_mask=kpm, positions=positions, prompt_mask=prompt_mask,
        prompt_length=lp, gen_length=gen_length, mask_id=mask_id, temperature=float(temperature),
        generator=generator, trace=torch.full((bsz, gen_length), -1, dtype=torch.long, device=device),
        padded=any(len(r) < lp for r in rows), finished=torch.zeros(bsz, dtype=torch.bool, device=device),
    )


def decode_answer(tokenizer, ids: list[int], eos_ids: Sequence[int], mask_id: int) -> str:
    """Text of generated ids, cut at the first EOS/EoT, special tokens skipped.

    Ids past the tokenizer's vocabulary (embedding rows kept for alignment, e.g. LLaDA's 126464
    rows for 126349 tokens) have no text and are dropped.
    """
    for i, t in enumerate(ids):
        if t in eos_ids:
            ids = ids[:i]
            break
    n_tokens = len(tokenizer)
    return tokenizer.decode([t for t in ids if t != mask_id and t < n_tokens], skip_special_tokens=True)


def check_call(model, callback) -> None:
    """The call arguments that are not decode settings (``dllm.settings``)."""
    if not callable(model) or not hasattr(model, "mask_id"):
        raise TypeError(f"model must be a dllm DiffusionLM (from dllm.load(name_or_path)), got "
                        f"{type(model).__name__} {model!r:.80}")
    if callback is not None and not callable(callback):
        raise TypeError(f"callback must be callable (it is called with the DecodeState after every "
                        f"step) or None, got {type(callback).__name__} {callback!r:.80}")


def fit_layers(layers: Sequence[int], model) -> tuple[int, ...]:
    """A sampler's layer request fitted to the model's depth: negative indices count from the last
    layer and are clamped to the first ("the last 4 layers" of a 2-layer model are its 2 layers)."""
    n = getattr(getattr(model, "config", None), "n_layers", None)
    if not layers or n is None:
        return tuple(layers)
    fitted: list[int] = []
    for i in layers:
        j = max(i, -n) if i < 0 else i
        j = j % n if -n <= j < n else j  # out-of-range positive indices are left for the model's error
        if j not in fitted:
            fitted.append(j)
    return tuple(fitted)
