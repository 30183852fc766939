"""The DFlare block drafter: DFlash with a per-layer fusion of many tapped target layers.

DFlare ("DFlare: Scaling Up Draft Capacity for Block Diffusion Speculative Decoding", arXiv
2606.02091; code Tencent/AngelSlim ``angelslim/compressor/speculative/train/models/draft/qwen_dflare.py``,
``QwenDFlareDraftModel``) keeps DFlash's drafter (``model.py``: a Qwen3 body drafting the block
``[anchor, MASK x (B-1)]`` in one non-causal forward, the target's embedding and LM head, context K/V
injected before the block's in every layer) and changes how the target's hidden states reach the layers:

1. Fusion: no ``fc``. The T tapped target states of a token, ``[T, D]``, are mixed per draft layer
   l by ``softmax(layer_fusion_weights[l])`` (a learned [L, T] matrix, softmax over the T taps), then
   ``hidden_norm``: every layer gets its own context feature ``[N, D]`` (DFlash: one for all layers).
   So the drafter needs the target's hidden size and may tap many layers (the authors tap 9 of
   Qwen3-4B's 36 with 7 draft layers).
2. Separate context projections: each layer's context keys / values come from its own
   ``k_proj_target`` / ``v_proj_target`` (then the shared ``k_norm`` and RoPE, as DFlash), the
   block's from ``k_proj`` / ``v_proj``.

The reference attends the whole block (``is_causal=False``, no mask) in every layer and reads no
embedding scale, logit multiplier or soft-cap, so ``DFlareConfig`` refuses those DFlash options.
Parameter names are the checkpoint's (``layer_fusion_weights``, ``layers.N.self_attn.k_proj_target.weight``, ...).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

import torch
import torch.nn as nn

from dllm.drafters.dflash.config import DFlashConfig
from dllm.drafters.dflash.model import DFlashAttention, DFlashDrafter, DFlashLayer
from dllm.drafters.dflash.ops import Rope, apply_rotary

FUSION_INIT = 2.0  # the reference's initial fusion logit of each layer's own tap (all others 0)


@dataclass(frozen=True)
class DFlareConfig(DFlashConfig):
    """A DFlash config read as DFlare's: the same fields, minus what the reference does not run."""

    def __post_init__(self) -> None:
        super().__post_init__()
        unsupported = []
        if any(self.layer_causal(i) or self.layer_window(i) is not None for i in range(self.num_layers)):
            unsupported.append("causal or sliding-window layers (layer_types / is_causal)")
        if self.input_embedding_scale != 1.0:
            unsupported.append(f"input_embedding_scale {self.input_embedding_scale}")
        if self.output_multiplier != 1.0:
            unsupported.append(f"output_multiplier {self.output_multiplier}")
        if self.final_logit_softcapping:
            unsupported.append(f"final_logit_softcapping {self.final_logit_softcapping}")
        if unsupported:
            raise ValueError("a DFlare drafter attends the whole block in every layer and reads the target's "
                             "embedding and head unscaled (as QwenDFlareDraftModel); unsupported: "
                             + "; ".join(unsupported))


def fusion_init(num_layers: int, num_taps: int) -> torch.Tensor:
    """The reference's initial fusion logits [L, T]: layer l starts on tap ``min(T-1, floor(l*T/L))``
    (logit ``FUSION_INIT``, the rest 0), so the layers start spread over the taps, shallow to deep."""
    logits = torch.zeros(num_layers, num_taps)
    for layer in range(num_layers):
        logits[layer, min(num_taps - 1, int(layer / num_layers * num_taps))] = FUSION_INIT
    return logits


def fuse_layers(features: torch.Tensor, fusion_logits: torch.Tensor) -> torch.Tensor:
    """Tapped states [B, N, T*D] and fusion logits [L, T] -> per-layer mixtures [B, N, L, D]
    (``softmax`` over the T taps, in the logits' dtype)."""
    taps = features.unflatten(-1, (fusion_logits.shape[1], -1))  # [B, N, T, D]
    return torch.einsum("bntd,lt->bnld", taps, fusion_logits.softmax(dim=1))


class DFlareAttention(DFlashAttention):
    """DFlash attention whose context keys / values have their own projections."""

    def __init__(self, cfg: DFlashConfig) -> None:
        super().__init__(cfg)
        d, width = cfg.hidden_size, cfg.num_kv_heads * cfg.head_dim
        self.k_proj_target = nn.Linear(d, width, bias=cfg.attention_bias)
        self.v_proj_target = nn.Linear(d, width, bias=cfg.attention_bias)

    def context_key_value(self, ctx: torch.Tensor, rope: Rope) -> tuple[torch.Tensor, torch.Tensor]:
        """ctx [B, N, D] -> k (``k_proj_target``, ``k_norm``, RoPE), v (``v_proj_target``), each [B, Hkv, N, hd]."""
        k = self.k_norm(self._heads(self.k_proj_target(ctx), self.num_kv_heads)).transpose(1, 2)
        v = self._heads(self.v_proj_target(ctx), self.num_kv_heads).transpose(1, 2)
        return apply_rotary(k, rope), v


class DFlareLayer(DFlashLayer):
    def __init__(self, cfg: DFlashConfig) -> None:
        super().__init__(cfg)
        self.self_attn = DFlareAttention(cfg)


class DFlareDrafter(DFlashDrafter):
    """DFlare draft body: ``layer_fusion_weights`` + ``hidden_norm`` fusion, DFlare layers, final norm.

    ``forward`` (block states through the context KV cache, training masks) is DFlash's: only the
    per-layer contexts (``layer_contexts``) and the context projections differ.
    """

    FUSION = "layer_fusion_weights"

    def __init__(self, config: DFlareConfig, hf_config: Optional[dict] = None) -> None:
        if not isinstance(config, DFlareConfig):
            raise TypeError(f"DFlareDrafter needs a DFlareConfig, got {type(config).__name__}")
        super().__init__(config, hf_config)
        self.config: DFlareConfig = config
        del self.fc  # DFlare has no concatenation projection
        self.layers = nn.ModuleList(DFlareLayer(config) for _ in range(config.num_layers))
        self.layer_fusion_weights = nn.Parameter(torch.empty(config.num_layers, config.num_taps))  # [L, T] logits

    def init_weights(self, std: float = 0.02, generator: Optional[torch.Generator] = None) -> None:
        """DFlash's initialisation, fusion logits as the reference's (``fusion_init``)."""
        super().init_weights(std, generator)
        with torch.no_grad():
            self.layer_fusion_weights.copy_(fusion_init(self.config.num_layers, self.config.num_taps))

    def fuse(self, features: torch.Tensor) -> torch.Tensor:
        """Tapped target states [B, N, T*D] -> per-layer context features [B, N, L, D]."""
        weights = self.layer_fusion_weights
        return self.hidden_norm(fuse_layers(features.to(weights.dtype), weights))

    def layer_contexts(self, features: torch.Tensor) -> list[torch.Tensor]:
        return list(self.fuse(features).unbind(dim=2))  # L x [B, N, D]


__all__ = ["DFlareAttention", "DFlareConfig", "DFlareDrafter", "DFlareLayer", "FUSION_INIT", "fuse_layers",
           "fusion_init"]
