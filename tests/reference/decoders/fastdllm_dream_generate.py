"""Reference transcription of Fast-dLLM's Dream ``confidence_threshold`` algorithm (NVlabs/Fast-dLLM
``dream/model/generation_utils.py``, ``_sample`` with ``alg='confidence_threshold'``; the repository
HEAD of June 2025, 24cc59e), restated from the public code for ``dllm``'s tests; no code copied.

No blocks, no cache, batch 1 (the original asserts it). The step schedule caps the commits:

* ``q = #masks / steps`` (the original asserts that the mask count is a multiple of ``steps``),
  ``carry = 0``;
* every step: one forward (with Dream's shift), ``sample_tokens`` on the masked rows (confidence =
  the probability of the proposal, softmax in the logits dtype); ``torch.topk`` of the [1, L]
  confidence (-inf off the masks) with ``q + carry`` entries; rank 0 is always committed, every
  later rank whose confidence is ``< threshold`` is dropped and counted into the next step's
  carry. If that happens at the last step, the step count grows by one (once per step, however
  many ranks are dropped) and the quota becomes 0, so the extra steps take exactly the carried
  masks: the plain threshold rule until no mask is left.

This is an *oracle*: the ``torch.topk`` call, the dtypes and the random draws (``sample_tokens`` at
T > 0) are as in the original. Differences, inert for what is tested:

* the model is ``model_fn(x, attention_mask, tok_idx) -> RAW logits`` as in
  :mod:`.dream_generate` (called with ``None, None``: no padding in batch 1); the hooks, history and
  timing prints are omitted;
* ``forbid_mask_commit=True`` raises :class:`~.llada_generate.MaskCommitError` when a committed
  proposal is the mask id (``dllm`` never proposes it).

Returns ``(x, nfe)``: the canvas [1, Lp + max_new_tokens] and the number of forwards.
"""

from __future__ import annotations

from typing import Optional

import torch
import torch.nn.functional as F

from .dream_generate import ModelFn, dream_sample_tokens
from .llada_generate import MaskCommitError

__all__ = ["fastdllm_dream_threshold_generate"]


@torch.no_grad()
def fastdllm_dream_threshold_generate(
    model_fn: ModelFn,
    input_ids: torch.Tensor,
    *,
    max_new_tokens: int,
    steps: int,
    threshold: float = 0.9,
    temperature: float = 0.0,
    top_p: Optional[float] = None,
    top_k: Optional[int] = None,
    mask_id: int = 151666,
    forbid_mask_commit: bool = False,
) -> tuple[torch.Tensor, int]:
    x = F.pad(input_ids, (0, max_new_tokens), value=mask_id)
    masked = x == mask_id
    assert int(masked.sum()) % steps == 0, "the mask count must be a multiple of steps"
    assert x.shape[0] == 1, "batch size must be 1"
    quota = int(masked.sum()) // steps
    carry = 0

    i = 0
    while i < steps:
        masked = x == mask_id
        raw = model_fn(x, None, None)
        logits = torch.cat([raw[:, :1], raw[:, :-1]], dim=1)  # Dream's shift
        confidence, proposal = dream_sample_tokens(logits[masked], temperature=temperature, top_p=top_p,
                                                   top_k=top_k)
        candidates = torch.full_like(x, mask_id)
        candidates[masked] = proposal.clone()
        full_conf = torch.full_like(x, -torch.inf, dtype=logits.dtype)
        full_conf[masked] = confidence

        take = quota + carry
        carry = 0
        chosen_conf, chosen = torch.topk(full_conf, take)
        transfer = torch.zeros_like(x, dtype=torch.bool)
        transfer[0, chosen[0]] = True
        for rank in range(1, take):
            if chosen_conf[0, rank] < threshold:
                if i >= steps - 1:  # the last step rejected a token: one more step, no new quota
                    quota = 0
                    steps += 1
                carry += 1
                transfer[0, chosen[0, rank]] = False
        if forbid_mask_commit and bool((candidates[transfer] == mask_id).any()):
            raise MaskCommitError(f"Fast-dLLM Dream reference would commit the mask id (step {i})")
        x[transfer] = candidates[transfer].clone()
        i += 1
    return x, i
