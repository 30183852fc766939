"""Reference transcription of Fast-dLLM v1's factor mode (NVlabs/Fast-dLLM ``llada/generate.py`` at
f6b35ec): the selection routine ``get_transfer_index_dynamic`` and the ``factor is not None`` path of
``generate``, ``generate_with_prefix_cache`` and ``generate_with_dual_cache``. Written for ``dllm``'s
tests, restated from the public code; no code copied.

``fastdllm_generate.py`` transcribes the same drivers with the fixed / threshold rule only and takes no
rule as a parameter, so the three drivers are restated here with the factor rule in its place; the
model wrapper (``FastDLLMLLaDA``: Fast-dLLM's modified LLaDA forward and its cache semantics) and the
float64 Gumbel-max (``add_gumbel_noise``) are imported from it.

The rule, per row (``num_transfer_tokens`` is unused: the factor path passes ``None``): ``x0`` is the
arg-max of the (Gumbel-perturbed) logits, its confidence the float64 softmax probability (``-inf`` off
``mask_index``); with N the row's masks, the thresholds are ``1 - factor / (n + 1)`` for n = 1..N as
Python floats, the first replaced by -1 (top-1 always); the masks' confidences sorted descending are
walked until the first rank ``top_i`` (0-based) below its threshold; ``top_i`` is incremented when it
is 0 or N - 1, and ``torch.topk`` of the whole row with ``k = top_i`` is committed. The increment at
N - 1 covers the walk that never breaks (every rank passes: commit N) but ALSO a walk that breaks at
the last rank: then the failing last rank is committed too (the rule as written would commit N - 1).
That quirk is kept here; ``last_rank_quirk=False`` (not in the original) drops it, which is the rule
as the paper and its README line state it ("the longest prefix with (k + 1)(1 - c_k) <= f").

The loops of the later version (f6b35ec): no cache loops until the block has no masks (one forward
per step); the cached drivers' block-start full forward makes the first update, then the completion
test comes BEFORE every cached forward; the prefix driver's extra, discarded Gumbel draw is kept.
The factor path never reads ``steps`` (only the fixed schedule does), so it is not a parameter here.

Differences from the original, inert for what is tested:

* the model is ``FastDLLMLLaDA`` (see ``fastdllm_generate.py``) instead of ``LLaDAModelLM``;
* ``step_callback`` is omitted; ``steps`` is dropped (unused by this path, see above);
* ``forbid_mask_commit=True`` raises ``MaskCommitError`` when a committed proposal is the mask id (the
  original commits it; ``dllm`` never proposes the mask id), so equality tests can detect it;
* ``last_rank_quirk`` (default True: the original) as above;
* a row without masks (N = 0, only in a batch whose rows finish apart): the original's walk does not
  run and reuses the previous row's ``top_i`` (on the first row the name is unbound); here ``top_i``
  is 0, then 1: one non-mask position is "committed", which writes ``x`` back to itself (no change).
"""

from __future__ import annotations

from typing import Optional

import numpy as np
import torch
import torch.nn.functional as F

from .fastdllm_generate import add_gumbel_noise
from .llada_generate import MaskCommitError

__all__ = [
    "dynamic_transfer_count",
    "factor_generate",
    "factor_generate_with_dual_cache",
    "factor_generate_with_prefix_cache",
    "get_transfer_index_dynamic",
]


def dynamic_transfer_count(sorted_conf: torch.Tensor, factor: float, *, last_rank_quirk: bool = True) -> int:
    """The walk of ``get_transfer_index_dynamic`` over one row's mask confidences sorted descending
    ([N], N >= 1): how many of them it commits (its ``top_i`` after the increment)."""
    ns = list(range(1, len(sorted_conf) + 1))
    es = [factor / (n + 1) for n in ns]
    threshs = [1 - e for e in es]  # Python floats, as the original computes them
    threshs[0] = -1  # always transfer at least one token
    top_i, broke = 0, False
    for top_i in range(len(threshs)):
        if sorted_conf[top_i] < threshs[top_i]:
            broke = True
            break
    if top_i == 0 or (top_i == len(threshs) - 1 and (last_rank_quirk or not broke)):
        top_i += 1  # the original: ``if top_i == 0 or top_i == len(threshs) - 1``
    return top_i


