"""Reference transcription of DMax's soft parallel decoding (czg1225/DMax, arXiv 2604.08302):
``BlockDiffusionLLM.naive_batching_generate_uniform`` and ``BlockDiffusionRunner.decode_uniform``
(``dInfer/python/dinfer/decoding/generate_uniform.py``), ``ThresholdParallelDecoder.decode_uniform``,
``get_transfer_index_uniform`` and ``_get_prob_stats`` (``parallel_strategy.py``), restated for
``dllm``'s tests over the transcribed LLaDA 2 modelling (tests/reference/modelling/llada2_modeling.py);
no code copied.

Kept as in the original: the canvas of ``ceil((prompt + gen) / block) * block`` positions, blocks on
the grid from position 0 (the first decoded block holds the prompt's tail), block-causal attention;
per block, ``active`` = its masks at the start, at most ``block_length`` forwards; per forward the
arg-max x0 of the block's logits (greedy: the release's evaluations decode at temperature 0) and
its float32 probability p; the masks before the first mask with ``p < threshold`` (else the leftmost
mask) are decoded and every decoded active position is rewritten with x0 (``curr_x[update_mask] =
x0``); the block ends when every active p is ``>= 0.9`` or the step changed no token; else the next
forward's block inputs are the previous ones with the decoded active positions replaced by ``p E[x0]
+ (1 - p) E[mask]`` rescaled to ``p |E[x0]| + (1 - p) |E[mask]|`` (``+ 1e-6`` under the division;
the norms in the embedding dtype, the mixture in float32), and positions that changed but are not
soft re-embedded from their token; after a block holding ``eos_id``, the rest of the canvas is
``eos_id`` and decoding stops (``early_stop``). The arg-max may be the mask id, as there (the tests
give the mask a zero LM-head row so that it never is: dllm's sampler never proposes it).

Differences, inert for what is tested: batch 1 (the release's ``.any()`` / ``.all()`` conditions
are over the batch); the release runs each block's forwards on its KV cache (the finished blocks'
keys/values recomputed from their final tokens by the next block's first forward, then the block's
rows against them); here each forward is the canvas up to the block's end under the block-causal
mask, whose block rows attend to exactly the same keys and values. ``inputs_embeds`` is passed
through ``forward_embeds``, the official model's ``inputs_embeds`` path (the word embeddings
skipped) over the transcribed modelling, which takes ids only.
"""

from __future__ import annotations

from typing import Optional

import torch


def forward_embeds(model, embeds: torch.Tensor, attention_mask: torch.Tensor,
                   position_ids: torch.Tensor) -> torch.Tensor:
    """Logits [1, T, V] of the LLaDA 2 reference model from input embeddings [1, T, D]."""
    h = embeds
    pe = model.model.rotary_emb(h, position_ids)
    for layer in model.model.layers:
        h = layer(h, attention_mask, pe)
    return model.lm_head(model.model.norm(h)).float()


def _prob_stats(logits: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Greedy ``_get_prob_stats``: (arg-max [1, W], its float32 probability [1, W])."""
    x0 = torch.argmax(logits, dim=-1)
    z = logits.to(torch.float32)
    log_norm = torch.logsumexp(z, dim=-1)
    chosen = torch.gather(z, dim=-1, index=x0.unsqueeze(-1)).squeeze(-1)
    return x0, torch.exp(chosen - log_norm)


def transfer_index_uniform(p: torch.Tensor, mask_index: torch.Tensor, threshold: float) -> torch.Tensor:
    """``get_transfer_index_uniform``'s selection: masks before the first low-confidence mask, else
    the first mask."""
    confidence = torch.where(mask_index, p, float("-inf"))
    is_low = mask_index & (confidence < threshold)
    failed = torch.cumsum(is_low.long(), dim=1) > 0
    candidates = mask_index & ~failed
    has = candidates.any(dim=-1, keepdim=True)
    first = (torch.cumsum(mask_index.long(), dim=1) == 1) & mask_index
    return torch.where(has, candidates, first)


def decode_uniform(logits, curr_x, active, embed, prev, threshold: float, mask_id: int):
    """One step on the block: writes ``curr_x`` (a view of the canvas) in place; returns (stop,
    the block's next input embeddings [1, W, D])."""
    mask_index = curr_x == mask_id
    x0, p = _prob_stats(logits)
    high = transfer_index_uniform(p, mask_index, threshold)
    update = (high | (active & ~mask_index)) if mask_index.any() else active
    changed = update & (x0 != curr_x)
    if update.any():
        curr_x[update] = x0[update]
    if (p[active] >= 0.9).all() or not changed.any():
        return True, prev
    soft = active & ~(curr_x == mask_id)
    if prev is None:
        base = embed(curr_x)
    else:
        base = prev
        refresh = ~soft & changed
        if refresh.any():
            base[refresh] = embed(curr_x[refresh])
    if not soft.any():
        return False, base
    top_p, top_i = p.unsqueeze(-1), x0.unsqueeze(-1)  # top_k = 1: the arg-max
    residual = torch.clamp(1.0 - top_p.sum(dim=-1, keepdim=True), min=0.0)
    top_e = embed(top_i)  # [1, W, 1, D]
    mask_e = embed(torch.tensor([mask_id], device=curr_x.device)).unsqueeze(0)  # [1, 1, D]
    mask_norm = torch.norm(mask_e, p=2, dim=-1, keepdim=True)
    mixed = (top_e * top_p.unsqueeze(-1)).sum(dim=2) + mask_e * residual
    norm = torch.norm(mixed, p=2, dim=-1, keepdim=True)
    target = (torch.norm(top_e, p=2, dim=-1) * top_p).sum(dim=-1, keepdim=True) + mask_norm * residual
    mixed = mixed * (target / (norm + 1e-6))
    base[soft] = mixed.to(base.dtype)[soft]
    return False, base


@torch.no_grad()
def dmax_generate(model, inputs: torch.Tensor, *, block_length: int = 32, gen_length: int = 2048,
                  threshold: float = 0.5, mask_id: int = 156895, eos_id: int = 156892, early_stop: bool = True,
                  nfe: Optional[list] = None) -> torch.Tensor:
    """The release's loop on one prompt [1, n]; returns the final canvas [1, total] (the release returns
    it with every eos_id removed). ``nfe`` (a test hook) receives the number of forwards."""
    n = inputs.shape[1]
    num_blocks = (n + gen_length + block_length - 1) // block_length
    total = num_blocks * block_length
    blocks = torch.tril(torch.ones(num_blocks, num_blocks))
    attn = blocks.repeat_interleave(block_length, 0).repeat_interleave(block_length, 1)[None, None].bool()
    pos = torch.arange(total)[None]
    x = torch.full((1, total), mask_id, dtype=torch.long)
    x[:, :n] = inputs
    embed = model.model.word_embeddings
    forwards = 0
    for b in range(n // block_length, num_blocks):
        s, e = b * block_length, (b + 1) * block_length
        active = x[:, s:e] == mask_id
        embeds = None
        for _ in range(block_length):
            h = embed(x[:, :e]) if embeds is None else torch.cat([embed(x[:, :s]), embeds], dim=1)
            logits = forward_embeds(model, h, attn[:, :, :e, :e], pos[:, :e])[:, s:e]
            forwards += 1
            stop, embeds = decode_uniform(logits, x[:, s:e], active, embed, embeds, threshold, mask_id)
            if stop:
                break
        if early_stop and (x[:, s:e] == eos_id).any():
            x[:, e:] = eos_id
            break
    if nfe is not None:
        nfe.append(forwards)
    return x
