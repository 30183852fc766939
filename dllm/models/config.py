"""The one architecture description shared by every transformer-backed model family.

LLaDA and Dream are the same network (pre-norm bidirectional transformer: RMSNorm, rotate-half
RoPE, grouped-query attention, SwiGLU MLP); they differ in sizes, a few switches below, their
checkpoint key names (``llada.py`` / ``dream.py``) and Dream's one-position logit shift.
"""

from __future__ import annotations

from dataclasses import dataclass, fields


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
        if self.n_heads % self.n_kv_heads != 0:
            raise ValueError(
                f"TransformerConfig.n_heads ({self.n_heads}) must be a multiple of n_kv_heads "
                f"({self.n_kv_heads})"
            )
        if self.d_model % self.n_heads != 0:
            raise ValueError(
                f"TransformerConfig.d_model ({self.d_model}) must be divisible by n_heads ({self.n_heads})"
            )
        if self.head_dim % 2 != 0:
            raise ValueError(
                f"rotate-half RoPE needs an even head_dim; d_model {self.d_model} / n_heads "
                f"{self.n_heads} = {self.head_dim}"
            )

    @property
    def head_dim(self) -> int:
        return self.d_model // self.n_heads

    @classmethod
    def field_names(cls) -> tuple[str, ...]:
        return tuple(f.name for f in fields(cls))