def get_transfer_index_dynamic(logits: torch.Tensor, temperature: float, remasking: str, mask_index: torch.Tensor,
                               x: torch.Tensor, num_transfer_tokens=None, factor: float = 1, *,
                               mask_id: Optional[int] = None,
                               last_rank_quirk: bool = True) -> tuple[torch.Tensor, torch.Tensor]:
    """Fast-dLLM's factor rule (module docstring). logits [B, L, V], mask_index / x [B, L] ->
    (x0 [B, L], transfer_index [B, L] bool). ``num_transfer_tokens`` is unused, as in the original."""
    logits_with_noise = add_gumbel_noise(logits, temperature=temperature)
    x0 = torch.argmax(logits_with_noise, dim=-1)  # [B, L]
    if remasking == "low_confidence":
        p = F.softmax(logits.to(torch.float64), dim=-1)
        x0_p = torch.squeeze(torch.gather(p, dim=-1, index=torch.unsqueeze(x0, -1)), -1)  # [B, L]
    elif remasking == "random":
        x0_p = torch.rand((x0.shape[0], x0.shape[1]), device=x0.device)
    else:
        raise NotImplementedError(remasking)
    x0 = torch.where(mask_index, x0, x)
    confidence = torch.where(mask_index, x0_p, -np.inf)  # [B, L]

    transfer_index = torch.zeros_like(x0, dtype=torch.bool, device=x0.device)
    num_transfer_tokens = mask_index.sum(dim=1, keepdim=True)  # [B, 1]
    for j in range(confidence.shape[0]):
        sorted_conf = torch.sort(confidence[j][mask_index[j]], dim=-1, descending=True)[0]
        assert len(sorted_conf) == int(num_transfer_tokens[j])
        top_i = dynamic_transfer_count(sorted_conf, factor, last_rank_quirk=last_rank_quirk)
        _, select_index = torch.topk(confidence[j], k=top_i)
        transfer_index[j, select_index] = True
    if mask_id is not None and bool((x0[transfer_index] == mask_id).any()):
        raise MaskCommitError("Fast-dLLM factor reference would commit the mask id")
    return x0, transfer_index


def _canvas(model, prompt: torch.Tensor, gen_length: int, mask_id: int) -> torch.Tensor:
    x = torch.full((prompt.shape[0], prompt.shape[1] + gen_length), mask_id, dtype=torch.long,
                   device=model.device)  # [B, P + G]
    x[:, : prompt.shape[1]] = prompt.clone()
    return x


def _rule(temperature: float, remasking: str, factor: float, guard: Optional[int], last_rank_quirk: bool):
    def rule(logits, mask_index, x):
        return get_transfer_index_dynamic(logits, temperature, remasking, mask_index, x, None, factor,
                                          mask_id=guard, last_rank_quirk=last_rank_quirk)
    return rule


