"""Lossless verification of a drafted block: small pure functions, batched over rows.

Vocabulary (as in vLLM's rejection sampler): a round drafts K tokens ``d_1..d_K`` after the anchor
(the last committed token); one target forward over ``[anchor, d_1..d_K]`` gives K + 1 next-token
distributions ``p_1..p_{K+1}`` (``p_i`` predicts the position of ``d_i``). Verification returns

- ``accepted`` [B]: how many leading drafts are kept (0..K);
- ``next_token`` [B]: one more token from the target, the *recovered* token at the first rejection
  (position ``accepted + 1``) or the *bonus* token drawn from ``p_{K+1}`` when all K were kept.

A round therefore commits ``accepted + 1`` tokens (1..K+1): progress is guaranteed.

Rules:
- greedy (T = 0): keep the longest prefix with ``d_i == argmax p_i``; the next token is the arg-max
  at the first mismatch (or at K + 1);
- exact speculative sampling (Leviathan et al. arXiv 2211.17192, Chen et al. arXiv 2302.01318):
  keep ``d_i`` with probability ``min(1, p_i(d_i) / q_i(d_i))``; at the first rejection draw from the
  residual ``norm(max(0, p_i - q_i))``; after K acceptances draw the bonus from ``p_{K+1}``. The
  emitted tokens are then distributed exactly as the target samples them, whatever q is. With a
  one-hot proposal (``q = None``: arg-max drafters such as DFlash, n-gram lookup) the acceptance
  probability is ``p_i(d_i)`` and the residual is ``p_i`` without ``d_i``, renormalised.
- ``p`` is the target's sampling distribution after transformers' own warpers, in transformers'
  order: temperature, top-k, top-p (``TemperatureLogitsWarper``, ``TopKLogitsWarper``,
  ``TopPLogitsWarper`` in ``transformers/generation/logits_process.py``), so T > 0 output has the
  distribution of ``target.generate(do_sample=True, temperature=T, top_k=k, top_p=p)``.

Drafts may be shorter than K per row (``lengths`` [B]): positions at or past a row's length are
never accepted and their residual is ``p`` itself (there is no draft to remove).

Random draws: uniforms for the acceptance tests and an exponential race for categorical samples
(``argmax(p / E)``, ``E ~ Exp(1)``, as gpt-fast samples), both from the caller's
``torch.Generator``; nothing here reads a tensor back to the host.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

import torch

from dllm.options import check_int, check_number

FILTER_VALUE = float("-inf")  # transformers' warpers' default filter value
GREEDY_BELOW = 1e-5  # a temperature under this is greedy (vLLM's _SAMPLING_EPS): logits / 1e-40 overflow float32


@dataclass(frozen=True)
class SamplingParams:
    """The target's sampling settings. ``temperature = 0`` is greedy (top-k/top-p then unused), and so
    is any temperature below ``GREEDY_BELOW`` (as vLLM: dividing float32 logits by 1e-40 overflows, and
    the softmax of infinities is NaN); ``top_k = 0`` and ``top_p = 1`` switch those filters off
    (transformers' conventions)."""

    temperature: float = 0.0
    top_k: int = 0
    top_p: float = 1.0

    def __post_init__(self) -> None:
        check_number("temperature", self.temperature, low=0.0, finite=True, hint=" (0 = greedy)")
        check_int("top_k", self.top_k, 0, hint=" (0 = off)")
        check_number("top_p", self.top_p, low=0.0, high=1.0, low_open=True, hint=" (1 = off)")

    @property
    def greedy(self) -> bool:
        return self.temperature < GREEDY_BELOW


# ---- the target distribution ---------------------------------------------------------------------
def warp_logits(logits: torch.Tensor, params: SamplingParams) -> torch.Tensor:
    """float32 logits [..., V] after transformers' sampling warpers in their order: temperature,
    top-k, top-p (filtered entries = -inf). Greedy params return the float32 logits unchanged."""
    scores = logits.float()  # [..., V]; transformers casts the next-token logits to float32 first
    if params.greedy:
        return scores
    if params.temperature != 1.0:
        scores = scores / params.temperature
    if params.top_k != 0:
        k = min(params.top_k, scores.shape[-1])
        kth = torch.topk(scores, k, dim=-1).values[..., -1:]  # [..., 1]
        scores = scores.masked_fill(scores < kth, FILTER_VALUE)
    if params.top_p < 1.0:
        sorted_scores, order = torch.sort(scores, dim=-1, descending=False)  # ascending, as transformers
        cumulative = sorted_scores.softmax(dim=-1).cumsum(dim=-1)
        remove_sorted = cumulative <= (1 - params.top_p)
        remove_sorted[..., -1:] = False  # min_tokens_to_keep = 1
        remove = remove_sorted.scatter(-1, order, remove_sorted)
        scores = scores.masked_fill(remove, FILTER_VALUE)
    return scores


def target_probs(logits: torch.Tensor, params: SamplingParams) -> torch.Tensor:
    """The target's sampling distribution [..., V] float32: softmax of the warped logits; for greedy
    params the one-hot of the arg-max (the distribution greedy decoding samples from)."""
    if params.greedy:
        top = logits.argmax(dim=-1, keepdim=True)  # [..., 1]
        return torch.zeros(logits.shape, dtype=torch.float32, device=logits.device).scatter_(-1, top, 1.0)
    return warp_logits(logits, params).softmax(dim=-1)


def sample_categorical(probs: torch.Tensor, generator: Optional[torch.Generator] = None) -> torch.Tensor:
    """One draw per row of ``probs`` [..., V] (need not be normalised; zero entries are never drawn)
    by the exponential race ``argmax(p / E)``, E ~ Exp(1): no host sync, unlike ``torch.multinomial``."""
    noise = torch.empty_like(probs, dtype=torch.float32).exponential_(generator=generator)
    noise.clamp_min_(torch.finfo(torch.float32).tiny)  # an exact 0 draw would make 0 / 0 = NaN win
    return (probs.float() / noise).argmax(dim=-1)


def next_tokens(logits: torch.Tensor, params: SamplingParams,
                generator: Optional[torch.Generator] = None) -> torch.Tensor:
    """Plain decoding of one token per row from logits [..., V]: arg-max (greedy) or a sample of
    ``target_probs``."""
    if params.greedy:
        return logits.argmax(dim=-1)
    return sample_categorical(target_probs(logits, params), generator)


# ---- verification -------------------------------------------------------------------------------
def _draft_valid(draft: torch.Tensor, lengths: Optional[torch.Tensor]) -> torch.Tensor:
    """bool [B, K]: draft positions a row actually proposed."""
    b, k = draft.shape
    if lengths is None:
        return torch.ones((b, k), dtype=torch.bool, device=draft.device)
    return torch.arange(k, device=draft.device)[None, :] < lengths[:, None]


def _leading_true(ok: torch.Tensor) -> torch.Tensor:
    """[B, K] bool -> [B] long: length of each row's leading run of True."""
    return ok.long().cumprod(dim=1).sum(dim=1)


def greedy_verify(draft: torch.Tensor, target_tokens: torch.Tensor,
                  lengths: Optional[torch.Tensor] = None) -> tuple[torch.Tensor, torch.Tensor]:
    """Greedy verification.

    draft: [B, K] long; target_tokens: [B, K + 1] long, the target's arg-max at each block position
    (``[:, i]`` predicts the position of ``draft[:, i]``); lengths: [B] drafted tokens per row (None:
    all K). Returns (accepted [B] long in [0, K], next_token [B] long = ``target_tokens[accepted]``).
    """
    b, k = draft.shape
    if target_tokens.shape != (b, k + 1):
        raise ValueError(f"target_tokens must be [B, K + 1] = {[b, k + 1]} for a draft of shape {[b, k]}, "
                         f"got {list(target_tokens.shape)}")
    match = (draft == target_tokens[:, :k]) & _draft_valid(draft, lengths)  # [B, K]
    accepted = _leading_true(match)  # [B]
    return accepted, target_tokens.gather(1, accepted[:, None]).squeeze(1)


def speculative_verify(draft: torch.Tensor, p: torch.Tensor, q: Optional[torch.Tensor] = None, *,
                       generator: Optional[torch.Generator] = None,
                       lengths: Optional[torch.Tensor] = None) -> tuple[torch.Tensor, torch.Tensor]:
    """Exact speculative sampling (arXiv 2211.17192 Alg. 1, arXiv 2302.01318 Alg. 2).

    draft: [B, K] long, drawn from q; p: [B, K + 1, V] the target's sampling distribution at each
    block position (``target_probs``); q: [B, K, V] the draft distributions the tokens were drawn
    from, or None for one-hot drafts (q_i = onehot(d_i)); lengths: [B] drafted tokens per row (None:
    all K). Returns (accepted [B] long in [0, K], next_token [B] long: the residual draw at the first
    rejection, or the bonus drawn from ``p[:, K]`` after K acceptances).
    """
    b, k = draft.shape
    if p.dim() != 3 or p.shape[:2] != (b, k + 1):
        raise ValueError(f"p must be [B, K + 1, V] with B, K = {b}, {k}, got {list(p.shape)}")
    if q is not None and q.shape != (b, k, p.shape[2]):
        raise ValueError(f"q must be [B, K, V] = {[b, k, p.shape[2]]} like p, got {list(q.shape)}")
    valid = _draft_valid(draft, lengths)  # [B, K]
    p = p.float()
    p_draft = p[:, :k].gather(2, draft[:, :, None]).squeeze(2)  # [B, K] p_i(d_i)
    u = torch.rand((b, k), generator=generator, device=p.device, dtype=torch.float64)  # [B, K]
    if q is None:
        keep = u < p_draft.double()  # accept with p(d) = min(1, p(d) / 1)
    else:
        q_draft = q.float().gather(2, draft[:, :, None]).squeeze(2)  # [B, K] q_i(d_i)
        keep = u * q_draft.double() < p_draft.double()  # u < p / q without dividing by q
    accepted = _leading_true(keep & valid)  # [B]

    # the distribution of the one token after the accepted run: residual at a rejection, p at K
    at = accepted[:, None, None].expand(b, 1, p.shape[2])  # [B, 1, V]
    p_at = p.gather(1, at).squeeze(1)  # [B, V] p at position accepted (index K = the bonus row)
    rejected = accepted < k  # [B]
    idx = accepted.clamp(max=max(k - 1, 0))  # [B] the rejected position (clamped for the bonus rows)
    if k > 0:
        drafted = (valid.gather(1, idx[:, None]).squeeze(1) & rejected)  # [B] a real draft was rejected
        if q is None:
            q_at = torch.zeros_like(p_at).scatter_(1, draft.gather(1, idx[:, None]), 1.0)  # [B, V] onehot
        else:
            q_at = q.float().gather(1, idx[:, None, None].expand(b, 1, p.shape[2])).squeeze(1)  # [B, V]
        residual = (p_at - q_at).clamp_min(0.0)  # [B, V] unnormalised: the race needs no normalising
        # p == q exactly leaves nothing; acceptance was then certain, so the row cannot get here,
        # but guard against rounding with p itself
        empty = residual.sum(dim=1, keepdim=True) <= 0
        residual = torch.where(empty, p_at, residual)
        dist = torch.where(drafted[:, None], residual, p_at)  # [B, V]
    else:
        dist = p_at
    return accepted, sample_categorical(dist, generator)


def verify(draft: torch.Tensor, logits: torch.Tensor, params: SamplingParams, *,
           q: Optional[torch.Tensor] = None, generator: Optional[torch.Generator] = None,
           lengths: Optional[torch.Tensor] = None) -> tuple[torch.Tensor, torch.Tensor]:
    """One round's verification from the target's logits [B, K + 1, V]: greedy when
    ``params.greedy`` (q unused), else exact speculative sampling under ``params``."""
    if params.greedy:
        return greedy_verify(draft, logits.argmax(dim=-1), lengths)
    return speculative_verify(draft, target_probs(logits, params), q, generator=generator, lengths=lengths)


__all__ = ["SamplingParams", "greedy_verify", "next_tokens", "sample_categorical", "speculative_verify",
           "target_probs", "verify", "warp_logits"]
