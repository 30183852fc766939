"""The mixture-of-experts feed-forward of LLaDA 2.x (sigmoid router with expert bias, group-limited
top-k, normalised and scaled weights, shared experts), and a count of the experts each forward uses.

Routing follows ``LLaDA2MoeGate`` of inclusionAI/dFactory ``models/llada2_moe/modeling_llada2_moe.py``
(the DeepSeek-V3 scheme, arXiv 2412.19437), for N tokens x [N, D] and E experts in G groups:

1. ``logits = x @ W^T`` in float32 [N, E]; ``scores = sigmoid(logits)``;
2. experts are chosen on ``scores + expert_bias`` (the bias steers load balancing, never the weights):
   each group scores the sum of its two best, the ``topk_group`` best groups stay, the ``top_k`` best
   experts among them are taken (``route``);
3. the weights are the chosen experts' UNbiased scores, divided by their sum (when top_k > 1) and
   multiplied by ``routed_scaling_factor``;
4. ``y = sum_k w_k * expert_k(x) + shared(x)`` (the sum in float32, as the official ``moe_infer``).

``SparseMoE.forward`` is batched over experts: assignments are sorted by expert and every expert runs
once on all of its tokens. In half precision where torch has grouped matmuls (``torch._grouped_mm``:
bfloat16 and float16 on a CPU, bfloat16 on CUDA from compute capability 9.0) the experts' weights are
stacked once
(``StackedExperts``) and the gate, up and down projections of every expert are three calls whose
group sizes stay on the device: no host sync, no loop over experts (``combine_grouped``; on a CPU
the same values bit for bit). Elsewhere (float32, which keeps the loop's values bit for bit: a
grouped matmul rounds a float32 row differently), under autograd, with hooked or quantized experts
and while ``count_experts`` counts, one host sync
per layer reads the per-expert counts that size the slices of a loop over the experts that received
tokens (``combine_experts``). ``moe_reference`` is the literal per-token loop, kept for the tests.

"Expert explosion": one diffusion step forwards many positions at once, and the distinct experts a
forward touches grow with them. ``ExpertCounter`` records, per forward and MoE layer, the tokens and
the distinct experts they activate.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass, field
from typing import Iterator, Optional

import torch
import torch.nn as nn
import torch.nn.functional as F

from dllm.models.core.layer.fused import FusedWeight, fusable

_GROUPED_MM = getattr(torch, "_grouped_mm", None)  # torch >= 2.8: one matmul over groups of rows

ROUTER_SCORES = ("sigmoid",)  # LLaDA 2.x (score_function); others are refused by the config check


@dataclass(frozen=True)
class MoEConfig:
    """Sizes and routing switches of one MoE feed-forward (LLaDA2MoeConfig names in comments)."""

    n_experts: int  # num_experts E
    top_k: int  # num_experts_per_tok K
    expert_hidden: int  # moe_intermediate_size F (each expert's SwiGLU width)
    n_shared: int = 0  # num_shared_experts: one SwiGLU of width n_shared * F beside the routed ones
    n_group: int = 1  # n_group G: experts in G equal groups
    topk_group: int = 1  # topk_group: groups kept per token
    routed_scaling: float = 1.0  # routed_scaling_factor
    score_fn: str = "sigmoid"  # score_function
    first_dense: int = 0  # first_k_dense_replace: layers 0 .. first_dense-1 keep a dense MLP

    def __post_init__(self) -> None:
        for name in ("n_experts", "top_k", "expert_hidden", "n_group", "topk_group"):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value <= 0:
                raise ValueError(f"MoEConfig.{name} must be a positive int, got {value!r}")
        for name in ("n_shared", "first_dense"):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value < 0:
                raise ValueError(f"MoEConfig.{name} must be a non-negative int, got {value!r}")
        if self.score_fn not in ROUTER_SCORES:
            raise NotImplementedError(f"router score_function {self.score_fn!r} is not supported "
                                      f"(supported: {', '.join(ROUTER_SCORES)})")
        if self.n_experts % self.n_group:
            raise ValueError(f"MoEConfig: num_experts {self.n_experts} is not a multiple of n_group {self.n_group}")
        if self.n_experts // self.n_group < 2:
            raise ValueError(f"MoEConfig: a group must hold >= 2 experts (its score is the sum of its best "
                             f"two); num_experts {self.n_experts} / n_group {self.n_group}")
        if self.topk_group > self.n_group:
            raise ValueError(f"MoEConfig: topk_group {self.topk_group} exceeds n_group {self.n_group}")
        if self.top_k > self.topk_group * (self.n_experts // self.n_group):
            raise ValueError(f"MoEConfig: num_experts_per_tok {self.top_k} exceeds the experts of the "
                             f"{self.topk_group} kept group(s) ({self.topk_group * (self.n_experts // self.n_group)})")


# ----------------------------------------------------------------------------------------------
# Routing (the math)


def group_limited_topk(scores: torch.Tensor, n_group: int, topk_group: int, top_k: int) -> torch.Tensor:
    """scores [N, E] -> expert ids [N, K]: the K best experts inside the ``topk_group`` groups whose
    best two sum highest (the official ``group_limited_topk``)."""
    n, e = scores.shape
    if topk_group == n_group:  # every group kept: the plain top-k
        return torch.topk(scores, k=top_k, dim=-1)[1]
    grouped = scores.view(n, n_group, e // n_group)  # [N, G, E/G]
    group_scores = grouped.topk(2, dim=-1)[0].sum(dim=-1)  # [N, G]
    group_idx = torch.topk(group_scores, k=topk_group, dim=-1, sorted=False)[1]  # [N, topk_group]
    dropped = torch.ones(n, n_group, 1, dtype=torch.bool, device=scores.device).scatter_(1, group_idx[..., None], False)
    masked = grouped.masked_fill(dropped, float("-inf")).view(n, e)  # [N, E]
    return torch.topk(masked, k=top_k, dim=-1)[1]  # [N, K], best first


def route(logits: torch.Tensor, expert_bias: Optional[torch.Tensor], cfg: MoEConfig) -> tuple[torch.Tensor, torch.Tensor]:
    """Router logits [N, E] float32 -> (expert ids [N, K] long, weights [N, K] float32)."""
    scores = torch.sigmoid(logits) if logits.dtype == torch.float32 else torch.sigmoid(logits.float()).type_as(logits)
    biased = scores if expert_bias is None else scores + expert_bias
    idx = group_limited_topk(biased, cfg.n_group, cfg.topk_group, cfg.top_k)
    weights = torch.gather(scores, dim=1, index=idx)  # the unbiased scores, in the logits' dtype
    if cfg.top_k > 1:
        weights = weights / (weights.sum(dim=-1, keepdim=True) + 1e-20)
    return idx, weights * cfg.routed_scaling


# ----------------------------------------------------------------------------------------------
# Modules


class ExpertMLP(nn.Module):
    """One SwiGLU expert: down(silu(gate(x)) * up(x)), no biases."""

    def __init__(self, d_model: int, hidden: int) -> None:
        super().__init__()
        self.gate_proj = nn.Linear(d_model, hidden, bias=False)
        self.up_proj = nn.Linear(d_model, hidden, bias=False)
        self.down_proj = nn.Linear(hidden, d_model, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # [..., D] -> [..., D]
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


class Router(nn.Module):
    """The gate: ``weight`` [E, D] (applied in float32) and the load-balancing ``expert_bias`` [E]."""

    def __init__(self, d_model: int, cfg: MoEConfig) -> None:
        super().__init__()
        self.cfg = cfg
        self.weight = nn.Parameter(torch.empty(cfg.n_experts, d_model))
        self.register_buffer("expert_bias", torch.zeros(cfg.n_experts))

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """x [N, D] -> (expert ids [N, K], weights [N, K] float32)."""
        logits = F.linear(x.float(), self.weight.float())  # [N, E]
        return route(logits, self.expert_bias, self.cfg)


@dataclass
class ExpertUse:
    """One MoE layer's routing in one forward."""

    layer: int
    tokens: int  # rows routed (batch x query positions)
    distinct: int  # experts that received at least one token


