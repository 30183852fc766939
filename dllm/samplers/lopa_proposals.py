"""LoPA's per-position proposals and variant scores (``dllm.samplers.lopa``): the arg-max without the
mask id and its confidences, from a softmax as the reference computes them or from one fused pass, the
flat variant batch's row offsets, the variants' mean confidence, and the next step's anchor a step makes
for the logits it hands on."""

from __future__ import annotations

import weakref
from dataclasses import dataclass
from typing import Optional

import torch

from dllm.samplers._ops import argmax_excluding, gather_prob, negative_entropy
from dllm.samplers.chunked import column_ids, constant, greedy_of_probs

# logits whose float64 softmax has its maximum at their own arg-max (``chunked.greedy_with_prob``)
_GREEDY_FROM_PROBS = (torch.float32, torch.float16, torch.bfloat16)


class Proposals:
    """Per position of some logits [..., V]: the arg-max without the mask id (``tokens``) and, when
    asked for, its max-prob confidence and the ``confidence`` kind's value. ``fused``: all from one pass
    of ``dllm.kernels.triton.stats.vocab_stats`` (float32; the entropy without the 1e-10 of Dream's
    formula); else from a ``dtype`` softmax as the reference computes them, each made on first use; a
    float64 softmax gives the tokens and their probability together (``chunked.greedy_of_probs``: two
    calls instead of five, with ``greedy_with_prob``'s one documented exception)."""

    def __init__(self, logits: Optional[torch.Tensor], mask_id: int, fused: bool, dtype: torch.dtype) -> None:
        self._stats = self._probs = None
        self._top: Optional[torch.Tensor] = None
        if logits is None:  # rows() fills the fields
            return
        if fused:
            from dllm.kernels.triton.stats import vocab_stats

            self._stats = vocab_stats(logits, banned=mask_id)
            self.tokens = self._stats.argmax  # [...]
        else:
            self._probs = torch.softmax(logits, dim=-1, dtype=dtype)  # [..., V]
            if dtype == torch.float64 and logits.dtype in _GREEDY_FROM_PROBS:  # both from the softmax (exact)
                self.tokens, self._top = greedy_of_probs(self._probs, mask_id)  # [...], [...]
            else:
                self.tokens = argmax_excluding(logits, mask_id)  # [...]

    @property
    def max_prob(self) -> torch.Tensor:
        """p(tokens) [...]."""
        if self._top is None:
            self._top = self._stats.top1_prob if self._stats is not None else gather_prob(self._probs, self.tokens)
        return self._top

    def confidence(self, kind: str) -> torch.Tensor:
        """The ``confidence`` kind's value (larger = more certain) [...]: ``max_prob``, or Dream's
        ``sum p log p`` (``negative_entropy``)."""
        if kind == "max_prob":
            return self.max_prob
        return -self._stats.entropy if self._stats is not None else negative_entropy(self._probs)

    def rows(self, idx: torch.Tensor) -> "Proposals":
        """The rows ``idx`` [N] of the leading dim."""
        out = Proposals(None, 0, False, torch.float32)
        out.tokens = self.tokens[idx]
        out._probs = None if self._probs is None else self._probs[idx]
        out._top = None if self._top is None else self._top[idx]
        out._stats = None if self._stats is None else self._stats.rows(idx)
        return out


def variant_offsets(n_rows: int, k: int, device: torch.device) -> torch.Tensor:
    """[N] long ``n * k``: the first row of each batch row's ``k`` variants in the flat variant batch
    (made once per shape, ``constant``)."""
    return constant(("variant offsets", n_rows, k, device), lambda: column_ids(n_rows, device) * k)


def score_variants(conf: torch.Tensor, remaining: torch.Tensor) -> torch.Tensor:
    """Mean confidence over each variant's remaining masks; ``+inf`` where none remain.
    conf [..., W] float, remaining [..., W] bool -> [...] float."""
    total = (conf * remaining).sum(dim=-1)  # conf is finite: the masked-out terms are zeros
    mean = total / remaining.sum(dim=-1)  # 0 / 0 = NaN where none remain, and only there
    return torch.nan_to_num(mean, nan=float("inf"), posinf=float("inf"), neginf=float("-inf"))


@dataclass
class _NextAnchor:
    """A step's anchor made by the step before (``LoPA._make_next_anchor``), for the logits it handed on."""

    logits: weakref.ref  # the winner's logits [B, W, V] it was made from
    version: Optional[int]  # their version then (None inside inference mode)
    props: Proposals
    anchor: torch.Tensor  # [B, W] bool
    cand: torch.Tensor  # [B, W] bool: the masks it leaves
    counts: torch.Tensor  # [B] long: cand per row
    released: frozenset  # the decode's released rows then (a release rewrites their masks: a new set)


__all__ = ["Proposals", "score_variants", "variant_offsets"]
