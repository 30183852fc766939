"""The one architecture description shared by every transformer-backed model family.

LLaDA and Dream are the same network (pre-norm bidirectional transformer: RMSNorm, rotate-half
RoPE, grouped-query attention, SwiGLU MLP); they differ in sizes, a few switches below, their
checkpoint key names (``families/llada.py`` / ``families/dream.py``) and Dream's one-position logit
shift. SDAR (``families/sdar.py``, a Qwen3 network) adds three switches: an explicit ``head_dim``,
per-head RMSNorm of q and k before RoPE (``qk_norm``), and block-causal attention (``attention = "block_causal"``:
bidirectional inside a block of ``block_size`` positions, causal across blocks; SDAR, arXiv 2510.06303).
"""

from __future__ import annotations

from dataclasses import dataclass, fields
from typing import Optional

ATTENTION_KINDS = ("bidirectional", "block_causal")


@dataclass(frozen=True)
class TransformerConfig:
    """Sizes and numerical switches of the shared transformer (``transformer.py``)."""

    vocab_size: int  # embedding / LM-head rows (may exceed the tokenizer's real ids)
    d_model: int  # hidden size D
    n_layers: int
    n_heads: int  # query heads H
    n_kv_heads: int  # key/value heads Hkv (GQA when < n_heads; KV head j serves a block of H/Hkv query heads)
    mlp_hidden: int  # SwiGLU inner width
    rope_theta: float = 10000.0  # RoPE base: inv_freq[j] = 1 / theta^(2j/hd)
    rms_eps: float = 1e-5  # RMSNorm epsilon, added to mean(x^2)
    max_positions: int = 4096  # longest sequence the checkpoint was built for (RoPE has no table limit)
    qkv_bias: bool = False  # q/k/v projections carry a bias (Dream/Qwen2: True; LLaDA 8B: False)
    tie_embeddings: bool = False  # LM head reuses the embedding matrix
    # LLaDA (rope_full_precision) rotates q/k in float32 then casts back; Dream casts cos/sin to the
    # activation dtype and rotates in that dtype. Identical in float32, different bits in bf16.
    rope_fp32: bool = True
    # Qwen3 / SDAR: the attention head width when it is not d_model / n_heads (q_proj: D -> H * hd)
    attn_head_dim: Optional[int] = None
    qk_norm: bool = False  # RMSNorm over each head's q and k (weights [hd]) before RoPE (Qwen3)
    # "bidirectional" (LLaDA, Dream: every position sees every position) or "block_causal": position
    # p sees position p' iff p' // block_size <= p // block_size (block ids from the RoPE positions)
    attention: str = "bidirectional"
    block_size: Optional[int] = None  # the trained block of a block-causal model; None otherwise
    # LLaDA 2.x (partial_rotary_factor): RoPE rotates only the first rope_dim channels of each head
    # (inv_freq over rope_dim), the rest pass through; None = all head_dim channels
    rope_dim: Optional[int] = None
    # RMSNorm rounding: False = normalise in float32, cast, multiply by the weight (LLaDA, Qwen2);
    # True = multiply by the weight in float32 and cast once (SDAR's flash-attn ``rms_norm_fn``).
    # Identical in float32.
    norm_round_once: bool = False

    def __post_init__(self) -> None:
        for name in ("vocab_size", "d_model", "n_layers", "n_heads", "n_kv_heads", "mlp_hidden",
                     "max_positions"):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value <= 0:
                raise ValueError(f"TransformerConfig.{name} must be a positive int, got {value!r}")
        for name in ("rope_theta", "rms_eps"):
            value = getattr(self, name)
            if not isinstance(value, (int, float)) or isinstance(value, bool) or value <= 0:
                raise ValueError(f"TransformerConfig.{name} must be a positive number, got {value!r}")
        if self.attention not in ATTENTION_KINDS:
            raise ValueError(f"TransformerConfig.attention must be one of {', '.join(ATTENTION_KINDS)}, "
                             f"got {self.attention!r}")
        if self.attention == "block_causal":
            bs = self.block_size
            if not isinstance(bs, int) or isinstance(bs, bool) or bs <= 0:
                raise ValueError(f"TransformerConfig.block_size must be a positive int for block-causal "
                                 f"attention, got {bs!r}")
        elif self.block_size is not None:
            raise ValueError(f"TransformerConfig.block_size={self.block_size!r} needs "
                             f"attention='block_causal' (a bidirectional model has no blocks)")
        hd = self.attn_head_dim
        if hd is not None and (not isinstance(hd, int) or isinstance(hd, bool) or hd <= 0):
            raise ValueError(f"TransformerConfig.attn_head_dim must be a positive int or None, got {hd!r}")
        rd = self.rope_dim
        if rd is not None and (not isinstance(rd, int) or isinstance(rd, bool) or rd <= 0 or rd % 2
                               or rd > self.head_dim):
            raise ValueError(f"TransformerConfig.rope_dim must be an even int in 2 .. head_dim "
                             f"({self.head_dim}) or None, got {rd!r}")
        if self.n_heads % self.n_kv_heads != 0:
            raise ValueError(
                f"TransformerConfig.n_heads ({self.n_heads}) must be a multiple of n_kv_heads "
                f"({self.n_kv_heads})"
            )
        if hd is None and self.d_model % self.n_heads != 0:
            raise ValueError(
                f"TransformerConfig.d_model ({self.d_model}) must be divisible by n_heads ({self.n_heads})"
            )
        if self.head_dim % 2 != 0:
            where = (f"attn_head_dim = {hd}" if hd is not None
                     else f"d_model {self.d_model} / n_heads {self.n_heads} = {self.head_dim}")
            raise ValueError(f"rotate-half RoPE needs an even head_dim; got {where}")

    @property
    def head_dim(self) -> int:
        return self.attn_head_dim if self.attn_head_dim is not None else self.d_model // self.n_heads

    @property
    def block_causal(self) -> bool:
        return self.attention == "block_causal"

    @classmethod
    def field_names(cls) -> tuple[str, ...]:
        return tuple(f.name for f in fields(cls))