class SparseMoE(nn.Module):
    """Routed experts + shared experts: the feed-forward of a LLaDA 2.x MoE layer. [B, T, D] -> [B, T, D]."""

    def __init__(self, d_model: int, cfg: MoEConfig, layer: int = -1) -> None:
        super().__init__()
        self.cfg, self.layer = cfg, layer
        self.gate = Router(d_model, cfg)
        self.experts = nn.ModuleList(ExpertMLP(d_model, cfg.expert_hidden) for _ in range(cfg.n_experts))
        self.shared_experts = ExpertMLP(d_model, cfg.expert_hidden * cfg.n_shared) if cfg.n_shared else None
        self.log: Optional[list[ExpertUse]] = None  # set by ExpertCounter
        self._stacked: Optional[StackedExperts] = None  # built on the first grouped forward
        self._stacked_for = 0  # the first gate weight's data_ptr when _stacked was decided (0: not yet)
        self.register_load_state_dict_post_hook(lambda module, keys: module.unstack())

    def unstack(self) -> None:
        """Decide the stacking again at the next forward (``.to()`` and ``load_state_dict`` call it;
        call it after replacing an expert's parameter by assignment)."""
        self._stacked, self._stacked_for = None, 0

    def _apply(self, fn, recurse: bool = True):  # .to(), .half(): new parameter memory; drop the old stack
        self.unstack()
        return super()._apply(fn, recurse)

    def grouped_for(self, x: torch.Tensor) -> Optional["StackedExperts"]:
        """The stacked experts when rows like ``x`` [N, D] run as grouped matmuls (no host sync), else
        None (``combine_experts``: a loop over experts sized by a read of their counts)."""
        stacked = self.stacked_experts() if self.log is None and grouped_supported(x) else None
        return stacked if stacked is not None and stacked.aligned(x) else None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, t, d = x.shape
        flat = x.reshape(-1, d)  # [N, D]
        idx, weights = self.gate(flat)  # [N, K], [N, K] f32
        stacked = self.grouped_for(flat)
        if stacked is not None:
            y = combine_grouped(stacked, flat, idx, weights).view(b, t, d)
        else:
            y = combine_experts(self.experts, flat, idx, weights, self.log, self.layer).view(b, t, d)
        return y if self.shared_experts is None else y + self.shared_experts(x)

    def stacked_experts(self) -> Optional["StackedExperts"]:
        """The experts' stacked weights, or None when autograd records or they cannot be stacked
        (hooked experts or projections, quantized weights). Decided at the first forward and again
        after ``unstack`` (``.to()``, ``load_state_dict``) or when the first expert's parameter was
        replaced; a hook registered on an expert after that first forward is not seen (as with the
        fused dense layers: ``unstack`` then)."""
        if torch.is_grad_enabled():
            return None
        if self.experts[0].gate_proj.weight.data_ptr() != self._stacked_for:
            linears = [lin for e in self.experts for lin in (e.gate_proj, e.up_proj, e.down_proj)]
            hooked = any(e._forward_hooks or e._forward_pre_hooks for e in self.experts)
            self._stacked = StackedExperts(self.experts) if fusable(linears) and not hooked else None
            self._stacked_for = self.experts[0].gate_proj.weight.data_ptr()  # the stacked memory's, if stacked
        return self._stacked


