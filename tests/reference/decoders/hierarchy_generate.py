"""Reference transcription of dInfer's hierarchical decoder and of the block loop that drives it
(inclusionAI/dInfer at fce4e32; arXiv 2510.08666), restated from the public code for ``dllm``'s tests;
no code copied:

* the rule: ``python/dinfer/decoding/parallel_strategy.py`` ``HierarchyDecoder.get_transfer_index``
  and ``HierarchyDecoder.decode``;
* the loop: ``python/dinfer/decoding/generate_uniform.py`` ``BlockWiseDiffusionLLM.generate``,
  ``BlockRunner.decode`` (batch 1), ``BaseDiffusionIteration.forward`` (``use_shift=False``) and
  ``ShiftDiffusionIteration.forward`` (``use_shift=True``: logit row ``i - 1`` predicts position ``i``);
  for LLaDA 2, ``BlockDiffusionLLMAttnmask.generate``, ``BlockDiffusionRunner.decode`` and
  ``BlockDiffusionIteration.forward`` without a cache, with ``utils.py``'s ``BlockDiffusionIterator``;
* the layout and the cache policy: ``python/dinfer/decoding/utils.py`` ``BlockIterator`` (the
  factory's default ``start_block_align=False``: blocks start at the prompt's end, the last may be
  shorter), ``DiffusionKVCacheManager`` (``cache_update_freq=None``: the cache is rebuilt by one full
  forward when a block starts) and ``add_gumbel_noise``.

One step (``get_transfer_index``, one row; ``c`` = ``exp(log_softmax(logits))`` at the arg-max, in the
logits dtype; ``finfo.min`` off the masks): the block's masks split into maximal contiguous runs, each
run keeps EVERY position equal to its maximum if ``c > low_threshold``; ``or`` every ``c > threshold``;
``or`` the block's first arg-max (``torch.argmax`` of ``c``); ``and`` the masks. A proposal equal to the
mask id is committed too (the position stays masked).

The loop: per block, while it has masks, ``unroll`` iterations (``max(min(masks // expected_tpf,
maximum_unroll), 1)``) run WITHOUT a completion test, so a forward may find its block full (it commits
nothing). An iteration with a cache first runs a full forward and decodes from it when the block is new
(the cache is that forward's K/V), then always one cached forward over the block (``dual``: queries
``x[s:e]``, the cached K/V with ``[s, e)`` replaced; ``prefix``: queries ``x[s:]``, ``[s, L)`` replaced)
and decodes from it. After a block holding ``eos_id`` the loop ends; ``early_stop`` (the scripts'
setting) fills every later position with ``eos_id``, without it they stay masked.

Differences, inert for what is tested:

* the model is called as dInfer calls it, ``model(ids, past_key_values=..., use_cache=...,
  replace_position=(start, end))`` with ``.logits`` / ``.past_key_values`` on the result; over a
  ``dllm`` LLaDA model that is :class:`DInferLLaDA`, Fast-dLLM's restated forward
  (``fastdllm_generate.FastDLLMLLaDA``, the same attention, RoPE and cache semantics as dInfer's
  ``modeling_llada.py``: ``slice_scatter`` of ``[start, end)``, queries rotated at ``[end - q, end)``);
* the block-diffusion path (:func:`hierarchy_generate_bd`) is the class without a cache
  (``BlockDiffusionLLMAttnmask``; ``BlockDiffusionLLM`` reads the earlier blocks' K/V from a cache, the
  same attention) and passes the block-causal mask as a bool [1, 1, T, T] (dInfer: a 0/1 [1, T, T]);
* the canvas is a tensor, not a ``TokenArray``; the answer is returned as the whole canvas (dInfer's
  ``get_generated_tokens`` drops every ``eos_id`` of a batch-1 canvas);
* the count of forwards that found a mask in their block is returned next to dInfer's count;
* ``forbid_mask_commit=True`` raises :class:`~.llada_generate.MaskCommitError` where the original would
  commit the mask id; ``forbid_ties=True`` raises :class:`~.llada_generate.AmbiguousTieError` where a
  decision rests on equal confidences (several run maxima kept, or a shared arg-max), which an
  implementation with another confidence dtype or tie rule resolves otherwise. Neither changes a
  result.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from types import SimpleNamespace
from typing import Any, Optional

import torch
import torch.nn.functional as F

from .fastdllm_generate import FastDLLMLLaDA
from .llada_generate import AmbiguousTieError, MaskCommitError

__all__ = ["DInferLLaDA", "HierarchyRule", "hierarchy_generate", "hierarchy_generate_bd", "hierarchy_transfer_index",
           "logits_model"]


class DInferLLaDA:
    """dInfer's call convention over Fast-dLLM's restated LLaDA forward (module docstring):
    ``replace_position=(start, end)`` replaces cached columns ``[start, end)`` out of place."""

    def __init__(self, model) -> None:
        self.inner = FastDLLMLLaDA(model)
        self.device = self.inner.device

    def __call__(self, ids: torch.Tensor, past_key_values=None, use_cache: bool = False,
                 replace_position: Optional[tuple[int, int]] = None) -> Any:
        if replace_position is None:
            return self.inner(ids, past_key_values=past_key_values, use_cache=use_cache)
        start, end = replace_position
        cached = [(k.clone(), v.clone()) for k, v in past_key_values]  # slice_scatter: the cache is kept
        where = torch.zeros(ids.shape[0], cached[0][0].shape[2], dtype=torch.bool, device=ids.device)
        where[:, start:end] = True
        return self.inner(ids, past_key_values=cached, use_cache=use_cache, replace_position=where)


def add_gumbel_noise(logits: torch.Tensor, temperature: float) -> torch.Tensor:
    """dInfer's float64 Gumbel-max perturbation; the logits themselves at T == 0."""
    if math.isclose(temperature, 0.0):
        return logits
    logits = logits.to(torch.float64)
    noise = torch.rand_like(logits, dtype=torch.float64)
    return logits.exp() / (-torch.log(noise)) ** temperature


