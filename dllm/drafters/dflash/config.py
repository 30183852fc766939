"""The DFlash drafter's configuration: sizes, tapped target layers, block layout, attention kinds.

DFlash ("DFlash: Block Diffusion for Flash Speculative Decoding", arXiv 2602.06036;
code z-lab/dflash ``dflash/model.py``) drafts a block ``[anchor, MASK x (B-1)]`` with a small
Qwen3-style transformer conditioned on hidden states tapped from the target. This file holds the
frozen description of one drafter; ``io.py`` translates it from / to the checkpoint's
``config.json`` and ``model.py`` builds the network from it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Optional

from dllm.options import check_int, check_number

FULL_ATTENTION = "full_attention"
SLIDING_ATTENTION = "sliding_attention"
LAYER_TYPES = (FULL_ATTENTION, SLIDING_ATTENTION)

# RoPE variants whose frequencies depend on the running sequence length: not supported here
DYNAMIC_ROPE_TYPES = ("dynamic", "longrope")


def tap_layer_ids(num_target_layers: int, num_draft_layers: int) -> tuple[int, ...]:
    """The target layers a DFlash drafter reads by default (0-based decoder-layer indices).

    One tap per draft layer, spread uniformly from layer 1 to layer ``N - 3`` (N = target layers):
    ``round(1 + i * (N - 4) / (L - 1))`` for i = 0..L-1; a one-layer drafter taps the middle layer
    ``N // 2``. Qwen3-8B (36 layers) with 5 draft layers -> (1, 9, 17, 25, 33). Source: z-lab/dflash
    ``dflash/model.py`` (``build_target_layer_ids``); the rounding is Python's (half to even).
    """
    check_int("num_target_layers", num_target_layers, 1)
    check_int("num_draft_layers", num_draft_layers, 1)
    if num_draft_layers == 1:
        return (num_target_layers // 2,)
    start, end = 1, num_target_layers - 3
    span = end - start
    return tuple(round(start + i * span / (num_draft_layers - 1)) for i in range(num_draft_layers))


@dataclass(frozen=True)
class DFlashConfig:
    """Sizes and switches of one DFlash drafter (a Qwen3 body; no embedding table, no LM head).

    The drafter borrows the target's ``embed_tokens`` and ``lm_head``, so ``hidden_size`` is the
    target's and ``vocab_size`` is the target's number of embedding rows (``mask_token_id`` must be
    one of them). Every field has the meaning of the same-named field of the checkpoint's Qwen3
    ``config.json`` (or of its ``dflash_config``).
    """

    hidden_size: int  # D, equal to the target's hidden size
    intermediate_size: int  # SwiGLU inner width
    num_layers: int  # draft layers (config.json num_hidden_layers)
    num_heads: int  # query heads H
    num_kv_heads: int  # key/value heads Hkv (GQA: KV head j serves query heads j*H/Hkv ..)
    head_dim: int  # per-head width hd (Qwen3 sets it explicitly; H * hd need not equal D)
    vocab_size: int  # the target's embedding rows (ids the block may hold)
    num_target_layers: int  # decoder layers of the target the drafter was trained against
    target_layer_ids: tuple[int, ...]  # tapped target layers (0-based); fc reads len(ids) * D
    block_size: int  # B: positions per draft block, anchor included (>= 2)
    mask_token_id: int  # id of the MASK filling block positions 1..B-1 (a target embedding row)
    rms_norm_eps: float = 1e-6
    rope_theta: float = 10000.0
    # extra RoPE parameters beyond the base (e.g. (("factor", 4.0), ("rope_type", "yarn"))), sorted
    # (key, value) pairs so that the config stays hashable; () = plain RoPE
    rope_scaling: tuple[tuple[str, Any], ...] = ()
    max_position_embeddings: int = 32768  # read by scaled RoPE variants only
    attention_bias: bool = False  # q/k/v/o projections carry a bias
    hidden_act: str = "silu"  # MLP gate activation
    # per-layer attention kind, FULL_ATTENTION or SLIDING_ATTENTION; () = all full
    layer_types: tuple[str, ...] = ()
    sliding_window: Optional[int] = None  # window of the sliding layers (None: no limit)
    # config.json ``is_causal``: None -> only sliding layers are causal; True/False -> every layer
    is_causal: Optional[bool] = None
    input_embedding_scale: float = 1.0  # multiplies the target-embedded block
    output_multiplier: float = 1.0  # multiplies the draft logits
    final_logit_softcapping: Optional[float] = None  # logits -> c * tanh(logits / c) when > 0

    def __post_init__(self) -> None:
        for name in ("hidden_size", "intermediate_size", "num_layers", "num_heads", "num_kv_heads",
                     "head_dim", "vocab_size", "num_target_layers", "max_position_embeddings"):
            check_int(f"DFlashConfig.{name}", getattr(self, name), 1)
        check_int("DFlashConfig.block_size", self.block_size, 2,
                  hint=" (the anchor plus at least one drafted position)")
        check_int("DFlashConfig.mask_token_id", self.mask_token_id, 0, high=self.vocab_size - 1,
                  hint=f" (a row of the target's embedding: vocab_size is {self.vocab_size})")
        check_number("DFlashConfig.rms_norm_eps", self.rms_norm_eps, low=0.0, low_open=True)
        check_number("DFlashConfig.rope_theta", self.rope_theta, low=0.0, low_open=True)
        check_number("DFlashConfig.input_embedding_scale", self.input_embedding_scale, finite=True)
        check_number("DFlashConfig.output_multiplier", self.output_multiplier, finite=True)
        if self.num_heads % self.num_kv_heads:
            raise ValueError(f"DFlashConfig.num_heads ({self.num_heads}) must be a multiple of "
                             f"num_kv_heads ({self.num_kv_heads})")
        if self.head_dim % 2:
            raise ValueError(f"rotate-half RoPE needs an even head_dim, got {self.head_dim}")
        ids = self.target_layer_ids
        if not isinstance(ids, tuple) or not ids:
            raise ValueError(f"DFlashConfig.target_layer_ids must be a non-empty tuple of target layer "
                             f"indices, got {ids!r}")
        for i in ids:
            check_int("each of DFlashConfig.target_layer_ids", i, 0, high=self.num_target_layers - 1,
                      hint=f" (the target has num_target_layers = {self.num_target_layers})")
        if self.layer_types:
            if len(self.layer_types) != self.num_layers:
                raise ValueError(f"DFlashConfig.layer_types has {len(self.layer_types)} entries for "
                                 f"{self.num_layers} layers")
            bad = sorted(set(self.layer_types) - set(LAYER_TYPES))
            if bad:
                raise ValueError(f"DFlashConfig.layer_types: unknown kind(s) {bad}; valid: {list(LAYER_TYPES)}")
        if self.sliding_window is not None:
            check_int("DFlashConfig.sliding_window", self.sliding_window, 1, hint=" (or None)")
        if self.final_logit_softcapping is not None:
            check_number("DFlashConfig.final_logit_softcapping", self.final_logit_softcapping,
                         finite=True, hint=" (or None)")
        rope_type = self.rope_dict().get("rope_type", "default")
        if rope_type in DYNAMIC_ROPE_TYPES:
            raise ValueError(f"RoPE type {rope_type!r} (frequencies that change with the sequence length) "
                             "is not supported for DFlash drafters")

    @property
    def num_taps(self) -> int:
        """Tapped target layers; ``fc`` maps num_taps * D -> D."""
        return len(self.target_layer_ids)

    def rope_dict(self) -> dict[str, Any]:
        """The RoPE parameters as a transformers ``rope_parameters`` dict (rope_type, rope_theta, ...)."""
        out: dict[str, Any] = {"rope_type": "default"}
        out.update({k: list(v) if isinstance(v, tuple) else v for k, v in self.rope_scaling})
        out["rope_theta"] = self.rope_theta
        return out

    def layer_kind(self, i: int) -> str:
        return self.layer_types[i] if self.layer_types else FULL_ATTENTION

    def layer_causal(self, i: int) -> bool:
        """Block queries see only keys at positions <= their own (sliding layers, or is_causal)."""
        if self.is_causal is not None:
            return bool(self.is_causal)
        return self.layer_kind(i) == SLIDING_ATTENTION

    def layer_window(self, i: int) -> Optional[int]:
        """Attention window (|query - key| < window) of layer i, None when unlimited."""
        return self.sliding_window if self.layer_kind(i) == SLIDING_ATTENTION else None


__all__ = ["DFlashConfig", "FULL_ATTENTION", "LAYER_TYPES", "SLIDING_ATTENTION", "tap_layer_ids"]