class StackedExperts:
    """The routed experts' weights stacked for grouped matmuls: gate and up [E*F, D], down [E*D, F]
    (``FusedWeight``s: each expert's ``nn.Linear`` parameters re-pointed into them, no second copy)."""

    def __init__(self, experts: nn.ModuleList) -> None:
        self.n = len(experts)
        self.gate = FusedWeight([e.gate_proj for e in experts])
        self.up = FusedWeight([e.up_proj for e in experts])
        self.down = FusedWeight([e.down_proj for e in experts])
        self._views = {name: self._view(name) for name in ("gate", "up", "down")}  # made once

    def aligned(self, x: torch.Tensor) -> bool:
        """CUDA's grouped matmul needs 16-byte aligned rows: the model and expert widths in bfloat16."""
        return x.device.type == "cpu" or (x.shape[-1] % 8 == 0 and self.gate.weight.shape[0] // self.n % 8 == 0)

    def weights(self, which: str) -> torch.Tensor:
        """[E, in, out] (a transposed view of the stacked weight) for ``torch._grouped_mm``."""
        return self._views[which]

    def _view(self, which: str) -> torch.Tensor:
        w = getattr(self, which).weight  # [E * out, in]
        return w.view(self.n, -1, w.shape[-1]).transpose(1, 2)


def grouped_supported(x: torch.Tensor) -> bool:
    """Whether ``torch._grouped_mm`` runs these rows: bfloat16 or float16 on a CPU, bfloat16 on CUDA
    devices of compute capability 9.x and 10.x (``StackedExperts.aligned`` checks the widths); never
    float32."""
    if _GROUPED_MM is None or x.dtype not in (torch.bfloat16, torch.float16):
        return False
    if x.device.type == "cpu":
        return True
    # sm90 / sm100 have the grouped kernel; elsewhere torch loops over the groups, reading their sizes back
    return x.is_cuda and x.dtype == torch.bfloat16 and torch.cuda.get_device_capability(x.device)[0] in (9, 10)


def combine_grouped(stacked: StackedExperts, x: torch.Tensor, idx: torch.Tensor, weights: torch.Tensor) -> torch.Tensor:
    """``combine_experts`` with the group sizes on the device: the assignments sorted by expert, then
    the gate, up and down projections of every expert as one grouped matmul each (no host sync, no
    loop over experts). x [N, D], idx [N, K], weights [N, K] float32 -> [N, D] in x's dtype."""
    n, k = idx.shape
    experts, order = idx.reshape(-1).sort()  # [N*K] assignments grouped by expert (argsort's order)
    rows = x[order // k]  # [N*K, D]
    ends = torch.arange(1, stacked.n + 1, device=idx.device)
    offs = torch.searchsorted(experts, ends, out_int32=True)  # [E] end of each group (bincount reads back on CUDA)
    gate = _GROUPED_MM(rows, stacked.weights("gate"), offs=offs)  # [N*K, F]
    up = _GROUPED_MM(rows, stacked.weights("up"), offs=offs)
    sorted_out = _GROUPED_MM(F.silu(gate) * up, stacked.weights("down"), offs=offs)  # [N*K, D]
    out = torch.empty_like(sorted_out)
    out[order] = sorted_out  # back to (token, k) order
    return out.view(n, k, -1).type(weights.dtype).mul_(weights.unsqueeze(-1)).sum(dim=1).type(x.dtype)


def combine_experts(experts: nn.ModuleList, x: torch.Tensor, idx: torch.Tensor, weights: torch.Tensor,
                    log: Optional[list[ExpertUse]] = None, layer: int = -1) -> torch.Tensor:
    """sum_k weights[:, k] * experts[idx[:, k]](x), batched over experts.

    x [N, D], idx [N, K] long, weights [N, K] float32 -> [N, D] in x's dtype. The assignments are
    sorted by expert (the official ``moe_infer`` order) and each expert runs once on its rows."""
    n, k = idx.shape
    flat_idx = idx.reshape(-1)  # [N*K]
    order = flat_idx.argsort()  # assignments grouped by expert
    rows = x[order // k]  # [N*K, D]: the token of each sorted assignment
    counts = torch.bincount(flat_idx, minlength=len(experts)).tolist()  # host sync: sizes the slices
    if log is not None:
        log.append(ExpertUse(layer, n, sum(c > 0 for c in counts)))
    outs, start = [], 0
    for e, c in enumerate(counts):  # over experts (not tokens); empty experts are skipped
        if c:
            outs.append(experts[e](rows[start:start + c]))
            start += c
    sorted_out = torch.cat(outs, dim=0) if outs else rows.new_empty(0, x.shape[-1])  # [N*K, D]
    out = torch.empty_like(sorted_out)
    out[order] = sorted_out  # back to (token, k) order
    return out.view(n, k, -1).type(weights.dtype).mul_(weights.unsqueeze(-1)).sum(dim=1).type(x.dtype)


def moe_reference(moe: SparseMoE, x: torch.Tensor) -> torch.Tensor:
    """The per-token loop: for each token, each of its K experts on that token alone, weighted and
    summed in float32, plus the shared experts. x [B, T, D] -> [B, T, D]. Tests only (slow)."""
    b, t, d = x.shape
    flat = x.reshape(-1, d)
    idx, weights = moe.gate(flat)
    rows = []
    for n in range(flat.shape[0]):
        acc = torch.zeros(d, dtype=weights.dtype, device=x.device)
        for j in range(idx.shape[1]):
            acc = acc + moe.experts[int(idx[n, j])](flat[n:n + 1])[0].to(weights.dtype) * weights[n, j]
        rows.append(acc.to(x.dtype))
    y = torch.stack(rows).view(b, t, d)
    return y if moe.shared_experts is None else y + moe.shared_experts(x)


# ----------------------------------------------------------------------------------------------
# Expert use per forward


@dataclass
class ExpertCounter:
    """Collects ``ExpertUse`` from every ``SparseMoE`` of a model while active (``count_experts``)."""

    uses: list[ExpertUse] = field(default_factory=list)

    def forwards(self) -> int:
        """Model forwards seen (each forward logs once per MoE layer)."""
        layers = {u.layer for u in self.uses}
        return len(self.uses) // max(len(layers), 1)

    def mean_distinct(self) -> float:
        """Distinct experts per MoE layer per forward, averaged over layers and forwards."""
        return sum(u.distinct for u in self.uses) / max(len(self.uses), 1)

    def mean_tokens(self) -> float:
        """Routed tokens per forward (batch rows x query positions)."""
        return sum(u.tokens for u in self.uses) / max(len(self.uses), 1)


def has_experts(model: nn.Module) -> bool:
    """True when ``model`` holds a mixture-of-experts layer (``count_experts`` can count it)."""
    return any(isinstance(m, SparseMoE) for m in model.modules())


def experts_read_back(model: nn.Module, hidden: torch.Tensor) -> Optional[str]:
    """Why a MoE layer of ``model`` would route hidden rows like ``hidden`` [..., D] through the
    per-expert loop, which reads the experts' counts back to the host (a CUDA graph cannot capture it),
    or None when every layer runs grouped matmuls (or there is none)."""
    flat = hidden.reshape(-1, hidden.shape[-1])
    for m in model.modules():
        if isinstance(m, SparseMoE) and m.grouped_for(flat) is None:
            if m.log is not None:
                return "its experts are being counted (count_experts: the loop over the experts logs them)"
            return ("its mixture-of-experts layers loop over the experts, sized by a read of their counts "
                    "(grouped matmuls need bfloat16 on sm90/sm100 or a CPU, one process, unhooked experts)")
    return None


@contextlib.contextmanager
def count_experts(model: nn.Module) -> Iterator[ExpertCounter]:
    """``with count_experts(model) as c: ...`` -> ``c.mean_distinct()`` experts per layer per forward
    (ValueError for a model without MoE layers)."""
    layers = [m for m in model.modules() if isinstance(m, SparseMoE)]
    if not layers:
        raise ValueError(f"{type(model).__name__} has no mixture-of-experts layer to count experts of")
    counter = ExpertCounter()
    for m in layers:
        m.log = counter.uses
    try:
        yield counter
    finally:
        for m in layers:
            m.log = None


__all__ = ["ExpertCounter", "ExpertMLP", "ExpertUse", "MoEConfig", "Router", "SparseMoE", "StackedExperts",
           "combine_experts", "combine_grouped", "count_experts", "group_limited_topk", "grouped_supported",
           "experts_read_back", "has_experts", "moe_reference", "route"]
