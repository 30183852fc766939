"""Reference transcription of the KLASS authors' LLaDA decoder (shkim0116/KLASS
``src/model/llada_klass.py`` ``stable_confident_decode`` with ``alg="klass"``, at ad87ecb; arXiv
2511.05664), restated from the public code for ``dllm``'s tests; no code copied.

Per block (semi-autoregressive, ``steps / #blocks`` steps each, LLaDA's ``get_num_transfer_tokens``
schedule) and per step, until the block has no masks:

1. one full forward; ``p = softmax(float64(logits))`` (of the Gumbel-perturbed logits at T > 0),
   ``x0 = argmax p``, ``c = p[x0]``;
2. ``KL = sum p (log(p + 1e-12) - log(p_prev + 1e-12))`` at every canvas position, rolled into a
   canvas-wide [1, L, H] history; ``p_prev = p``. ``p_prev`` starts as zeros, the history as zeros,
   and neither is reset between blocks;
3. stable = every KL of the history ``< kappa``, tested only from the block's step ``H - 1`` on;
   ready = stable & ``c > tau_conf`` & masked in the current block;
4. commit the ready positions (``unmask="all"``; ``"max_conf"`` / ``"min_kl"``: the ready one with
   the largest confidence / smallest current KL, first index on ties), or, when none is ready, the
   top ``n[step]`` masks of the block by confidence (``torch.topk``).

This is an *oracle*: dtypes, the eps of the KL and the ``torch.topk`` call are as in the original.
Differences, inert for what is tested:

* the model is ``model_fn(x) -> logits [1, L, V]``; the mask id is a parameter (the original
  overwrites its argument with 126336); the step logging and the ``random`` unmask strategy are
  omitted;
* ``forbid_mask_commit=True`` raises :class:`~.llada_generate.MaskCommitError` when a committed
  proposal is the mask id (``dllm`` never proposes it).

Returns ``(x, forwards)``.
"""

from __future__ import annotations

from typing import Callable

import torch
import torch.nn.functional as F

from .fastdllm_generate import add_gumbel_noise, get_num_transfer_tokens
from .llada_generate import MaskCommitError

__all__ = ["klass_generate"]


@torch.no_grad()
def klass_generate(
    model_fn: Callable[[torch.Tensor], torch.Tensor],
    prompt: torch.Tensor,
    *,
    gen_length: int,
    steps: int,
    block_length: int,
    temperature: float = 0.0,
    mask_id: int = 126336,
    conf_threshold: float = 0.9,
    kl_threshold: float = 0.01,
    kl_history_length: int = 2,
    unmask_strategy: str = "all",
    forbid_mask_commit: bool = False,
) -> tuple[torch.Tensor, int]:
    assert prompt.shape[0] == 1, "the original decodes one prompt"
    lp = prompt.shape[1]
    x = torch.full((1, lp + gen_length), mask_id, dtype=torch.long, device=prompt.device)
    x[:, :lp] = prompt.clone()
    assert gen_length % block_length == 0
    num_blocks = gen_length // block_length
    assert steps % num_blocks == 0
    steps_per_block = steps // num_blocks

    forwards = 0
    kl_history = None  # zeros [1, L, H] float64, allocated once the vocabulary is known
    p_prev = None  # zeros [1, L, V] float64
    for block in range(num_blocks):
        start = lp + block * block_length
        end = start + block_length
        schedule = get_num_transfer_tokens(x[:, start:end] == mask_id, steps_per_block)
        for step in range(steps_per_block):
            in_block = torch.zeros_like(x, dtype=torch.bool)
            in_block[:, start:end] = True
            mask_index = (x == mask_id) & in_block
            if not mask_index[:, start:end].any():
                break

            logits = model_fn(x)
            forwards += 1
            if kl_history is None:
                kl_history = torch.zeros((1, x.shape[1], kl_history_length), dtype=torch.float64)
                p_prev = torch.zeros((1, x.shape[1], logits.shape[-1]), dtype=torch.float64)
            if temperature > 0:
                logits = add_gumbel_noise(logits, temperature)
            p_curr = F.softmax(logits.to(torch.float64), dim=-1)
            x0 = torch.argmax(p_curr, dim=-1)
            conf = torch.gather(p_curr, -1, x0.unsqueeze(-1)).squeeze(-1)

            eps = 1e-12
            kl = (p_curr * (torch.log(p_curr + eps) - torch.log(p_prev + eps))).sum(dim=-1)
            kl_history = torch.roll(kl_history, shifts=-1, dims=-1)
            kl_history[..., -1] = kl
            p_prev = p_curr.clone()

            if step >= kl_history_length - 1:
                stable = torch.all(kl_history < kl_threshold, dim=-1)
            else:
                stable = torch.zeros_like(conf, dtype=torch.bool)
            ready = stable & (conf > conf_threshold) & mask_index

            transfer = torch.zeros_like(x0, dtype=torch.bool)
            ready_idx = torch.where(ready[0])[0]
            if len(ready_idx) > 0:
                if len(ready_idx) > 1 and unmask_strategy == "max_conf":
                    best = torch.argmax(conf[0, ready_idx])
                    ready_idx = ready_idx[best:best + 1]
                elif len(ready_idx) > 1 and unmask_strategy == "min_kl":
                    best = torch.argmin(kl[0, ready_idx])
                    ready_idx = ready_idx[best:best + 1]
                transfer[0, ready_idx] = True
            else:
                conf[:, end:] = -torch.inf
                masked_conf = torch.where(mask_index, conf, -torch.inf)
                _, chosen = torch.topk(masked_conf[0], k=int(schedule[0, step]))
                transfer[0, chosen] = True
            if forbid_mask_commit and bool((x0[transfer] == mask_id).any()):
                raise MaskCommitError(f"KLASS reference would commit the mask id (block {block}, step {step})")
            x[transfer] = x0[transfer]
    return x, forwards