@torch.no_grad()
def factor_generate(model, prompt, gen_length=128, block_length=128, temperature=0.0, remasking="low_confidence",
                    mask_id=126336, factor=1.0, *, forbid_mask_commit=False,
                    last_rank_quirk=True) -> tuple[torch.Tensor, int]:
    """``generate`` with ``factor``: full forward every step until the block has no masks.
    Returns ``(x, nfe)``."""
    rule = _rule(temperature, remasking, factor, mask_id if forbid_mask_commit else None, last_rank_quirk)
    x = _canvas(model, prompt, gen_length, mask_id)
    assert gen_length % block_length == 0
    nfe = 0
    for num_block in range(gen_length // block_length):
        start = prompt.shape[1] + num_block * block_length
        end = start + block_length
        while True:
            nfe += 1
            mask_index = x == mask_id  # [B, L]
            logits = model(x).logits  # [B, L, V]
            mask_index[:, end:] = 0
            x0, transfer_index = rule(logits, mask_index, x)
            x[transfer_index] = x0[transfer_index]
            if (x[:, start:end] == mask_id).sum() == 0:
                break
    return x, nfe


@torch.no_grad()
def factor_generate_with_prefix_cache(model, prompt, gen_length=128, block_length=128, temperature=0.0,
                                      remasking="low_confidence", mask_id=126336, factor=1.0, *,
                                      forbid_mask_commit=False, last_rank_quirk=True,
                                      partial_last_block=False) -> tuple[torch.Tensor, int]:
    """``generate_with_prefix_cache`` with ``factor``: the block-start full forward makes the first
    update, then ``x[:, s:]`` against the K/V of ``[0, s)`` frozen for the block. Returns ``(x, nfe)``.
    ``partial_last_block=True`` (not in the original, which asserts ``gen_length % block_length == 0``)
    lets the last block end at ``gen_length`` as ``fastdllm_generate.py``'s drivers do (for
    ``benchmarks/frontier_driver.py``); the loop is otherwise unchanged."""
    rule = _rule(temperature, remasking, factor, mask_id if forbid_mask_commit else None, last_rank_quirk)
    x = _canvas(model, prompt, gen_length, mask_id)
    assert partial_last_block or gen_length % block_length == 0
    nfe = 0
    for num_block in range(-(-gen_length // block_length)):
        start = prompt.shape[1] + num_block * block_length
        end = min(start + block_length, prompt.shape[1] + gen_length)
        output = model(x, use_cache=True)
        mask_index = x == mask_id  # [B, L]
        mask_index[:, end:] = 0
        x0, transfer_index = rule(output.logits, mask_index, x)
        x[transfer_index] = x0[transfer_index]
        past_key_values = [tuple(t[:, :, :start] for t in layer) for layer in output.past_key_values]  # prefix
        nfe += 1
        while True:
            if (x[:, start:end] == mask_id).sum() == 0:
                break
            nfe += 1
            mask_index = x[:, start:] == mask_id  # [B, L - s]
            mask_index[:, end - start:] = 0  # [:, block_length:] in the original (equal but in a partial last block)
            logits = model(x[:, start:], past_key_values=past_key_values, use_cache=True).logits
            _ = torch.argmax(add_gumbel_noise(logits, temperature=temperature), dim=-1)  # unused (RNG)
            x0, transfer_index = rule(logits, mask_index, x[:, start:])
            x[:, start:][transfer_index] = x0[transfer_index]
    return x, nfe


@torch.no_grad()
def factor_generate_with_dual_cache(model, prompt, gen_length=128, block_length=128, temperature=0.0,
                                    remasking="low_confidence", mask_id=126336, factor=1.0, *,
                                    forbid_mask_commit=False, last_rank_quirk=True,
                                    partial_last_block=False) -> tuple[torch.Tensor, int]:
    """``generate_with_dual_cache`` with ``factor``: the block-start full forward makes the first
    update, then ``x[:, s:e]`` against the whole cache with rows ``[s, e)`` replaced in place each step.
    Returns ``(x, nfe)``. ``partial_last_block``: as in ``factor_generate_with_prefix_cache``."""
    rule = _rule(temperature, remasking, factor, mask_id if forbid_mask_commit else None, last_rank_quirk)
    x = _canvas(model, prompt, gen_length, mask_id)
    assert partial_last_block or gen_length % block_length == 0
    nfe = 0
    for num_block in range(-(-gen_length // block_length)):
        start = prompt.shape[1] + num_block * block_length
        end = min(start + block_length, prompt.shape[1] + gen_length)
        output = model(x, use_cache=True)
        past_key_values = output.past_key_values
        mask_index = x == mask_id  # [B, L]
        mask_index[:, end:] = 0
        x0, transfer_index = rule(output.logits, mask_index, x)
        x[transfer_index] = x0[transfer_index]
        nfe += 1
        replace_position = torch.zeros_like(x, dtype=torch.bool)  # [B, L]
        replace_position[:, start:end] = 1
        while True:
            if (x[:, start:end] == mask_id).sum() == 0:
                break
            nfe += 1
            mask_index = x[:, start:end] == mask_id  # [B, e - s]
            logits = model(x[:, start:end], past_key_values=past_key_values, use_cache=True,
                           replace_position=replace_position).logits
            x0, transfer_index = rule(logits, mask_index, x[:, start:end])
            x[:, start:end][transfer_index] = x0[transfer_index]
    return x, nfe
