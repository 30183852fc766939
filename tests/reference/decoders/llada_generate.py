"""Reference transcription of LLaDA's ``generate()`` (ML-GSAI/LLaDA ``generate.py``, HEAD 65cbed2).

Restated from the public source; the numbered comments below follow the steps of the original
loop.  This is an *oracle*: every operation that can
influence the result (dtypes, the order and shape of random draws, in-place writes and aliasing,
``torch.topk`` on a full row) is kept as in the original.  Differences from the original, all of
which are inert for the behaviour being tested:

* the model is a callable ``model_fn(x, attention_mask) -> logits [B, L, V]`` instead of an HF
  module with ``.logits``;
* the EOS / EoT ids are parameters (the original hard-codes 126081 / 126348);
* CFG without an ``attention_mask`` works (the original raises ``UnboundLocalError`` there because
  the doubled mask is only defined when a mask is given); the doubled mask is ``None`` then;
* ``fix_eos_bug=True`` applies the fix of ML-GSAI/LLaDA#137 (PR #139): with
  ``confidence_eos_eot_inf`` both EOS and EoT columns are removed from the logits used for the
  confidence, at every temperature.  With the default ``False`` the original behaviour is kept
  (at T > 0 only EoT is removed);
* ``forbid_mask_commit=True`` raises :class:`MaskCommitError` when a committed proposal is the mask
  id itself (the original silently leaves such a position masked; ``dllm`` never proposes the mask
  id, so equality tests use this flag to detect -- and avoid -- that case);
* ``forbid_ties=True`` raises :class:`AmbiguousTieError` when a per-row ``torch.topk`` selection is
  decided by tie order (equal confidences straddling the cut), which is unspecified and which other
  correct implementations may break differently.
  Neither flag ever changes a result; they only raise.
"""

from __future__ import annotations

from typing import Callable, Optional

import torch
import torch.nn.functional as F

__all__ = [
    "AmbiguousTieError",
    "MaskCommitError",
    "ambiguous_topk",
    "llada_generate",
    "llada_transfer_schedule",
]

ModelFn = Callable[[torch.Tensor, Optional[torch.Tensor]], torch.Tensor]


class MaskCommitError(RuntimeError):
    """A reference sampler was about to commit the mask id itself (see ``forbid_mask_commit``)."""


class AmbiguousTieError(RuntimeError):
    """A ``torch.topk`` selection of a reference sampler depended on tie order (``forbid_ties``)."""


def ambiguous_topk(values: torch.Tensor, chosen: torch.Tensor) -> bool:
    """True if the top-k ``chosen`` indices of the 1-D ``values`` are not determined by the values.

    That is the case when an unchosen entry equals the smallest chosen value (``torch.topk``'s
    order among equal values is unspecified, so another implementation may pick differently), or
    when a chosen value is -inf (a filler pick among non-candidates).
    """
    if chosen.numel() == 0:
        return False
    kth = values[chosen].min()
    if bool(torch.isneginf(kth)):
        return True
    unchosen = torch.ones_like(values, dtype=torch.bool)
    unchosen[chosen] = False
    return bool((values[unchosen] == kth).any())


def llada_transfer_schedule(block_mask: torch.Tensor, steps: int) -> torch.Tensor:
    """Integer number of tokens to commit per step, per row (``get_num_transfer_tokens``).

    ``block_mask``: bool [B, BL], True where the current block is still masked.  Returns an int64
    tensor [B, steps] with ``n[j, i] = m_j // steps + (1 if i < m_j % steps else 0)`` where ``m_j``
    is the mask count of row ``j``; each row sums to ``m_j``.
    """
    counts = block_mask.sum(dim=1, keepdim=True)  # [B, 1]
    base = counts // steps
    extra = counts % steps
    schedule = torch.zeros(counts.size(0), steps, device=block_mask.device, dtype=torch.int64) + base
    for row in range(counts.size(0)):
        schedule[row, : extra[row]] += 1
    return schedule


