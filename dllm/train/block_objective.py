"""The block-diffusion SFT objective for block-causal models (SDAR, arXiv 2510.06303; the block
diffusion likelihood of BD3-LM, Arriola et al., arXiv 2503.09573, section 3).

A block-causal model attends bidirectionally inside a block of ``block_size`` positions and causally
across blocks (block of position p = ``p // block_size`` on the RoPE positions, the grid decoding
uses). Decoding fills one block at a time with every earlier block clean, so each training row
samples the state of one decoding step:

1. pick the row's current block ``c`` uniformly among the blocks holding answer tokens;
2. draw ``t ~ U(0, 1)``, ``p = (1 - eps) t + eps`` (LLaDA's form) and mask every answer token of
   block ``c`` independently with probability ``p``; earlier blocks (prompt and answer) stay clean;
3. loss = ``(1 / B) sum_b [ sum_{i masked} CE_i / p_b ] / n_b`` with ``n_b`` the answer tokens of
   the row's block ``c``: the LLaDA estimator of one block's negative log likelihood given the
   clean blocks before it.

Blocks after ``c`` hold clean answer tokens, but the block-causal mask hides them from block ``c``
(and no loss is taken on them), so the model never learns from a future it cannot see at decoding.
"""

from __future__ import annotations

from typing import Optional

import torch

from dllm.train.objective import MASK_EPS, LossOutput, diffusion_loss, mask_probability, sft_loss


def position_blocks(positions: torch.Tensor, block_size: int) -> torch.Tensor:
    """positions [B, L] long -> the grid block of each position [B, L] long (``p // block_size``)."""
    return torch.div(positions, block_size, rounding_mode="floor")


def pick_block(
    blocks: torch.Tensor,  # [B, L] long, grid block of each position
    answer_mask: torch.Tensor,  # [B, L] bool
    u: torch.Tensor,  # [B] float in [0, 1)
) -> torch.Tensor:
    """The current block of each row [B] long: uniform over the blocks holding answer tokens (the
    answer is one contiguous span, so those blocks are ``first .. last``). A row without answer tokens
    gets block -1 (no position matches it)."""
    big = torch.iinfo(blocks.dtype).max
    first = blocks.masked_fill(~answer_mask, big).amin(dim=1)  # [B]
    last = blocks.masked_fill(~answer_mask, -1).amax(dim=1)  # [B]
    n = (last - first + 1).clamp_min(1)  # [B]
    pick = first + (u * n).long().clamp_max(n - 1)  # [B]
    return torch.where(last >= 0, pick, torch.full_like(pick, -1))


def mask_current_block(
    ids: torch.Tensor,  # [B, L] long, clean tokens
    answer_mask: torch.Tensor,  # [B, L] bool
    positions: torch.Tensor,  # [B, L] long RoPE positions
    block_size: int,
    generator: Optional[torch.Generator] = None,
    *,
    mask_id: int,
    eps: float = MASK_EPS,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """Noise one block per row: returns (noisy [B, L], masked [B, L] bool, p [B], in_block [B, L] bool:
    the answer tokens of the row's current block). Uniforms are drawn on the generator's device."""
    b, l = ids.shape
    gen_device = generator.device if generator is not None else torch.device("cpu")
    t = torch.rand(b, generator=generator, device=gen_device)  # [B]
    c = torch.rand(b, generator=generator, device=gen_device)  # [B] block choice
    u = torch.rand(b, l, generator=generator, device=gen_device)  # [B, L]
    blocks = position_blocks(positions, block_size)  # [B, L]
    current = pick_block(blocks, answer_mask, c.to(ids.device))  # [B]
    in_block = answer_mask & (blocks == current[:, None])  # [B, L]
    p = mask_probability(t, eps).to(ids.device)  # [B]
    masked = (u.to(ids.device) < p[:, None]) & in_block  # [B, L]
    return ids.masked_fill(masked, mask_id), masked, p, in_block


def block_diffusion_loss(
    model: torch.nn.Module,
    input_ids: torch.Tensor,  # [B, L] clean tokens
    answer_mask: torch.Tensor,  # [B, L] bool
    key_padding_mask: Optional[torch.Tensor] = None,  # [B, L] bool, True = real token
    positions: Optional[torch.Tensor] = None,  # [B, L] long RoPE positions (None: 0 .. L-1)
    generator: Optional[torch.Generator] = None,
    *,
    eps: float = MASK_EPS,
) -> LossOutput:
    """One block per row noised (module docstring), the model's block-causal forward, the LLaDA
    estimator over that block. ``model.config.block_size`` is the grid."""
    block_size = model.config.block_size
    if not model.config.block_causal or not block_size:
        raise ValueError(f"block_diffusion_loss needs a block-causal model (attention='block_causal' with a "
                         f"block_size), got attention={model.config.attention!r}")
    if positions is None:
        positions = torch.arange(input_ids.shape[1], device=input_ids.device).expand_as(input_ids)
    noisy, masked, p, in_block = mask_current_block(input_ids, answer_mask, positions, block_size, generator,
                                                    mask_id=model.mask_id, eps=eps)
    logits = model(noisy, positions=positions, key_padding_mask=key_padding_mask).logits  # [B, L, V]
    loss = sft_loss(logits, input_ids, masked, p, in_block.sum(dim=1).clamp_min(1))
    return LossOutput(loss, noisy, masked, p, logits)


def training_loss(model: torch.nn.Module):
    """The objective a model trains with: block diffusion for a block-causal model, LLaDA's masked
    diffusion (``diffusion_loss``) for a bidirectional one."""
    return block_diffusion_loss if getattr(model.config, "block_causal", False) else diffusion_loss


__all__ = ["block_diffusion_loss", "mask_current_block", "pick_block", "position_blocks", "training_loss"]
