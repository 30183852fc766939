"""Reference transcription of the DUS authors' dilated scheduler (omerlux/DUS ``generate.py``
``generate_scheduled`` with ``scheduler='dilated'``, ``dilated_unmask_levels`` and ``merge_last_level``;
the same in the stored versions c917168 and abd7723; arXiv 2506.19037), restated from the public code for
``dllm``'s tests; no code copied. The README runs it as ``scheduler=dilated, base=2, base_skip=1,
confidence_threshold=0.3, remasking=low_confidence``, ``temperature=0``, on LLaDA, and on Dream /
DiffuCoder with the logits shifted by one (``eval_mdlm.py`` ``logits_shift_fix``).

The schedule of a block ``[s, e]`` (inclusive; ``B = e - s + 1``): the stride starts at
``B // base^skip`` and is divided by ``base`` (integer division) while it is >= 1; each stride makes a
level of the not yet listed positions i with ``(i - s) % stride == 0`` (empty levels dropped); what is
left forms a last level; then a last level smaller than the one before is merged into it. B = 8:
{s, s+4}, {s+2, s+6}, {s+1, s+3, s+5, s+7}.

The loop: per block, per level: stop if the canvas has no mask; one full forward; ``x0 = argmax`` of the
logits (of the float64 Gumbel-perturbed logits at T > 0, drawn over the canvas); every position of the
level that is still masked takes ``x0``; then, unless ``remasking='none'`` or this is the block's last
level, every position of the level whose confidence ``softmax(float64(logits))[x0]`` (the perturbed
logits at T > 0) is below ``confidence_threshold`` is masked again -- and never revisited: later levels
list other positions, so it stays masked in the result.

This is an *oracle*: the schedule, the order of commit and remasking and the dtypes are as in the original.
Differences, inert for what is tested:

* the model is ``model_fn(x) -> logits [1, L, V]`` (shifted already for Dream); the mask id is a
  parameter; CFG, the ``binary`` scheduler, ``high_entropy`` remasking, the unmasking-stage record and the
  stop strings (which need a tokenizer; without one the original never stops early) are omitted;
* the uniforms are drawn over the whole canvas as in the original, ``torch.rand`` of shape [1, L, V] on
  ``generator``;
* ``forbid_mask_commit=True`` raises :class:`~.llada_generate.MaskCommitError` where a committed proposal
  is the mask id (the original leaves the position masked; ``dllm`` never proposes it).

Returns ``(x, forwards)``: the canvas [1, Lp + gen_length] and the number of forwards.
"""

from __future__ import annotations

from typing import Callable, Optional

import torch
import torch.nn.functional as F

from .llada_generate import MaskCommitError
from .localleap_generate import gumbel_noisy

__all__ = ["dilated_levels", "dus_generate", "merge_last_level"]


def dilated_levels(start: int, end: int, base: int = 2, skip_exp: int = 1) -> list[list[int]]:
    """``dilated_unmask_levels``: the coarse-to-fine levels of the positions ``start..end`` (inclusive)."""
    assert base >= 1 and skip_exp >= 1
    if base == 1:
        return [list(range(start, end + 1))]
    stride = (end - start + 1) // base**skip_exp
    levels: list[list[int]] = []
    revealed: set[int] = set()
    while stride >= 1:
        level = [i for i in range(start, end + 1) if (i - start) % stride == 0 and i not in revealed]
        if level:
            levels.append(level)
            revealed.update(level)
        stride //= base
    rest = [i for i in range(start, end + 1) if i not in revealed]
    if rest:
        levels.append(rest)
    return levels


def merge_last_level(levels: list[list[int]]) -> list[list[int]]:
    """``merge_last_level``: a last level smaller than the one before joins it (in place, returned)."""
    if len(levels) >= 2 and len(levels[-1]) < len(levels[-2]):
        levels[-2].extend(levels[-1])
        levels.pop()
    return levels


@torch.no_grad()
def dus_generate(
    model_fn: Callable[[torch.Tensor], torch.Tensor],
    prompt: torch.Tensor,
    *,
    gen_length: int,
    block_length: int,
    mask_id: int,
    temperature: float = 0.0,
    remasking: str = "low_confidence",
    confidence_threshold: float = 0.3,
    base: int = 2,
    base_skip: int = 1,
    generator: Optional[torch.Generator] = None,
    forbid_mask_commit: bool = False,
) -> tuple[torch.Tensor, int]:
    """prompt [1, Lp] -> (canvas [1, Lp + gen_length], forwards)."""
    assert prompt.shape[0] == 1, "the original decodes one prompt"
    assert remasking in ("low_confidence", "none")
    lp = prompt.shape[1]
    x = torch.full((1, lp + gen_length), mask_id, dtype=torch.long)
    x[:, :lp] = prompt
    assert gen_length % block_length == 0
    forwards = 0
    for start in range(lp, lp + gen_length, block_length):
        levels = merge_last_level(dilated_levels(start, start + block_length - 1, base, base_skip))
        for step, level in enumerate(levels):
            if not bool((x == mask_id).any()):
                break
            logits = model_fn(x)  # [1, L, V]
            forwards += 1
            logits = gumbel_noisy(logits, temperature, generator)
            x0 = torch.argmax(logits, dim=-1)  # [1, L]
            for pos in level:
                if int(x[0, pos]) == mask_id:
                    if forbid_mask_commit and int(x0[0, pos]) == mask_id:
                        raise MaskCommitError(f"DUS reference would commit the mask id (position {pos})")
                    x[0, pos] = x0[0, pos]
            if remasking != "none" and step < len(levels) - 1:
                p = F.softmax(logits.to(torch.float64), dim=-1)
                conf = torch.gather(p, -1, x0.unsqueeze(-1)).squeeze(-1)  # [1, L] float64
                for pos in level:
                    if conf[0, pos] < confidence_threshold:
                        x[0, pos] = mask_id
    return x, forwards
