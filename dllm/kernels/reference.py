"""Plain-PyTorch neighbours of the Triton kernels (``dllm.kernels.triton``).

Each function here computes exactly what its kernel promises, in the most readable way and in
float64, so the kernel tests compare against ground truth rather than against another fast path.
Nothing here imports triton.

- ``attention_reference``: the cached-step attention contract (GQA, key-padding mask, per-query
  "attend everything" rows, per-row key limit ``key_end``) as matmul -> mask -> softmax -> matmul.
- ``vocab_stats_reference``: the per-row vocabulary statistics samplers need (arg-max without the
  mask token, its probability, top-2 margin, entropy, raw logit gap, log-sum-exp, Gumbel-max sample).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Optional, Union

import torch


# ----------------------------------------------------------------------------------------------
# Attention


def key_end_tensor(key_end: Union[int, torch.Tensor, None], batch: int, n_keys: int,
                   device: torch.device) -> Optional[torch.Tensor]:
    """``key_end`` as a long tensor [B] clamped to [0, n_keys] (None stays None)."""
    if key_end is None:
        return None
    if isinstance(key_end, torch.Tensor):
        ends = key_end.to(device=device, dtype=torch.long).reshape(-1)
        if ends.numel() == 1:
            ends = ends.expand(batch)
        if ends.numel() != batch:
            raise ValueError(f"key_end must be an int or a tensor of {batch} row limits, got {tuple(key_end.shape)}")
    else:
        ends = torch.full((batch,), int(key_end), dtype=torch.long, device=device)
    return ends.clamp(0, n_keys)


def attention_reference(
    q: torch.Tensor,  # [B, H, Tq, D]
    k: torch.Tensor,  # [B, Hkv, Tk, D]
    v: torch.Tensor,  # [B, Hkv, Tk, D]
    key_padding: Optional[torch.Tensor] = None,  # bool [B, Tk], True = real key
    query_attends_all: Optional[torch.Tensor] = None,  # bool [B, Tq], True = ignore key_padding
    key_end: Union[int, torch.Tensor, None] = None,  # keys at or past it are ignored ([B] or int)
    sm_scale: Optional[float] = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Reference of ``dllm.kernels.triton.attention.flash_attention``: (out [B, H, Tq, D] in q's dtype, lse
    [B, H, Tq] float32, natural log of the softmax denominator of the scaled scores).

    Query row t of batch row b attends to key j iff ``j < key_end[b]`` and
    ``(key_padding[b, j] or query_attends_all[b, t])``. A row that may attend to no key gets
    output 0 and lse -inf (plain softmax would give NaN); the models never produce one.
    """
    b, h, tq, d = q.shape
    hkv, tk = k.shape[1], k.shape[2]
    scale = 1.0 / math.sqrt(d) if sm_scale is None else sm_scale
    kx = k.double().repeat_interleave(h // hkv, dim=1)  # [B, H, Tk, D]: query head i uses kv head i // g
    vx = v.double().repeat_interleave(h // hkv, dim=1)
    scores = (q.double() @ kx.transpose(-1, -2)) * scale  # [B, H, Tq, Tk]
    allowed = torch.ones(b, 1, tq, tk, dtype=torch.bool, device=q.device)
    if key_padding is not None:
        rows = key_padding[:, None, None, :]  # [B, 1, 1, Tk]
        if query_attends_all is not None:
            rows = rows | query_attends_all[:, None, :, None]
        allowed = allowed & rows
    ends = key_end_tensor(key_end, b, tk, q.device)
    if ends is not None:
        allowed = allowed & (torch.arange(tk, device=q.device)[None, :] < ends[:, None])[:, None, None, :]
    scores = scores.masked_fill(~allowed, float("-inf"))
    lse = torch.logsumexp(scores, dim=-1)  # [B, H, Tq], -inf for empty rows
    probs = torch.exp(scores - lse[..., None]).nan_to_num(0.0)  # empty rows: 0 instead of NaN
    out = probs @ vx
    return out.to(q.dtype), lse.float()


# ----------------------------------------------------------------------------------------------
# Vocabulary statistics


@dataclass
class VocabStats:
    """Per-row statistics of logits [..., V]; every field has the leading shape [...].

    - ``argmax`` (long): arg-max over the vocabulary without the banned id (first index on ties; a
      row without a finite allowed logit gives the lowest allowed id, as ``argmax_excluding``).
    - ``top1_prob``: softmax probability of ``argmax`` (the softmax runs over ALL ids, the banned
      one included, as every sampler's confidence does).
    - ``margin``: p(1) - p(2), the two largest probabilities over all ids (Dream's topk_margin).
    - ``entropy``: -sum p log p in nats over all ids (Dream's ``entropy`` is its negative).
    - ``gap``: l(1) - l(2), the two largest raw logits over all ids (Prophet).
    - ``lse``: log-sum-exp of the logits (log p_v = l_v - lse).
    - ``sample`` (long) / ``sample_prob``: at temperature T > 0 the Gumbel-max draw
      ``argmax_v l_v / T - log(-log u_v)`` without the banned id, and its probability under the
      untempered softmax (the confidence Fast-dLLM / LLaDA attach to it); None at T = 0.

    Non-finite logits follow torch (``argmax``, ``topk``, ``softmax``, ``logsumexp``): NaN ranks
    above every number, so the arg-max / sample is the first allowed NaN (score) of a row that has
    one; a row with a NaN or a +inf anywhere (the banned id included) has a NaN softmax, so its
    ``top1_prob``, ``margin``, ``entropy`` and ``sample_prob`` are NaN; ``lse`` is NaN with a NaN,
    else +inf with a +inf; ``gap`` is NaN with a NaN, else ``l(1) - l(2)`` (+inf - +inf = NaN). A row
    of -inf only: NaN probabilities, ``lse`` -inf.
    """

    argmax: torch.Tensor
    top1_prob: torch.Tensor
    margin: torch.Tensor
    entropy: torch.Tensor
    gap: torch.Tensor
    lse: torch.Tensor
    sample: Optional[torch.Tensor] = None
    sample_prob: Optional[torch.Tensor] = None

    FIELDS = ("argmax", "top1_prob", "margin", "entropy", "gap", "lse", "sample", "sample_prob")


def gumbel_scores(logits: torch.Tensor, temperature: float, uniforms: torch.Tensor) -> torch.Tensor:
    """``l / T - log(-log u)`` in float64: same arg-max as LLaDA's ``exp(l) / (-log u)^T``
    (``dllm.samplers._ops.gumbel_perturb``; the log of it divided by T), without its overflow
    of ``exp(l)`` for l > 709."""
    return logits.double() / temperature - torch.log(-torch.log(uniforms.double()))


def vocab_stats_reference(
    logits: torch.Tensor,  # [..., V] float
    banned: Optional[int] = None,  # id never returned as arg-max / sample (the mask token)
    temperature: float = 0.0,
    uniforms: Optional[torch.Tensor] = None,  # [..., V] in (0, 1), needed when temperature > 0
) -> VocabStats:
    """Reference of ``dllm.kernels.triton.stats.vocab_stats`` in float64 (see ``VocabStats`` for the fields).

    Allocates float64 [..., V] copies: fine for tests, which is why the kernel exists.
    """
    l = logits.double()  # [..., V]
    lse = torch.logsumexp(l, dim=-1)  # [...]
    logp = torch.log_softmax(l, dim=-1)  # torch's: NaN everywhere on a row with a NaN or a +inf
    p = torch.softmax(l, dim=-1)
    allowed = l if banned is None else l.index_fill(-1, torch.tensor([banned], device=l.device), float("-inf"))
    # first maximal index; a row of -inf gives the lowest id that is not banned (0, or 1 when 0 is)
    argmax = allowed[..., 1:].argmax(dim=-1) + 1 if banned == 0 else allowed.argmax(dim=-1)
    top2 = l.topk(2, dim=-1).values  # [..., 2]
    stats = VocabStats(
        argmax=argmax,
        top1_prob=p.gather(-1, argmax[..., None]).squeeze(-1),
        margin=(top2[..., 0] - lse).exp() - (top2[..., 1] - lse).exp(),
        entropy=-torch.where(p == 0, 0.0, p * logp).sum(dim=-1),  # p = 0 terms (l = -inf) contribute 0
        gap=top2[..., 0] - top2[..., 1],
        lse=lse,
    )
    if temperature > 0:
        if uniforms is None:
            raise ValueError("temperature > 0 needs uniforms")
        z = gumbel_scores(l, temperature, uniforms)
        if banned is not None:
            z[..., banned] = float("-inf")
        stats.sample = z[..., 1:].argmax(dim=-1) + 1 if banned == 0 else z.argmax(dim=-1)
        stats.sample_prob = p.gather(-1, stats.sample[..., None]).squeeze(-1)
    return stats


__all__ = ["attention_reference", "vocab_stats_reference", "VocabStats", "gumbel_scores", "key_end_tensor"]
