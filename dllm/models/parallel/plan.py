"""What a tensor- / expert-parallel split of a transformer needs, checked before any weight is read.

Tensor parallelism (Megatron-LM's layout, arXiv 1909.08053): each rank holds H / N query heads and
Hkv / N key/value heads (so a query head's key/value head is on its rank: the contiguous split keeps
GQA's groups together), the matching input columns of ``o_proj``, and F / N columns of the SwiGLU
(gate/up rows, down columns). ``o_proj`` and ``down_proj`` give partial sums: one all-reduce per
sub-layer. Expert parallelism (LLaDA 2's MoE layers): each rank holds E / N whole experts and
computes them for every token routed to them; the routed sum is all-reduced once per layer and the
shared experts (replicated) are added after it. Without it, every expert's columns are split as the
dense MLP's.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Optional

from dllm.models.core.config import TransformerConfig


@dataclass(frozen=True)
class ParallelPlan:
    """How one model is split over ``size`` ranks (this process is ``rank``)."""

    size: int  # ranks in the tensor-parallel group (N)
    rank: int = 0
    expert_parallel: bool = False  # MoE layers: whole experts per rank instead of split columns

    def span(self, total: int) -> tuple[int, int]:
        """[start, stop) of this rank's contiguous share of ``total`` (divisible by size)."""
        share = total // self.size
        return self.rank * share, (self.rank + 1) * share


def check_tensor_parallel(value: Any) -> Optional[int]:
    """``tensor_parallel`` argument -> None (off) or the number of ranks; ValueError otherwise."""
    if value is None:
        return None
    if not isinstance(value, int) or isinstance(value, bool) or value < 1:
        raise ValueError(f"tensor_parallel must be an integer >= 1 (the number of ranks) or None, got {value!r}")
    return value


def check_plan(config: TransformerConfig, n: int, *, moe: Any = None, expert_parallel: bool = False,
               device_map: Any = None, quantization: Optional[str] = None) -> None:
    """Refuse a split that cannot be made, with the numbers (ValueError), before anything loads:
    heads, KV heads or MLP / expert widths not divisible by ``n``; experts not divisible by ``n`` with
    ``expert_parallel``; ``expert_parallel`` without experts; ``device_map`` or quantization with it."""
    if device_map is not None:
        raise ValueError(f"tensor_parallel={n} places each rank's part on its own device; it cannot be combined "
                         f"with device_map={device_map!r} (accelerate's layer split). Use one or the other")
    if quantization is not None:
        raise ValueError(f"tensor_parallel={n} with quantization={quantization!r} is not supported: the "
                         f"quantized projections are not split; load in a floating dtype")
    if expert_parallel and moe is None:
        raise ValueError(f"expert_parallel=True needs a mixture-of-experts model (LLaDA 2); this model has "
                         f"no experts: use tensor_parallel={n} alone")
    bad = [f"{what} {count} is not divisible by tensor_parallel={n}"
           for what, count in _split_sizes(config, moe, expert_parallel) if count % n]
    if expert_parallel and moe.n_experts % n:
        bad.append(f"experts {moe.n_experts} are not divisible by the {n} ranks of expert_parallel")
    if bad:
        raise ValueError("cannot split this model: " + "; ".join(bad))


def _split_sizes(config: TransformerConfig, moe: Any, expert_parallel: bool) -> list[tuple[str, int]]:
    sizes = [("attention heads", config.n_heads), ("key/value heads", config.n_kv_heads)]
    dense_layers = config.n_layers if moe is None else moe.first_dense
    if dense_layers:
        sizes.append(("MLP width (intermediate_size)", config.mlp_hidden))
    if moe is not None and not expert_parallel:
        sizes.append(("expert width (moe_intermediate_size)", moe.expert_hidden))
        if moe.n_shared:
            sizes.append(("shared-expert width", moe.expert_hidden * moe.n_shared))
    return sizes


__all__ = ["ParallelPlan", "check_plan", "check_tensor_parallel"]
