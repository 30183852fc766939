"""Soft inputs: a forward whose input at some positions is a mixture of token embeddings instead of
one token's embedding (an ``inputs_embeds``-style path that every weight-backed family shares).

``SoftInputs`` names, for a span of W consecutive input rows starting at ``offset``, the positions
whose input is mixed (``where``), the K tokens mixed there and their weights. The embedding of such
a position is

    e = sum_k w_k E[t_k]                                          (``mix_embeddings``)

and, with ``renorm_eps`` set, that vector rescaled to the weighted mean of its parts' norms,
``e * (sum_k w_k |E[t_k]|) / (|e| + renorm_eps)``: DMax's soft parallel decoding (arXiv 2604.08302,
czg1225/DMax ``dInfer/python/dinfer/decoding/parallel_strategy.py`` ``decode_uniform``) mixes the
predicted token with the mask, ``p E[x] + (1 - p) E[mask]``, and restores the norm so the input stays
on the embeddings' hypersphere. As there, the parts' norms are taken in the embedding dtype and the
mixture is formed in float32 (the weights' dtype), then cast to the embedding dtype.

A one-hot mixture (one weight 1, the rest 0) is exactly its token's embedding without ``renorm_eps``
(any embedding dtype) and, for a float32 embedding, with ``renorm_eps = 0``
(tests/models/test_soft_inputs.py), so a soft input generalises the token path rather than
approximating it. With a bfloat16 / float16
embedding and ``renorm_eps`` set, the parts' norms are rounded to that dtype (as DMax's are) while
the mixture's is float32, so the rescale of a one-hot row is off by up to a rounding of the norm.

``DiffusionLM.forward(..., soft_inputs=...)`` applies them with ``applied_to``: a forward hook on the
model's input embedding for the duration of one forward, which replaces the span's mixed rows of the
embedding's output in that forward's thread only (another thread's forward of the same model
meanwhile embeds its own ids). The family code is untouched: every family that embeds ids through
one ``nn.Embedding`` (all of ``TransformerLM``'s) gets soft inputs, with or without a KV cache.
"""

from __future__ import annotations

import contextlib
import dataclasses
import threading
from dataclasses import dataclass
from typing import Iterator, Optional

import torch
import torch.nn as nn


@dataclass(frozen=True)
class SoftInputs:
    """Mixed input embeddings for the rows ``[offset, offset + W)`` of a forward's input."""

    where: torch.Tensor  # [B, W] bool: rows whose input is the mixture (else their token's embedding)
    tokens: torch.Tensor  # [B, W, K] long: the tokens mixed at each row
    weights: torch.Tensor  # [B, W, K] float: their weights (need not sum to 1)
    renorm_eps: Optional[float] = None  # None: the plain mixture; a float: rescaled to the weighted mean
    #   norm of the parts, ``e * target / (|e| + renorm_eps)`` (DMax: 1e-6)
    offset: int = 0  # the span's first row among the forward's input rows

    def __post_init__(self) -> None:
        if self.where.dim() != 2 or self.where.dtype != torch.bool:
            raise ValueError(f"SoftInputs.where must be bool [B, W], got {self.where.dtype} "
                             f"{list(self.where.shape)}")
        b, w = self.where.shape
        if self.tokens.dim() != 3 or self.tokens.shape[:2] != (b, w) or self.tokens.dtype.is_floating_point:
            raise ValueError(f"SoftInputs.tokens must be an integer tensor [{b}, {w}, K], got "
                             f"{self.tokens.dtype} {list(self.tokens.shape)}")
        if self.weights.shape != self.tokens.shape or not self.weights.dtype.is_floating_point:
            raise ValueError(f"SoftInputs.weights must be a float tensor {list(self.tokens.shape)} like "
                             f"tokens, got {self.weights.dtype} {list(self.weights.shape)}")
        eps = self.renorm_eps
        if eps is not None and not (isinstance(eps, (int, float)) and 0 <= eps < float("inf")):
            raise ValueError(f"SoftInputs.renorm_eps must be None or a finite number >= 0 (DMax: 1e-6), "
                             f"got {eps!r}")

    @property
    def width(self) -> int:
        return self.where.shape[1]

    def at(self, offset: int) -> "SoftInputs":
        """The same span placed at input row ``offset``."""
        return dataclasses.replace(self, offset=offset)

    def rows(self, index: torch.Tensor) -> "SoftInputs":
        """The batch rows ``index`` [R] (long) of the span."""
        return dataclasses.replace(self, where=self.where[index], tokens=self.tokens[index],
                                   weights=self.weights[index])


