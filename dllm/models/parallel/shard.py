"""Which part of each tensor a rank keeps, and the local-width modules that hold it.

Rules on the internal parameter names (``dllm.models.core.transformer``), for rank r of N:

| tensor | kept |
|---|---|
| ``attn.{q,k,v}_proj`` weight / bias | rows of heads [r H/N, (r+1) H/N) (KV: of Hkv) |
| ``attn.o_proj`` | the same heads' input columns (``RowParallelLinear``) |
| ``mlp.{gate,up}_proj``, ``mlp.down_proj`` (dense) | rows / input columns [r F/N, (r+1) F/N) |
| ``mlp.experts.E.*`` | expert parallel: whole, iff E in [r E/N, (r+1) E/N); else split as the dense MLP |
| ``mlp.shared_experts.*`` | expert parallel: whole (replicated); else split as the dense MLP |
| ``embed``, ``lm_head`` (untied, V divisible by N: ``split_vocab``) | rows [r V/N, (r+1) V/N): looked-up rows summed, logits gathered |
| everything else (norms, q/k norms, router, a tied embedding and head) | whole (replicated) |
"""

from __future__ import annotations

import dataclasses
import re
from typing import Any, Optional

import torch
import torch.nn as nn

from dllm.models.core.layer.moe import MoEConfig, SparseMoE
from dllm.models.core.layer.block import MLP
from dllm.models.parallel.group import TPGroup
from dllm.models.parallel.layers import ParallelMoE, RowParallelLinear, VocabParallelEmbedding, VocabParallelHead
from dllm.models.parallel.plan import ParallelPlan

_ROWS = re.compile(r"layers\.\d+\.(attn\.[qkv]_proj|mlp\.(shared_experts\.|experts\.\d+\.)?(gate|up)_proj)\.(weight|bias)$")
_COLS = re.compile(r"layers\.\d+\.(attn\.o_proj|mlp\.(shared_experts\.|experts\.\d+\.)?down_proj)\.weight$")
_EXPERT = re.compile(r"layers\.\d+\.mlp\.experts\.(\d+)\.")


class TensorParallel:
    """A model's split over a group: ``local`` slices each loaded tensor, ``shard_modules`` swaps in
    the local-width modules before the slices are assigned (``TransformerLM.place`` / ``assign``)."""

    def __init__(self, plan: ParallelPlan, group: Optional[TPGroup] = None, moe: Optional[MoEConfig] = None,
                 split_vocab: bool = False) -> None:
        self.plan, self.group, self.moe, self.split_vocab = plan, group, moe, split_vocab

    @property
    def process_group(self) -> Any:
        return None if self.group is None else self.group.group

    def local(self, name: str, tensor: torch.Tensor) -> Optional[torch.Tensor]:
        """This rank's part of the tensor ``name`` (a contiguous copy; None: another rank's expert)."""
        expert = _EXPERT.match(name)
        if expert is not None and self.plan.expert_parallel:
            start, stop = self.plan.span(self.moe.n_experts)
            return tensor if start <= int(expert.group(1)) < stop else None
        if self.plan.expert_parallel and ".shared_experts." in name:
            return tensor
        if _ROWS.match(name) or (self.split_vocab and name in ("lm_head.weight", "embed.weight")):
            return _narrow(tensor, 0, self.plan)
        if _COLS.match(name):
            return _narrow(tensor, 1, self.plan)
        return tensor

    def shard_modules(self, model: Any) -> None:
        """Replace, on the (meta) model, every split module by one of its local width."""
        n, group = self.plan.size, self.process_group
        transformer = model.transformer
        cfg = transformer.config
        for i, layer in enumerate(transformer.layers):
            attn = layer.attn
            dtype = attn.q_proj.weight.dtype
            attn.q_proj, attn.k_proj, attn.v_proj = (_narrower(m, n) for m in (attn.q_proj, attn.k_proj, attn.v_proj))
            attn.n_heads, attn.n_kv_heads = cfg.n_heads // n, cfg.n_kv_heads // n
            attn.o_proj = _row_parallel(attn.o_proj, n, group, dtype)
            attn._fused = None
            if type(layer.mlp) is MLP:
                mlp = layer.mlp
                mlp.gate_proj, mlp.up_proj = _narrower(mlp.gate_proj, n), _narrower(mlp.up_proj, n)
                mlp.down_proj = _row_parallel(mlp.down_proj, n, group, dtype)
                mlp._fused = None
            elif isinstance(layer.mlp, SparseMoE):
                layer.mlp = self._parallel_moe(layer.mlp, cfg.d_model, i, dtype)
        if self.split_vocab:
            head, embed = transformer.lm_head, transformer.embed
            rows = embed.num_embeddings // n
            with torch.device("meta"):
                transformer.lm_head = VocabParallelHead(head.in_features, head.out_features // n, group, n,
                                                        dtype=head.weight.dtype)
                transformer.embed = VocabParallelEmbedding(rows, embed.embedding_dim, self.plan.rank * rows, group,
                                                           dtype=embed.weight.dtype)
        # the KV caches and head counts read the local sizes; hd stays explicit (d_model / H no longer is)
        transformer.config = dataclasses.replace(cfg, n_heads=cfg.n_heads // n, n_kv_heads=cfg.n_kv_heads // n,
                                                 attn_head_dim=cfg.head_dim)

    def _parallel_moe(self, moe: SparseMoE, d_model: int, layer: int, dtype: torch.dtype) -> ParallelMoE:
        cfg = moe.cfg
        n, ep = self.plan.size, self.plan.expert_parallel
        local = range(*self.plan.span(cfg.n_experts)) if ep else range(cfg.n_experts)
        width = cfg.expert_hidden if ep else cfg.expert_hidden // n
        shared = cfg.expert_hidden * cfg.n_shared // (1 if ep else n)
        with torch.device("meta"):
            out = ParallelMoE(d_model, dataclasses.replace(cfg, expert_hidden=width), layer, self.process_group,
                              local, shared, split_shared=not ep).to(dtype)
        out.cfg, out.log = cfg, moe.log  # the model's MoE sizes, for readers of .cfg
        return out


def splits_vocab(config: Any, n: int) -> bool:
    """Whether the embedding and LM head are split over the vocabulary: untied, with rows N divides
    (a tied head multiplies by the embedding's rows directly: both stay whole)."""
    return n > 1 and not config.tie_embeddings and config.vocab_size % n == 0


def _narrow(tensor: torch.Tensor, dim: int, plan: ParallelPlan) -> torch.Tensor:
    start, stop = plan.span(tensor.shape[dim])
    return tensor.narrow(dim, start, stop - start).clone()  # a copy: the full tensor is freed


def _narrower(linear: nn.Linear, n: int) -> nn.Linear:
    """A meta Linear with out_features / n rows (its bias too)."""
    with torch.device("meta"):
        return nn.Linear(linear.in_features, linear.out_features // n, bias=linear.bias is not None,
                         dtype=linear.weight.dtype)


def _row_parallel(linear: nn.Linear, n: int, group: Any, dtype: torch.dtype) -> RowParallelLinear:
    if linear.bias is not None:
        raise ValueError("a row-parallel projection with a bias is not supported (it would be summed N times)")
    with torch.device("meta"):
        return RowParallelLinear(linear.in_features // n, linear.out_features, group, dtype=dtype)


__all__ = ["TensorParallel", "splits_vocab"]
