"""DSpark's sequential heads: a bias on each drafted position's logits from the previous drafted token
(arXiv 2607.05147, "semi-autoregressive generation"; authors' code DeepSpec
``deepspec/modeling/dspark/markov_head.py``).

The parallel backbone gives base logits U_k for every block position at once; the head adds a
prefix-dependent bias B_k before position k's token is picked, so the block is drafted left to right
at the cost of K tiny steps (no backbone forward):

    logits_k = U_k + B_k,   x_0 = the anchor,   x_k picked from logits_k (arg-max, or a sample)

- ``vanilla``: B_k = W2 W1[x_{k-1}] (a rank-r token-to-token transition, ``markov_w1`` [V, r],
  ``markov_w2`` [r -> V]).
- ``gated``: B_k = W2 (g_k * W1[x_{k-1}]), g_k = sigmoid(gate_proj([h_k ; W1[x_{k-1}]])), h_k the
  backbone's state at position k.
- ``rnn``: a GRU-like state s_k = g * s_{k-1} + (1 - g) * tanh(c), [g; c; o] = joint_proj([s_{k-1};
  W1[x_{k-1}]; h_k]), B_k = W2 tanh(o); s_0 = 0 (the whole drafted prefix reaches position k).

Training (teacher forcing) feeds the true previous tokens: ``block_bias``.
"""

from __future__ import annotations

from typing import Optional

import torch
import torch.nn as nn

MARKOV_TYPES = ("vanilla", "gated", "rnn")


class MarkovHead(nn.Module):
    """One sequential head (``kind`` in ``MARKOV_TYPES``); parameter names are the checkpoint's."""

    def __init__(self, kind: str, vocab_size: int, rank: int, hidden_size: int) -> None:
        super().__init__()
        if kind not in MARKOV_TYPES:
            raise ValueError(f"markov_head_type {kind!r} is not supported; valid: {list(MARKOV_TYPES)}")
        self.kind, self.rank = kind, rank
        self.markov_w1 = nn.Embedding(vocab_size, rank)
        self.markov_w2 = nn.Linear(rank, vocab_size, bias=False)
        if kind == "gated":
            self.gate_proj = nn.Linear(hidden_size + rank, rank)
        elif kind == "rnn":
            self.joint_proj = nn.Linear(2 * rank + hidden_size, 3 * rank)

    def prev_embedding(self, prev: torch.Tensor) -> torch.Tensor:  # [...] long -> [..., r]
        return self.markov_w1(prev.long())

    def initial_state(self, hidden: torch.Tensor) -> Optional[torch.Tensor]:
        """The recurrent state before position 0 ([..., r] zeros for ``rnn``; None otherwise)."""
        if self.kind != "rnn":
            return None
        return hidden.new_zeros(*hidden.shape[:-1], self.rank)

    def step(self, prev: torch.Tensor, hidden: torch.Tensor,
             state: Optional[torch.Tensor]) -> tuple[torch.Tensor, Optional[torch.Tensor]]:
        """(bias [..., V], next state) of one position from the previous token [...] and the backbone
        state at this position [..., D]."""
        e = self.prev_embedding(prev).to(hidden.dtype)  # [..., r]
        if self.kind == "vanilla":
            return self.markov_w2(e), state
        if self.kind == "gated":
            gate = torch.sigmoid(self.gate_proj(torch.cat([hidden, e], dim=-1)))
            return self.markov_w2(gate * e), state
        gate, cand, out = self.joint_proj(torch.cat([state, e, hidden], dim=-1)).chunk(3, dim=-1)
        g = torch.sigmoid(gate)
        state = g * state + (1.0 - g) * torch.tanh(cand)
        return self.markov_w2(torch.tanh(out)), state

    def block_bias(self, prev: torch.Tensor, hidden: torch.Tensor) -> torch.Tensor:
        """Teacher-forced biases [..., K, V] from the true previous tokens [..., K] and backbone
        states [..., K, D] (position k's previous token is prev[..., k])."""
        if self.kind != "rnn":
            return self.step(prev, hidden, None)[0]
        state = self.initial_state(hidden[..., 0, :])
        out = []
        for k in range(prev.shape[-1]):
            bias, state = self.step(prev[..., k], hidden[..., k, :], state)
            out.append(bias)
        return torch.stack(out, dim=-2)


__all__ = ["MARKOV_TYPES", "MarkovHead"]
