"""What a ``generate`` call leaves behind: rows that stop at EOS, and the ``GenerationOutput``."""

from __future__ import annotations

import torch

from dllm.inputs import decode_answer
from dllm.rows import release_rows
from dllm.state import DecodeState, GenerationOutput

_EOS_TENSOR = "eos_ids_tensor"  # state.extras: the EOS ids on the device, made once per call


def stop_finished_rows(state: DecodeState) -> bool:
    """Once per block: rows whose answer ended are finished; True when all are.

    A row's answer has ended when it holds an EOS/EoT with no mask before it in the generated
    region. That is every EOS of the decoded blocks, and also one that an all-in sampler (Prophet)
    committed past the current block together with everything before it: a row alone stops at that
    block, so in a batch it must stop there too (its remaining masks become EOS at once, instead of
    the all-in commit of a later block's query).
    """
    eos_ids = state.extras.get("eos_ids", ())
    if not eos_ids:
        return False
    gen = state.generated  # [B, G]
    is_eos = torch.isin(gen, eos_tensor(state))  # [B, G]
    masked = (gen == state.mask_id).long()  # [B, G]
    masks_before = masked.cumsum(dim=1) - masked  # [B, G] masks strictly left of each position
    state.finished |= (is_eos & (masks_before == 0)).any(dim=1)  # [B]
    finished = state.finished.tolist()  # one host sync per block
    release_rows(state, [r for r, done in enumerate(finished) if done])  # their masks -> EOS, forwards skip them
    return all(finished)


def eos_tensor(state: DecodeState) -> torch.Tensor:
    """The call's EOS/EoT ids on its device, made once per call (``state.extras["eos_ids"]``)."""
    t = state.extras.get(_EOS_TENSOR)
    if t is None:
        ids = state.extras.get("eos_ids", ())  # filled on the device: no upload of host data
        t = torch.cat([torch.full((1,), int(i), dtype=torch.long, device=state.x.device) for i in ids]) if ids \
            else torch.zeros(0, dtype=torch.long, device=state.x.device)
        state.extras[_EOS_TENSOR] = t
    return t


def finish_output(model, state: DecodeState, wall: float, return_trace: bool) -> GenerationOutput:
    gen = state.generated  # [B, G]
    eos_ids = state.extras.get("eos_ids", ())
    committed = state.trace >= 0
    if eos_ids:
        is_eos = torch.isin(gen, eos_tensor(state))
        before_eos = (is_eos.long().cumsum(dim=1) == 0)  # [B, G] True before the first EOS
        content = (before_eos & committed).sum()
    else:
        content = committed.sum()
    counts = torch.stack([committed.sum(), content])  # [2]
    tokenizer = getattr(model, "tokenizer", None)
    host = torch.cat([counts, gen.flatten()]).tolist()  # the call's one read: counts and every row's ids
    generated_tokens, content_tokens = host[:2]
    width = gen.shape[1]
    ids = [host[2 + r * width:2 + (r + 1) * width] for r in range(gen.shape[0])]
    texts = None
    if tokenizer is not None:
        texts = [decode_answer(tokenizer, row, eos_ids, state.mask_id) for row in ids]
    return GenerationOutput(
        sequences=state.x, prompt_length=state.prompt_length, texts=texts, nfe=state.nfe,
        steps=state.step, forwarded_tokens=state.forwarded_tokens,
        generated_tokens=generated_tokens, content_tokens=content_tokens, wall_time=wall,
        trace=state.trace if return_trace else None, generated_ids=ids,
    )


__all__ = ["eos_tensor", "finish_output", "stop_finished_rows"]