@torch.no_grad()
def llada_generate(
    model_fn: ModelFn,
    prompt: torch.Tensor,
    attention_mask: Optional[torch.Tensor] = None,
    steps: int = 128,
    gen_length: int = 128,
    block_length: int = 128,
    temperature: float = 0.0,
    cfg_scale: float = 0.0,
    remasking: str = "low_confidence",
    mask_id: int = 126336,
    logits_eos_inf: bool = False,
    confidence_eos_eot_inf: bool = False,
    eos_id: int = 126081,
    eot_id: int = 126348,
    *,
    fix_eos_bug: bool = False,
    forbid_mask_commit: bool = False,
    forbid_ties: bool = False,
) -> torch.Tensor:
    """Run LLaDA's reference sampler; returns the canvas ``x`` [B, Lp + gen_length] (prompt included).

    ``model_fn(x, attention_mask)`` must return logits [B', L, V] for a [B', L] input (B' is 2B
    under CFG).  ``attention_mask`` is handed through unchanged except that ``gen_length`` ones are
    appended (and it is doubled on the batch under CFG); it may be ``None``.

    Random draws (only on the default generator, in this order, once per step):
      1. if ``temperature > 0``: ``torch.rand_like`` of the float64 copy of the (CFG-combined)
         logits, shape [B, L, V], over the whole canvas;
      2. if ``remasking == "random"``: ``torch.rand((B, L))`` float32.
    Nothing is drawn at ``temperature == 0`` with ``low_confidence``.
    """
    batch, prompt_len = prompt.shape
    device = prompt.device

    # 1. canvas: prompt followed by gen_length mask tokens; extend the attention mask with ones.
    x = torch.full((batch, prompt_len + gen_length), mask_id, dtype=torch.long, device=device)
    x[:, :prompt_len] = prompt.clone()
    if attention_mask is not None:
        ones = torch.ones((batch, gen_length), dtype=attention_mask.dtype, device=device)
        attention_mask = torch.cat([attention_mask, ones], dim=-1)

    # 2. everything that is not a mask at the start counts as prompt (pads included).
    prompt_index = x != mask_id

    # 3. whole blocks, equal number of steps per block.
    assert gen_length % block_length == 0, "gen_length must be a multiple of block_length"
    num_blocks = gen_length // block_length
    assert steps % num_blocks == 0, "steps must be a multiple of the number of blocks"
    steps_per_block = steps // num_blocks

    # 4. blocks, left to right.
    for block in range(num_blocks):
        block_start = prompt_len + block * block_length
        block_end = prompt_len + (block + 1) * block_length
        # 4.1-4.2 schedule from the masks actually present in this block now.
        schedule = llada_transfer_schedule(x[:, block_start:block_end] == mask_id, steps_per_block)

        for step in range(steps_per_block):
            # 4.3.1 still-masked map over the whole canvas.
            masked = x == mask_id

            # 4.3.2 logits, optionally with classifier-free guidance on a doubled batch.
            if cfg_scale > 0.0:
                uncond_x = x.clone()
                uncond_x[prompt_index] = mask_id
                both = torch.cat([x, uncond_x], dim=0)
                both_mask = (
                    torch.cat([attention_mask, attention_mask], dim=0)
                    if attention_mask is not None
                    else None
                )
                both_logits = model_fn(both, both_mask)
                cond_logits, uncond_logits = torch.chunk(both_logits, 2, dim=0)
                logits = uncond_logits + (cfg_scale + 1) * (cond_logits - uncond_logits)
            else:
                logits = model_fn(x, attention_mask)

            # 4.3.3 ban EOS from the proposals (in place; EoT untouched).
            if logits_eos_inf:
                logits[:, :, eos_id] = -torch.inf

            # 4.3.4 Gumbel-max in float64.  At T == 0 the "noisy" tensor IS the logits tensor.
            if temperature == 0:
                noisy = logits
            else:
                logits64 = logits.to(torch.float64)
                uniform = torch.rand_like(logits64, dtype=torch.float64)
                noisy = logits64.exp() / (-torch.log(uniform)) ** temperature

            # 4.3.5 proposals.
            proposal = torch.argmax(noisy, dim=-1)  # [B, L]

            # 4.3.6 `noisy[:, :, EOS] = logits[:, :, EoT] = -inf` (Python assigns left target
            # first).  At T == 0 both writes land on the logits; at T > 0 the EOS write lands on
            # the float64 copy and is lost (ML-GSAI/LLaDA#137) unless fix_eos_bug.
            if confidence_eos_eot_inf:
                if fix_eos_bug:
                    logits[:, :, eos_id] = -torch.inf
                    logits[:, :, eot_id] = -torch.inf
                else:
                    noisy[:, :, eos_id] = -torch.inf
                    logits[:, :, eot_id] = -torch.inf

            # 4.3.7 confidence of each proposal.
            if remasking == "low_confidence":
                probs = F.softmax(logits, dim=-1)  # logits dtype
                confidence0 = torch.gather(probs, dim=-1, index=proposal.unsqueeze(-1)).squeeze(-1)
            elif remasking == "random":
                confidence0 = torch.rand((proposal.shape[0], proposal.shape[1]), device=proposal.device)
            else:
                raise NotImplementedError(remasking)

            # 4.3.8 nothing to the right of the current block.
            confidence0[:, block_end:] = -torch.inf

            # 4.3.9 keep committed tokens; only masked positions compete.
            proposal = torch.where(masked, proposal, x)
            confidence = torch.where(masked, confidence0, -torch.inf)

            # 4.3.10 per row, commit the n[j, step] most confident positions.
            transfer = torch.zeros_like(proposal, dtype=torch.bool, device=proposal.device)
            for row in range(confidence.shape[0]):
                _, chosen = torch.topk(confidence[row], k=int(schedule[row, step]))
                if forbid_ties and ambiguous_topk(confidence[row], chosen):
                    raise AmbiguousTieError(
                        f"LLaDA reference: tie at the top-k cut (block {block}, step {step}, row {row})"
                    )
                transfer[row, chosen] = True
            if forbid_mask_commit and bool((proposal[transfer] == mask_id).any()):
                raise MaskCommitError(
                    f"LLaDA reference would commit the mask id (block {block}, step {step})"
                )
            x[transfer] = proposal[transfer]

    # 5.
    return x