@dataclass(frozen=True)
class HierarchyRule:
    """``HierarchyDecoder``'s options (its defaults: ``threshold=None``, ``low_threshold=0.4``)."""

    temperature: float = 0.0
    threshold: Optional[float] = None
    low_threshold: Optional[float] = 0.4
    forbid_ties: bool = False


def _check_ties(confidence: torch.Tensor, mask: torch.Tensor, seg: torch.Tensor, run_max: torch.Tensor,
                rule: HierarchyRule) -> None:
    """``forbid_ties``: raise where equal confidences decide (module docstring). [1, W] each."""
    high = confidence > rule.threshold if rule.threshold is not None else torch.zeros_like(mask)  # [1, W]
    low = confidence > rule.low_threshold if rule.low_threshold is not None else torch.ones_like(mask)  # [1, W]
    kept = mask & (confidence == run_max) & low & ~high  # [1, W] kept by the run rule alone
    if bool((torch.bincount(seg[kept], minlength=1) > 1).any()):
        raise AmbiguousTieError("dInfer hierarchy reference: a run keeps several tied maxima")
    top = mask & (confidence == confidence.max())  # [1, W]
    if int(top.sum()) > 1 and not bool((high | low)[top].all()):
        raise AmbiguousTieError("dInfer hierarchy reference: the block's arg-max is tied")


def hierarchy_transfer_index(logits: torch.Tensor, mask_index: torch.Tensor,
                             rule: HierarchyRule) -> tuple[torch.Tensor, torch.Tensor]:
    """``HierarchyDecoder.get_transfer_index``: logits [1, W, V], mask_index [1, W] bool ->
    (x0 [1, W], transfer [1, W] bool, before the ``& mask`` of ``decode``)."""
    b, w = mask_index.shape
    assert b == 1, "dInfer's hierarchy decoder asserts batch 1"
    noisy = add_gumbel_noise(logits, rule.temperature)
    x0 = torch.argmax(noisy, dim=-1)  # [1, W]
    x0_p = F.log_softmax(logits, dim=-1).gather(-1, x0.unsqueeze(-1)).squeeze(-1).exp()  # [1, W] logits dtype
    floor = torch.finfo(x0_p.dtype).min
    confidence = torch.where(mask_index, x0_p, torch.tensor(floor, dtype=x0_p.dtype))  # [1, W]
    before = torch.cat([mask_index.new_zeros((b, 1)), mask_index[:, :-1]], dim=1)
    starts = mask_index & ~before  # [1, W] first position of each run
    seg = torch.where(mask_index, torch.cumsum(starts.long(), dim=-1) - 1, 0)  # [1, W] run index
    seg_max = torch.full((b, w), floor, dtype=confidence.dtype)
    seg_max = torch.scatter_reduce(seg_max, 1, seg, confidence, reduce="amax", include_self=True)
    run_max = seg_max.gather(1, seg)  # [1, W]
    transfer = confidence == run_max  # every position equal to its run's maximum
    if rule.low_threshold is not None:
        transfer = transfer & (confidence > rule.low_threshold)
    if rule.threshold is not None:
        transfer = transfer | (confidence > rule.threshold)
    top1 = F.one_hot(torch.argmax(confidence, dim=-1), num_classes=w).bool()  # [1, W]
    if rule.forbid_ties and bool(mask_index.any()):
        _check_ties(confidence, mask_index, seg, run_max, rule)
    return x0, transfer | top1


