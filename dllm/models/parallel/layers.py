"""The modules whose outputs are summed across the tensor-parallel ranks.

``RowParallelLinear``: a projection holding some of its input columns (``o_proj`` over this rank's
heads, ``down_proj`` over its SwiGLU columns); its output is a partial sum, all-reduced in place.
``VocabParallelEmbedding`` / ``VocabParallelHead``: the embedding and LM head over this rank's
vocabulary rows (the looked-up rows summed across ranks, the logits gathered).
``ParallelMoE``: LLaDA 2's MoE with this rank's experts (whole ones under expert parallelism, every
expert's column slice otherwise); the routed sum is all-reduced, replicated shared experts are added
after it, split ones before it. ``AbsentExpert`` stands for another rank's expert (no weights).
"""

from __future__ import annotations

import dataclasses
from typing import Any

import torch
import torch.nn as nn
import torch.nn.functional as F

from dllm.models.core.layer.moe import ExpertMLP, MoEConfig, SparseMoE, combine_experts
from dllm.models.parallel.group import all_reduce_, collective


class RowParallelLinear(nn.Linear):
    """y = all_reduce(x_local @ W_local^T): x [..., in / N] -> [..., out], the same on every rank."""

    def __init__(self, in_features: int, out_features: int, group: Any, **kwargs: Any) -> None:
        super().__init__(in_features, out_features, bias=False, **kwargs)
        self.group = group

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return all_reduce_(F.linear(x, self.weight), self.group)


class VocabParallelEmbedding(nn.Embedding):
    """The embedding's rows [start, start + V / N) on this rank: ids outside give zeros here, the
    all-reduce sums in the one rank's row (exact: one nonzero term). ids [...] -> [..., D]."""

    def __init__(self, local_rows: int, dim: int, start: int, group: Any, **kwargs: Any) -> None:
        super().__init__(local_rows, dim, **kwargs)
        self.start, self.group = start, group

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        local = ids - self.start
        outside = (local < 0) | (local >= self.num_embeddings)  # [...] another rank's rows
        out = F.embedding(local.masked_fill(outside, 0), self.weight).masked_fill_(outside.unsqueeze(-1), 0)
        return all_reduce_(out, self.group)


class VocabParallelHead(nn.Linear):
    """The LM head over this rank's V / N vocabulary rows; the ranks' logits are gathered, so every
    rank gets the whole [..., V] (the samplers read whole rows). x [..., D] -> [..., V]."""

    def __init__(self, in_features: int, local_rows: int, group: Any, size: int, **kwargs: Any) -> None:
        super().__init__(in_features, local_rows, bias=False, **kwargs)
        self.group, self.size = group, size

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        import torch.distributed as dist

        local = F.linear(x, self.weight).contiguous()  # [..., V / N]
        parts = [torch.empty_like(local) for _ in range(self.size)]
        collective(self.group, [local, *parts], lambda: dist.all_gather(parts, local, group=self.group))
        return torch.cat(parts, dim=-1)


class AbsentExpert(nn.Module):
    """Another rank's expert: contributes zeros here (its rank adds its own output in the all-reduce)."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # [N, D] -> [N, D] zeros
        return torch.zeros_like(x)


class ParallelMoE(SparseMoE):
    """``SparseMoE`` over this rank's part of the experts, its output summed across ranks.

    ``local``: the experts this rank holds (the others are ``AbsentExpert``); ``cfg.expert_hidden``
    is already this rank's width (the full width under expert parallelism); ``split_shared``: the
    shared experts' columns are split (summed with the routed part) instead of replicated."""

    def __init__(self, d_model: int, cfg: MoEConfig, layer: int, group: Any, local: range,
                 shared_hidden: int, split_shared: bool) -> None:
        super().__init__(d_model, dataclasses.replace(cfg, n_shared=0), layer)
        self.cfg = cfg
        self.group, self.split_shared = group, split_shared
        self.experts = nn.ModuleList(e if i in local else AbsentExpert() for i, e in enumerate(self.experts))
        if cfg.n_shared:
            self.shared_experts = ExpertMLP(d_model, shared_hidden)

    def grouped_for(self, x: torch.Tensor) -> None:
        """Never: a rank's experts run in ``combine_experts``'s loop (absent ones give zeros), sized by a
        read of their counts."""
        return None

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # [B, T, D] -> [B, T, D]
        b, t, d = x.shape
        flat = x.reshape(-1, d)  # [N, D]
        idx, weights = self.gate(flat)  # [N, K], [N, K] f32: the full router, on every rank
        y = combine_experts(self.experts, flat, idx, weights, self.log, self.layer).view(b, t, d)
        if self.shared_experts is not None and self.split_shared:
            y = y + self.shared_experts(x)
        y = all_reduce_(y, self.group)
        if self.shared_experts is not None and not self.split_shared:
            y = y + self.shared_experts(x)
        return y


__all__ = ["AbsentExpert", "ParallelMoE", "RowParallelLinear", "VocabParallelEmbedding", "VocabParallelHead"]
