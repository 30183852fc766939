"""What a ``generate`` call leaves behind: rows that stop at EOS, and the ``GenerationOutput``."""

from __future__ import annotations

import torch

from dllm.inputs import decode_answer
from dllm.rows import release_rows
from dllm.state import DecodeState, GenerationOutput


def stop_finished_rows(state: DecodeState) -> bool:
    """Once per block: rows whose answer ended are finished; True when all are.

    A row's answer has ended when it holds an EOS/EoT with no mask before it in the generated
    region. That is every EOS of the decoded blocks, and also one that an all-in sampler (Prophet)
    committed past the current block together with everything before it: a row alone stops at that
    block, so in a batch it must stop there too (its remaining masks become EOS at once, instead of
    the all-in fill of a later block's query).
    """
    eos_ids = state.extras.get("eos_ids", ())
    if not eos_ids:
        return False
    gen = state.generated  # [B, G]
    is_eos = torch.isin(gen, torch.tensor(eos_ids, device=gen.device))  # [B, G]
    masked = (gen == state.mask_id).long()  # [B, G]
    masks_before = masked.cumsum(dim=1) - masked  # [B, G] masks strictly left of each position
    state.finished |= (is_eos & (masks_before == 0)).any(dim=1)  # [B]
    finished = state.finished.tolist()  # one host sync per block
    release_rows(state, [r for r, done in enumerate(finished) if done])  # their masks -> EOS, forwards skip them
    return all(finished)


def finish_output(model, state: DecodeState, wall: float, return_trace: bool) -> GenerationOutput:
    gen = state.generated  # [B, G]
    eos_ids = state.extras.get("eos_ids", ())
    committed = state.trace >= 0
    if eos_ids:
        is_eos = torch.isin(gen, torch.tensor(eos_ids, device=gen.device))
        before_eos = (is_eos.long().cumsum(dim=1) == 0)  # [B, G] True before the first EOS
        content = (before_eos & committed).sum()
    else:
        content = committed.sum()
    generated_tokens, content_tokens = torch.stack([committed.sum(), content]).tolist()  # one read
    texts = None
    tokenizer = getattr(model, "tokenizer", None)
    if tokenizer is not None:
        texts = [decode_answer(tokenizer, row, eos_ids, state.mask_id) for row in gen.tolist()]  # one read
    return GenerationOutput(
        sequences=state.x, prompt_length=state.prompt_length, texts=texts, nfe=state.nfe,
        steps=state.step, forwarded_tokens=state.forwarded_tokens,
        generated_tokens=generated_tokens, content_tokens=content_tokens, wall_time=wall,
        trace=state.trace if return_trace else None,
    )


__all__ = ["finish_output", "stop_finished_rows"]