def _decode(logits: torch.Tensor, x: torch.Tensor, start: int, end: int, rule: HierarchyRule,
            mask_id: int, forbid_mask_commit: bool) -> bool:
    """``HierarchyDecoder.decode`` on canvas columns ``[start, end)`` of ``x`` [1, L] (in place);
    logits [1, end - start, V]. Returns whether the block had a mask. ``rule``: the hierarchy's
    options, or another dInfer decoder with its own ``decode(logits, x, start, end, mask_id,
    forbid_mask_commit)`` (the loops take any decoder, as dInfer's do: ``credit_generate``)."""
    if not isinstance(rule, HierarchyRule):
        return rule.decode(logits, x, start, end, mask_id, forbid_mask_commit)
    block = x[:, start:end]  # a view: commits land in x
    mask_index = block == mask_id  # [1, W]
    assert mask_index.shape[1] == logits.shape[1]
    x0, transfer = hierarchy_transfer_index(logits, mask_index, rule)
    transfer = transfer & mask_index
    if forbid_mask_commit and bool((x0[transfer] == mask_id).any()):
        raise MaskCommitError(f"dInfer hierarchy reference would commit the mask id (block at {start})")
    block[transfer] = x0[transfer]
    return bool(mask_index.any())


@torch.no_grad()
def hierarchy_generate(model, prompt: torch.Tensor, *, gen_length: int, block_length: int, mask_id: int,
                       eos_id: int, rule: HierarchyRule = HierarchyRule(), cache: Optional[str] = None,
                       early_stop: bool = True, maximum_unroll: int = 4, expected_tpf: int = 8,
                       use_shift: bool = False, forbid_mask_commit: bool = False) -> tuple[torch.Tensor, int, int]:
    """``BlockWiseDiffusionLLM(model, HierarchyDecoder(...), BlockIteratorFactory(), cache_factory,
    early_stop, maximum_unroll, expected_tpf, use_shift).generate(prompt, gen_length, block_length)``.
    prompt [1, Lp]; ``cache``: None, ``"prefix"`` or ``"dual"``. Returns (canvas [1, Lp + G], dInfer's
    forward count, the forwards that found a mask in their block)."""
    assert cache in (None, "prefix", "dual")
    lp, total = prompt.shape[1], prompt.shape[1] + gen_length
    x = torch.full((1, total), mask_id, dtype=torch.long, device=prompt.device)  # [1, L]
    x[:, :lp] = prompt
    shift = 1 if use_shift else 0
    forwards = decoding = 0
    cached: Optional[list] = None  # the block's K/V (dInfer: rebuilt when the block changes)
    for start in range(lp, total, block_length):  # BlockIterator
        end = min(start + block_length, total)
        s, e = start - shift, end - shift  # the logit rows of the block (ShiftDiffusionIteration)
        fresh = True
        while bool((x[:, start:end] == mask_id).any()):  # BlockRunner.decode
            unroll = int(max(min(int((x[:, start:end] == mask_id).sum()) // expected_tpf, maximum_unroll), 1))
            for _ in range(unroll):
                if cache is not None and fresh:  # require_update: a new block
                    out = model(x, use_cache=True)
                    forwards += 1
                    decoding += _decode_shifted(out.logits[:, s:e], x, start, end, shift, rule, mask_id,
                                                forbid_mask_commit)
                    cached, fresh = out.past_key_values, False
                if cache is None:
                    logits = model(x).logits[:, s:e]
                elif cache == "prefix":
                    logits = model(x[:, s:], past_key_values=cached, use_cache=True,
                                   replace_position=(s, cached[0][0].shape[2])).logits[:, :e - s]
                else:
                    logits = model(x[:, s:e], past_key_values=cached, use_cache=True, replace_position=(s, e)).logits
                forwards += 1
                decoding += _decode_shifted(logits, x, start, end, shift, rule, mask_id, forbid_mask_commit)
        if bool((x[:, start:end] == eos_id).any()):  # the row's answer is complete
            if early_stop:
                x[:, end:] = eos_id
            break  # BlockWiseDiffusionLLM.generate stops with or without early_stop
    return x, forwards, decoding


def _decode_shifted(logits: torch.Tensor, x: torch.Tensor, start: int, end: int, shift: int, rule: HierarchyRule,
                    mask_id: int, forbid_mask_commit: bool) -> int:
    """``decoder.decode`` on the canvas (shift 0) or on ``x[:, 1:]`` (shift 1: dInfer decodes a shifted
    copy and writes it back, the same columns). Returns 1 if the block had a mask."""
    view = x[:, shift:]
    return int(_decode(logits, view, start - shift, end - shift, rule, mask_id, forbid_mask_commit))


@torch.no_grad()
def hierarchy_generate_bd(model, prompt: torch.Tensor, *, gen_length: int, block_length: int, mask_id: int,
                          eos_id: int, rule: HierarchyRule = HierarchyRule(), early_stop: bool = True,
                          maximum_unroll: int = 4, expected_tpf: int = 8,
                          forbid_mask_commit: bool = False) -> tuple[torch.Tensor, int, int]:
    """``BlockDiffusionLLMAttnmask(model, HierarchyDecoder(...), BlockIteratorFactory(use_block_diffusion=True),
    early_stop, maximum_unroll, expected_tpf).generate(prompt, gen_length, block_length)`` (LLaDA 2's
    block-causal path, no cache): the canvas is rounded up to whole blocks of the grid from column 0,
    the first decoded block holds the prompt's tail (``BlockDiffusionIterator``), every forward reads
    ``x[:, :end]`` under the block-causal mask (``model(ids, attention_mask=[1, 1, T, T] bool,
    position_ids=...)``), and ``BlockDiffusionRunner`` unrolls at least 2 iterations. Returns as
    :func:`hierarchy_generate`."""
    lp = prompt.shape[1]
    blocks = (lp + gen_length + block_length - 1) // block_length
    total = blocks * block_length
    grid = torch.tril(torch.ones(blocks, blocks))
    attn = grid.repeat_interleave(block_length, 0).repeat_interleave(block_length, 1)[None, None].bool()  # [1, 1, T, T]
    pos = torch.arange(total)[None]  # [1, T]
    x = torch.full((1, total), mask_id, dtype=torch.long, device=prompt.device)
    x[:, :lp] = prompt
    first = int((prompt != mask_id).sum(dim=-1).min()) // block_length * block_length
    forwards = decoding = 0
    for start in range(first, total, block_length):
        end = min(start + block_length, total)
        while bool((x[:, start:end] == mask_id).any()):
            unroll = int(max(min(int((x[:, start:end] == mask_id).sum()) // expected_tpf, maximum_unroll), 2))
            for _ in range(unroll):
                logits = model(x[:, :end], attention_mask=attn[:, :, :end, :end], position_ids=pos[:, :end]).logits
                forwards += 1
                decoding += int(_decode(logits[:, start:end], x, start, end, rule, mask_id, forbid_mask_commit))
        if bool((x[:, start:end] == eos_id).any()):
            if early_stop:
                x[:, end:] = eos_id
            break
    return x, forwards, decoding


def logits_model(fn) -> Any:
    """A cacheless dInfer-convention model from ``fn(ids) -> logits [1, L, V]``."""
    return lambda ids, **_: SimpleNamespace(logits=fn(ids), past_key_values=None)
