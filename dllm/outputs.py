"""What a ``generate`` call leaves behind: rows that stop at EOS, and the ``GenerationOutput``."""

from __future__ import annotations

import torch

from dllm.inputs import decode_answer
from dllm.rows import release_rows
from dllm.state import DecodeState, GenerationOutput

_EOS_TENSOR = "eos_ids_tensor"  # state.extras: the EOS ids on the device, made once per call
_ENDED_UNREAD = "blocks_ended_unread"  # state.extras: blocks a step ended without a read (fills_block)


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


def ended_unread(state: DecodeState) -> list[tuple[int, int]]:
    """The call's blocks ``(start, end)`` that a step ended without a read (``StepOutput.fills_block``),
    appended to by the block loop; ``finish_output`` checks them in its one read."""
    return state.extras.setdefault(_ENDED_UNREAD, [])


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
    checks = [committed.sum(), content]
    ended = state.extras.get(_ENDED_UNREAD)
    if ended:  # blocks a sampler ended without a read: their masks left, which must be none
        checks.append(sum((state.x[:, s:e] == state.mask_id).sum() for s, e in ended))
    counts = torch.stack(checks)  # [2 or 3]
    tokenizer = getattr(model, "tokenizer", None)
    host = torch.cat([counts, gen.flatten()]).tolist()  # the call's one read: counts and every row's ids
    generated_tokens, content_tokens = host[:2]
    if ended and host[2]:
        raise RuntimeError(f"{host[2]} masks are left in blocks whose last step said it ended them "
                           f"(StepOutput.fills_block, blocks {ended}); the sampler broke its contract")
    n, width = len(checks), gen.shape[1]
    ids = [host[n + r * width:n + (r + 1) * width] for r in range(gen.shape[0])]
    texts = None
    if tokenizer is not None:
        texts = [decode_answer(tokenizer, row, eos_ids, state.mask_id) for row in ids]
    return GenerationOutput(
        sequences=state.x, prompt_length=state.prompt_length, texts=texts, nfe=state.nfe,
        steps=state.step, forwarded_tokens=state.forwarded_tokens,
        generated_tokens=generated_tokens, content_tokens=content_tokens, wall_time=wall,
        trace=state.trace if return_trace else None, generated_ids=ids,
    )


__all__ = ["ended_unread", "eos_tensor", "finish_output", "stop_finished_rows"]
