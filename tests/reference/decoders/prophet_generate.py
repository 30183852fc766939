"""Reference transcription of Prophet's early-exit LLaDA decoder (pixeli99/Prophet ``generate_earlyexit.py``,
``generate`` and ``should_early_exit``, at 460afe4; arXiv 2508.19982), restated from the public code for
``dllm``'s tests; no code copied.

The original loop: LLaDA's semi-autoregressive ``low_confidence`` decoder (``steps / #blocks`` steps per
block, ``get_num_transfer_tokens`` schedule), with, at every step and BEFORE that step's commit:

1. ``global_step += 1`` (1-based, counted over all blocks); one full forward; proposals ``x0 =
   argmax(logits)`` (of the float64 Gumbel-perturbed logits at T > 0, noise over the whole canvas);
2. if an answer position is given (``answer_start_pos``, canvas coordinates) and the exit has not
   fired: the gap ``top1 - top2`` of the raw logits (in the logits dtype, read with ``.item()``) at each
   of the ``answer_length`` positions from it (clipped at the canvas end; committed or not), their mean
   in Python floats (float64);
3. ``should_early_exit``: progress ``global_step / steps``, threshold early (7.5) while it is < 0.33,
   mid (5.0) while < 0.67, else late (2.5); exit when the mean gap >= threshold;
4. on exit every remaining mask of the canvas (every block) takes its proposal of this step and the
   decoder stops: the exit step's forward is its last;
5. otherwise the usual LLaDA commit: ``softmax(logits)[x0]`` (logits dtype) as confidence, nothing right
   of the block, ``torch.topk`` of the schedule's count among the masks.

This is an *oracle*: the dtypes, the order of the exit check and the commit, the float64 mean and the
``torch.topk`` call are as in the original. Differences, inert for what is tested:

* the model is ``model_fn(x) -> logits [1, L, V]``; the mask id is a parameter;
* Gumbel noise is drawn from ``generator`` (``torch.rand`` of the same float64 shape, the same stream as
  the original's ``torch.rand_like`` on a generator seeded alike);
* the constraint tokens (``constraints``), CFG, ``remasking="random"``, timing and the printed / returned
  exit info beyond the exit step are omitted (``dllm``'s ``prophet`` has no constraints);
* ``forbid_mask_commit=True`` raises :class:`~.llada_generate.MaskCommitError` when a committed or
  filled proposal is the mask id (the original would leave it masked; ``dllm`` never proposes it);
* ``forbid_ties=True`` raises :class:`~.llada_generate.AmbiguousTieError` when a ``torch.topk``
  selection depends on tie order.

Returns ``(x, forwards, exit_step)``: the canvas [1, P + gen_length], the forwards run and the 1-based
step that fired (None when it never did).
"""

from __future__ import annotations

from typing import Callable, Optional

import torch
import torch.nn.functional as F

from .llada_generate import AmbiguousTieError, MaskCommitError, ambiguous_topk, llada_transfer_schedule

__all__ = ["prophet_generate", "should_early_exit"]

DEFAULT_THRESHOLDS = {"early": 7.5, "mid": 5.0, "late": 2.5}


def should_early_exit(current_step: int, max_steps: int, answer_gap: Optional[float],
                      thresholds: Optional[dict] = None) -> bool:
    """The phase-aware rule: progress ``current_step / max_steps`` picks early / mid / late."""
    if answer_gap is None:
        return False
    thresholds = DEFAULT_THRESHOLDS if thresholds is None else thresholds
    progress = current_step / max_steps
    if progress < 0.33:
        return answer_gap >= thresholds.get("early", 7.5)
    if progress < 0.67:
        return answer_gap >= thresholds.get("mid", 5.0)
    return answer_gap >= thresholds.get("late", 2.5)


def _answer_gap(logits: torch.Tensor, prompt_len: int, answer_start_pos: int, answer_length: int) -> Optional[float]:
    """Mean top-2 gap (Python float) over the answer positions, None when none is on the canvas."""
    total = logits.shape[1]
    gaps = []
    for pos in range(answer_start_pos, min(total, answer_start_pos + answer_length)):
        if prompt_len <= pos < total:
            top2 = torch.topk(logits[:, pos, :], k=2, dim=-1).values  # [1, 2], logits dtype
            gaps.append((top2[0, 0] - top2[0, 1]).item())
    return sum(gaps) / len(gaps) if gaps else None


@torch.no_grad()
def prophet_generate(
    model_fn: Callable[[torch.Tensor], torch.Tensor],
    prompt: torch.Tensor,
    *,
    steps: int,
    gen_length: int,
    block_length: int,
    mask_id: int,
    temperature: float = 0.0,
    answer_start_pos: Optional[int] = None,
    answer_length: int = 5,
    thresholds: Optional[dict] = None,
    generator: Optional[torch.Generator] = None,
    forbid_mask_commit: bool = True,
    forbid_ties: bool = True,
) -> tuple[torch.Tensor, int, Optional[int]]:
    """prompt [1, P] -> (canvas [1, P + gen_length], forwards, exit step or None)."""
    assert prompt.shape[0] == 1, "the original decodes one prompt"
    p = prompt.shape[1]
    x = torch.full((1, p + gen_length), mask_id, dtype=torch.long)
    x[:, :p] = prompt
    assert gen_length % block_length == 0
    num_blocks = gen_length // block_length
    assert steps % num_blocks == 0
    steps_per_block = steps // num_blocks
    global_step, forwards = 0, 0

    for nb in range(num_blocks):
        block_end = p + (nb + 1) * block_length
        schedule = llada_transfer_schedule(x[:, block_end - block_length:block_end] == mask_id, steps_per_block)
        for i in range(steps_per_block):
            global_step += 1
            masked = x == mask_id  # [1, L]
            logits = model_fn(x)  # [1, L, V]
            forwards += 1
            if temperature == 0:
                noisy = logits
            else:
                logits64 = logits.to(torch.float64)
                uniform = torch.rand(logits64.shape, dtype=torch.float64, generator=generator)
                noisy = logits64.exp() / (-torch.log(uniform)) ** temperature
            x0 = torch.argmax(noisy, dim=-1)  # [1, L]
            conf0 = torch.gather(F.softmax(logits, dim=-1), -1, x0[..., None]).squeeze(-1)  # [1, L]

            # exit check, before this step's commit
            if answer_start_pos is not None:
                gap = _answer_gap(logits, p, answer_start_pos, answer_length)
                if should_early_exit(global_step, steps, gap, thresholds):
                    if forbid_mask_commit and bool((x0[masked] == mask_id).any()):
                        raise MaskCommitError(f"prophet reference would fill the mask id (step {global_step})")
                    x[masked] = x0[masked]
                    return x, forwards, global_step

            conf0[:, block_end:] = -torch.inf
            x0 = torch.where(masked, x0, x)
            conf = torch.where(masked, conf0, -torch.inf)
            take = torch.zeros_like(x0, dtype=torch.bool)
            k = int(schedule[0, i])
            if k > 0:
                chosen = torch.topk(conf[0], k=k).indices
                if forbid_ties and ambiguous_topk(conf[0], chosen):
                    raise AmbiguousTieError(f"prophet reference: tie at the top-k cut (step {global_step})")
                take[0, chosen] = True
            if forbid_mask_commit and bool((x0[take] == mask_id).any()):
                raise MaskCommitError(f"prophet reference would commit the mask id (step {global_step})")
            x[take] = x0[take]
    return x, forwards, None
