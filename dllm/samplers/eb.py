"""EB-Sampler, entropy-bounded unmasking (``eb``; Ben-Hamu et al., arXiv 2505.24857).

Rule (one step, per row): sort the active masks by an error proxy (``entropy`` ascending, or
``confidence`` / ``margin`` descending; ties by position) and commit the longest prefix U with

    sum_{i in U} H(p_i) - max_{i in U} H(p_i) <= gamma            (always at least one position)

where ``H`` is the Shannon entropy of the position's predicted distribution, in nats. With the
entropy order the max of a prefix is its last element, so the test is ``cumsum_k - H_(k) <= gamma``
(the vectorised form of diffusers' ``EntropyBoundScheduler``); for the other proxies the max is a
running max along the sorted axis (one reimplementation, Kamichanw/d2Cache, takes it along the
wrong dimension). ``gamma = 0`` commits the zero-entropy positions plus one more (one token per
step wherever every entropy is > 0); ``gamma = inf`` commits every active mask.

Adaptive: the engine loops until the block has no masks, so ``steps`` is ignored. Proposals are
the arg-max (T = 0) or LLaDA's float64 Gumbel-max sample (T > 0), never the mask id; entropies,
confidences and margins come from the unperturbed float64 softmax.

Defaults and decisions:
- ``gamma = 0.001``: the sources give a range rather than one value (0.001 .. 1 is the usual span;
  diffusers' ``EntropyBoundScheduler`` defaults to 0.1 for its own model; the DUS authors run
  gamma = 1 in bits). We take d2Cache's 0.001, the one concrete default for LLaDA/Dream decoding
  and the most conservative; raise it for speed.
- Entropy in nats. The DUS repository's EB baseline measures bits, so its gamma equals ours
  divided by ln 2.
- A position's proxy and entropy come from the same distribution; ties in the proxy keep
  position order (stable sort), so the rule is deterministic.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Optional

import torch

from dllm.options import check_choice, check_number
from dllm.samplers._ops import gather_prob, propose_with_log_probs, window_of, window_output
from dllm.samplers.base import Sampler, register_sampler
from dllm.state import DecodeState, StepInput, StepOutput

PROXIES = ("entropy", "confidence", "margin")


def prefix_within(entropy_sorted: torch.Tensor, gamma: float) -> torch.Tensor:
    """The longest prefix with ``sum H - max H <= gamma``, as a bool map of the sorted axis.

    entropy_sorted: [B, N] entropies in proxy order, +inf at the entries not to commit (all after the
    others). The first finite entry always passes (its slack is ``H - H = 0``), an infinite one never
    (``inf - inf`` is NaN), and the first failure ends the prefix (round-off safe). Returns [B, N] bool.
    """
    h = entropy_sorted
    slack = h.cumsum(dim=1) - h.cummax(dim=1).values  # [B, N], non-decreasing in exact arithmetic
    return (slack <= gamma).cummin(dim=1).values


def entropy_prefix(entropy_sorted: torch.Tensor, valid_sorted: torch.Tensor, gamma: float) -> torch.Tensor:
    """Length of the longest prefix with ``sum H - max H <= gamma`` (>= 1 where a row has any valid).

    entropy_sorted: [B, N] entropies in proxy order; valid_sorted: [B, N] bool, all valid entries
    first (invalid ones are ignored). Returns [B] long.
    """
    return prefix_within(entropy_sorted.masked_fill(~valid_sorted, math.inf), gamma).sum(dim=1)


@dataclass(frozen=True)
class EBConfig:
    gamma: float = 0.001  # entropy budget in nats, >= 0 (inf: commit everything)
    proxy: str = "entropy"  # the order positions are considered in: entropy | confidence | margin

    def __post_init__(self) -> None:
        check_number("gamma", self.gamma, low=0.0)
        check_choice("proxy", self.proxy, PROXIES)


@register_sampler("eb", aliases=("entropy_bounded",))
class EntropyBounded(Sampler):
    """EB-Sampler: commit the longest proxy-ordered prefix whose entropy sum minus max <= gamma."""

    Config = EBConfig
    reads_block_only = True  # the engine computes the block's logits only
    fixed_steps = False

    @property
    def commits_every_step(self) -> bool:
        return True  # the prefix's first entry (a row's first active mask in proxy order) always passes

    def joins_mid_block(self, width: int, steps: Optional[int]) -> bool:
        return True  # the entropy bound reads each row's own window only, no step index

    def step(self, inp: StepInput, state: DecodeState) -> StepOutput:
        x0, logp = propose_with_log_probs(inp)  # [B, W], [B, W, V]
        probs = logp.exp()
        active = window_of(inp.active, inp.window)  # [B, W]
        # nats (0 log 0 = 0); +inf where not active, so those sort last and never pass the bound
        entropy = torch.where(active, torch.special.entr(probs).sum(dim=-1), math.inf)  # [B, W]
        if self.config.proxy == "entropy":
            key = entropy
        elif self.config.proxy == "confidence":
            key = torch.where(active, -gather_prob(probs, x0), math.inf)
        else:
            top2 = probs.topk(2, dim=-1).values
            key = torch.where(active, -(top2[..., 0] - top2[..., 1]), math.inf)
        key_sorted, order = key.sort(dim=1, stable=True)  # [B, W] ascending, ties by position
        entropy_sorted = key_sorted if key is entropy else entropy.gather(1, order)
        within = prefix_within(entropy_sorted, self.config.gamma)  # [B, W] in sorted order
        commit = within.scatter(1, order, within)  # back to positions (order is a permutation: all written)
        out = window_output(inp, commit, x0, -key)
        out.active_only = True  # the prefix holds finite entropies only: active masks
        return out