def mix_embeddings(embed: nn.Module, tokens: torch.Tensor, weights: torch.Tensor,
                   renorm_eps: Optional[float] = None) -> torch.Tensor:
    """``sum_k w_k E[t_k]`` (rescaled when ``renorm_eps`` is set, see the module docstring).

    tokens [..., K] long, weights [..., K] float -> [..., D] in the embedding's dtype.
    """
    parts = embed.forward(tokens)  # [..., K, D] embedding dtype (``forward``: not through the hook below)
    w = weights.unsqueeze(-1)  # [..., K, 1]
    mixed = (parts * w).sum(dim=-2)  # [..., D] in the promoted dtype (float32 for float32 weights)
    if renorm_eps is not None:
        target = (torch.linalg.vector_norm(parts, dim=-1) * weights).sum(dim=-1, keepdim=True)  # [..., 1]
        mixed = mixed * (target / (torch.linalg.vector_norm(mixed, dim=-1, keepdim=True) + renorm_eps))
    return mixed.to(parts.dtype)


def apply_soft_inputs(h: torch.Tensor, embed: nn.Module, soft: SoftInputs) -> torch.Tensor:
    """The embedding output h [B, T, D] with the span's mixed rows replaced (in place, returned)."""
    a, w = soft.offset, soft.width
    if h.shape[0] != soft.where.shape[0] or not 0 <= a <= a + w <= h.shape[1]:
        raise ValueError(f"soft inputs for rows [{a}, {a + w}) of {soft.where.shape[0]} batch rows do not fit "
                         f"a forward of {h.shape[0]} rows x {h.shape[1]} positions")
    mixed = mix_embeddings(embed, soft.tokens, soft.weights, soft.renorm_eps)  # [B, W, D]
    where = soft.where  # [B, W] bool
    if mixed.device != h.device:  # (a ``to`` of a tensor already there is still a call)
        mixed = mixed.to(h.device)
    if where.device != h.device:
        where = where.to(h.device)
    span = h[:, a:a + w]  # [B, W, D] view
    if torch.is_grad_enabled() and (h.requires_grad or mixed.requires_grad):
        span.copy_(torch.where(where[..., None], mixed, span))  # in place (autograd allows it)
    else:
        torch.where(where[..., None], mixed, span, out=span)  # in place: out is exactly the third input
    return h


@contextlib.contextmanager
def applied_to(embed: Optional[nn.Module], soft: Optional[SoftInputs]) -> Iterator[None]:
    """Inside the ``with``, every call of ``embed`` from this thread returns its output with ``soft``
    applied (the forward hook is removed on exit); ``soft=None`` changes nothing.

    The hook is the calling thread's only: a forward of the same model from another thread meanwhile
    (a second engine on a served model, a plain forward beside a DMax decode) embeds its own ids.
    """
    if soft is None:
        yield
        return
    owner = threading.get_ident()  # alive until the ``with`` ends, which removes the hook

    def hook(module: nn.Module, args, out: torch.Tensor) -> Optional[torch.Tensor]:
        if threading.get_ident() != owner:
            return None  # another thread's forward: its output as it is
        return apply_soft_inputs(out, module, soft)

    handle = embed.register_forward_hook(hook)
    try:
        yield
    finally:
        handle.remove()


__all__ = ["SoftInputs", "apply_soft_inputs", "applied_to", "mix_embeddings"]
