"""``subblock``: Fast-dLLM v2's sub-block cache (arXiv 2509.26328; ``use_block_cache=True`` of
``Fast_dLLM_QwenForCausalLM.generate`` in the HF folder Efficient-Large-Model/Fast_dLLM_v2_7B
``modeling.py``), an approximation on top of the exact ``block`` cache, for ``sampler="fastdllm_v2"``.

The finished blocks' keys/values are exact, as in ``block``. Inside the current grid block ``[g, e)``
the official loop keeps a second, block-level cache: a step forwards the whole block when the block
has no such cache yet or when the current sub-block's first column is still a mask; otherwise it
forwards the current sub-block ``[a, a + sbs)`` alone, writes its fresh K/V into the block's cache
in place, and attends to the finished blocks plus the whole block cache, whose other sub-blocks keep
the K/V of the last full forward (or of their own last sub-block forward): stale, hence approximate.

Here the call's K/V buffers are that block cache: a query ``[a, a + sbs)`` writes its rows in place
and attends to ``[0, e)``, exactly the official computation. The steps:

- the block's first step: as ``block`` (the previous grid block's final K/V and this block);
- on a shifted model whose block starts on the grid (the block's first column is generated and
  committed alone at step 0), step 1 too: the official block-cache fill after that token;
- later: the sub-block alone when every row's first mask lies in the same sub-block and no row has
  that sub-block's first column masked, else the whole block (from ``g - 1`` on a shifted model).

The sub-block width is the sampler's (``small_block_size``, recorded by ``fastdllm_v2`` in
``state.extras``). Other samplers read logits outside the sub-block and are refused, and so are
verification variants (a variant could not reproduce a step whose query depends on the canvas).
Deciding the query reads the block's masks back to the host once per step.
"""

from __future__ import annotations

from typing import Optional

import torch

from dllm.cache.base import Query, register_cache
from dllm.cache.block_causal import BlockCausalCache, block_size_of
from dllm.schedule import SUB_BLOCK_KEY, grid_start
from dllm.state import DecodeState


def current_sub_block(masks: torch.Tensor, sbs: int) -> Optional[int]:
    """masks [B, W] bool over a grid block -> the index of the sub-block holding every row's first mask
    (rows without masks ignored), or None when the rows disagree or no row has a mask."""
    w = masks.shape[1]
    col = torch.arange(w, device=masks.device)
    first = torch.where(masks, col, w).min(dim=1).values  # [B]
    first = first[first < w]
    if first.numel() == 0:
        return None
    subs = (first // sbs).unique()
    return int(subs[0]) if subs.numel() == 1 else None  # a host read: the query's shape depends on it


@register_cache("subblock", description="Fast-dLLM v2's sub-block cache (approximate): exact finished "
                "blocks, the current sub-block forwarded against the block's last K/V")
class SubBlockCache(BlockCausalCache):
    """Fast-dLLM v2 use_block_cache: full block forwards while the sub-block's first column is masked,
    then the sub-block alone against the block's cached K/V."""

    def check(self, model, *, block_length: int, gen_length: int) -> None:
        if block_size_of(model) is None:
            raise ValueError(f"cache 'subblock' is Fast-dLLM v2's sub-block cache of a block-causal model; "
                             f"{getattr(model, 'display_name', type(model).__name__)} attends bidirectionally; "
                             f"use cache 'none' or an approximate policy ('prefix', 'dual', 'window', 'drift')")
        super().check(model, block_length=block_length, gen_length=gen_length)

    def query(self, state: DecodeState, block_step: int, shift: int) -> Query:
        full = super().query(state, block_step, shift)
        s, e = state.block_start, state.block_end
        g = grid_start(state, s)
        first_token_step = bool(shift) and g == s  # step 0 committed the block's first column alone
        if block_step <= (1 if first_token_step else 0):
            return full
        sbs = state.extras.get(SUB_BLOCK_KEY)
        if sbs is None:
            raise ValueError("cache 'subblock' needs the sub-block width of sampler 'fastdllm_v2' "
                             "(state.extras has none); use sampler 'fastdllm_v2' or cache 'block'")
        masks = state.x[:, g:e] == state.mask_id  # [B, W]
        k = current_sub_block(masks, sbs)
        if k is None:
            return full
        a = g + k * sbs
        if bool(masks[:, k * sbs].any()):  # the sub-block's first column is a mask: the whole block
            return full
        return Query(a, min(a + sbs, e), e)

    def sampler_refusal(self, sampler) -> Optional[str]:
        if sampler.name != "fastdllm_v2":
            return ("reads logits outside the current sub-block, which cache 'subblock' forwards alone at "
                    "most steps (Fast-dLLM v2's use_block_cache); use sampler 'fastdllm_v2', or cache "
                    "'block' (exact)")
        return super().sampler_refusal(sampler)

    def variant_refusal(self) -> Optional[str]:
        return ("its query depends on the canvas (the sub-block alone or the whole block), so a "
                "verification variant could not reproduce the step it stands for; use cache 'block'")


__all__ = ["SubBlockCache", "current_sub_block"]
