"""The DFlash 2 block drafter: DFlash plus grouped dynamic causal convolutions and a candidate selector.

Source: z-lab/dflash ``dflash/model.py`` (``DFlash2DraftModel``, package ``dflash`` 0.1.0), no paper.
DFlash 2 keeps the whole DFlash (v1) drafter of ``model.py`` -- tapped target features fused by
``fc`` + ``hidden_norm``, KV-injection layers, the target's embedding and LM head -- and adds:

1. Around attention and around the MLP of every layer, a causal convolution along the block's
   positions (``GroupedDynamicConv``): channels are split into groups of ``conv_group_size``; output
   position t is ``sum_o (base[o] + dyn[t, o, g]) * x[t - o]`` over offsets o < ``conv_kernel_size``,
   where ``base`` is a learned per-channel kernel and ``dyn`` a per-position, per-group correction
   predicted from the layer's normed input. One projection predicts two kernels: the first filters the
   normed input before attention (resp. the MLP), the second filters its output before the residual.
   The convolution sees the block only (zero before the anchor); the context never passes through it,
   so no convolution state is carried between rounds.
2. ``CandidateSelector``: instead of the per-position arg-max, each drafted position keeps its top-K
   LM-head candidates and re-scores them left to right, ``score = logit + <P[prev] * W h_t, S[cand]>``
   with low-rank predecessor / successor codebooks P, S [V, r] and the position's final state h_t
   projected to rank r; ``prev`` is the token chosen at the position before (the anchor for the first).
   Greedy drafting takes the best score; sampling draws from softmax(score / temperature) over the K.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional, Union

import torch
import torch.nn as nn
import torch.nn.functional as F

from dllm.drafters.dflash.cache import DraftKVCache
from dllm.drafters.dflash.config import DFlashConfig
from dllm.drafters.dflash.model import DFlashDrafter, DFlashLayer, DraftBlock, JoinKV, draft_block
from dllm.drafters.dflash.ops import Rope
from dllm.drafters.verify import sample_categorical
from dllm.options import check_int, check_number


@dataclass(frozen=True, kw_only=True)
class DFlash2Config(DFlashConfig):
    """A DFlash config plus the DFlash 2 fields (``dflash_config`` entries of the checkpoint)."""

    conv_kernel_size: int  # taps of every block convolution (offsets 0..k-1, causal)
    conv_group_size: int  # channels sharing one dynamic kernel value; divides hidden_size
    selector_top_k: int  # K: candidates re-scored per drafted position
    selector_rank: int  # r: width of the predecessor / successor codebooks

    def __post_init__(self) -> None:
        super().__post_init__()
        check_int("DFlash2Config.conv_kernel_size", self.conv_kernel_size, 1)
        check_int("DFlash2Config.conv_group_size", self.conv_group_size, 1, high=self.hidden_size)
        if self.hidden_size % self.conv_group_size:
            raise ValueError(f"DFlash2Config.conv_group_size ({self.conv_group_size}) must divide hidden_size "
                             f"({self.hidden_size})")
        check_int("DFlash2Config.selector_top_k", self.selector_top_k, 1, high=self.vocab_size)
        check_int("DFlash2Config.selector_rank", self.selector_rank, 1)

    @property
    def conv_groups(self) -> int:
        """G: dynamic-kernel groups per convolution (hidden_size / conv_group_size)."""
        return self.hidden_size // self.conv_group_size


# ----------------------------------------------------------------------------------------------
# Grouped dynamic causal convolution


def causal_windows(x: torch.Tensor, k: int) -> torch.Tensor:
    """x [B, T, D] -> [B, T, k, D] with entry [b, t, o] = x[b, t - o] (zeros before position 0)."""
    padded = F.pad(x, (0, 0, k - 1, 0))  # [B, T+k-1, D]
    windows = padded.unfold(1, k, 1)  # [B, T, D, k]; window slot j holds time t + j - (k - 1)
    return windows.flip(-1).transpose(-1, -2)  # [B, T, k, D]; slot o holds time t - o


def grouped_dynamic_conv(x: torch.Tensor, base: torch.Tensor, dynamic: torch.Tensor, group_size: int) -> torch.Tensor:
    """Causal convolution along T with per-position kernels: out[t] = sum_o (base[o] + dyn[t, o]) * x[t - o].

    x [B, T, D]; base [k, D] (per channel); dynamic [B, T, k, G] (per group of ``group_size``
    channels, G = D / group_size) -> [B, T, D].
    """
    b, t, d = x.shape
    k, groups = base.shape[0], d // group_size
    shifted = causal_windows(x, k).view(b, t, k, groups, group_size)  # [B, T, k, G, C]
    taps = base.to(x.dtype).view(k, groups, group_size) + dynamic[..., None]  # [B, T, k, G, C]
    return (taps * shifted).sum(dim=2).view(b, t, d)


class GroupedDynamicConv(nn.Module):
    """The pair of block convolutions wrapped around one sub-layer (attention or MLP).

    Parameters (checkpoint names): ``base_kernel`` [2, k, D] (index 0: before, 1: after the
    sub-layer) and ``kernel_projection.weight`` [2*k*G, D], both dynamic kernels from the normed input.
    """

    def __init__(self, hidden_size: int, kernel_size: int, group_size: int) -> None:
        super().__init__()
        self.kernel_size, self.group_size = kernel_size, group_size
        self.groups = hidden_size // group_size
        self.base_kernel = nn.Parameter(torch.empty(2, kernel_size, hidden_size))
        self.kernel_projection = nn.Linear(hidden_size, 2 * kernel_size * self.groups, bias=False)

    def kernels(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Normed input x [B, T, D] -> the dynamic kernels (before, after), each [B, T, k, G]."""
        dyn = self.kernel_projection(x).view(*x.shape[:2], 2, self.kernel_size, self.groups)
        return dyn[:, :, 0], dyn[:, :, 1]

    def before(self, x: torch.Tensor, dynamic: torch.Tensor) -> torch.Tensor:  # [B, T, D] -> [B, T, D]
        return grouped_dynamic_conv(x, self.base_kernel[0], dynamic, self.group_size)

    def after(self, y: torch.Tensor, dynamic: torch.Tensor) -> torch.Tensor:  # [B, T, D] -> [B, T, D]
        return grouped_dynamic_conv(y, self.base_kernel[1], dynamic, self.group_size)


class DFlash2Layer(DFlashLayer):
    """A DFlash layer whose attention and MLP are each wrapped by a ``GroupedDynamicConv``."""

    def __init__(self, cfg: DFlash2Config) -> None:
        super().__init__(cfg)
        self.attention_conv = GroupedDynamicConv(cfg.hidden_size, cfg.conv_kernel_size, cfg.conv_group_size)
        self.mlp_conv = GroupedDynamicConv(cfg.hidden_size, cfg.conv_kernel_size, cfg.conv_group_size)

    def forward(
        self, h: torch.Tensor, ctx: torch.Tensor, rope_x: Rope, rope_ctx: Rope, join: JoinKV,
        mask: Optional[torch.Tensor],
    ) -> tuple[torch.Tensor, tuple[torch.Tensor, torch.Tensor]]:
        """h [B, T, D] -> (h [B, T, D], context K/V); the context ctx [B, N, D] skips the convolutions."""
        x = self.input_layernorm(h)
        pre, post = self.attention_conv.kernels(x)  # [B, T, k, G] each
        a, kv = self.self_attn(self.attention_conv.before(x, pre), ctx, rope_x, rope_ctx, join, mask)
        h = h + self.attention_conv.after(a, post)
        x = self.post_attention_layernorm(h)
        pre, post = self.mlp_conv.kernels(x)
        h = h + self.mlp_conv.after(self.mlp(self.mlp_conv.before(x, pre)), post)
        return h, kv


# ----------------------------------------------------------------------------------------------
# Candidate selector


class CandidateSelector(nn.Module):
    """Low-rank pairwise re-scoring of the top-K candidates of each drafted position.

    Parameters (checkpoint names, under ``candidate_selector.``): ``predecessor_codebook`` [V, r],
    ``successor_codebook`` [V, r] (stored without a ``.weight`` suffix) and
    ``hidden_projection.weight`` [r, D].
    """

    def __init__(self, cfg: DFlash2Config) -> None:
        super().__init__()
        self.top_k = cfg.selector_top_k
        self.predecessor_codebook = nn.Parameter(torch.empty(cfg.vocab_size, cfg.selector_rank))
        self.successor_codebook = nn.Parameter(torch.empty(cfg.vocab_size, cfg.selector_rank))
        self.hidden_projection = nn.Linear(cfg.hidden_size, cfg.selector_rank, bias=False)

    def candidates(self, logits: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """logits [B, T, V] -> (top-K logits [B, T, K], their ids [B, T, K]), best first."""
        return torch.topk(logits, self.top_k, dim=-1)

    def scores(
        self,
        hidden: torch.Tensor,  # [B, T, D] final-norm states of the drafted positions
        unary: torch.Tensor,  # [B, T, K] the candidates' logits
        candidates: torch.Tensor,  # [B, T, K] long
        previous: torch.Tensor,  # [B, T] long, the token before each position (anchor for the first)
    ) -> torch.Tensor:
        """Candidate scores [B, T, K] given every position's predecessor (all positions at once, e.g. to
        score a known path): unary + sum_r P[prev, r] * (W h)[r] * S[cand, r]."""
        query = F.embedding(previous, self.predecessor_codebook) * self.hidden_projection(hidden)  # [B, T, r]
        keys = F.embedding(candidates, self.successor_codebook)  # [B, T, K, r]
        return unary + (keys @ query[..., None])[..., 0]

    def walk(
        self,
        hidden: torch.Tensor,  # [B, T, D]
        logits: torch.Tensor,  # [B, T, V]
        anchor: torch.Tensor,  # [B] long
        temperature: float = 0.0,
        generator: Optional[torch.Generator] = None,
    ) -> tuple[torch.Tensor, torch.Tensor, Optional[torch.Tensor]]:
        """Choose one candidate per position, left to right, each conditioned on the previous choice.

        -> (tokens [B, T], candidates [B, T, K], probs [B, T, K] float32 the tokens were drawn from,
        None when greedy: ``temperature`` 0 takes the best score).
        """
        unary, cand = self.candidates(logits)
        prev, tokens, probs = anchor, [], []
        for t in range(hidden.shape[1]):
            step = self.scores(hidden[:, t:t + 1], unary[:, t:t + 1], cand[:, t:t + 1], prev[:, None])[:, 0]  # [B, K]
            if temperature > 0:
                q = (step.float() / temperature).softmax(dim=-1)  # [B, K]
                pick = sample_categorical(q, generator)
                probs.append(q)
            else:
                pick = step.argmax(dim=-1)  # [B]
            prev = cand[:, t].gather(-1, pick[:, None])[:, 0]  # [B]
            tokens.append(prev)
        return torch.stack(tokens, dim=1), cand, torch.stack(probs, dim=1) if probs else None


# ----------------------------------------------------------------------------------------------
# The drafter


class DFlash2Drafter(DFlashDrafter):
    """DFlash 2 draft body: ``DFlashDrafter`` with ``DFlash2Layer`` layers and a ``candidate_selector``.

    ``forward`` (block states through the context KV cache) is inherited unchanged. The block
    convolutions run along the block only, so a forward holding several blocks side by side (the
    ``attn_mask`` training layout) would mix neighbouring blocks: draft one block per row.
    """

    def __init__(self, config: DFlash2Config, hf_config: Optional[dict] = None) -> None:
        if not isinstance(config, DFlash2Config):
            raise TypeError(f"DFlash2Drafter needs a DFlash2Config, got {type(config).__name__}")
        super().__init__(config, hf_config)
        self.config: DFlash2Config = config
        self.layers = nn.ModuleList(DFlash2Layer(config) for _ in range(config.num_layers))
        self.candidate_selector = CandidateSelector(config)

    def init_weights(self, std: float = 0.02, generator: Optional[torch.Generator] = None) -> None:
        """DFlash init, codebooks ~ N(0, std), base kernels the identity (offset-0 tap 1, others 0)."""
        super().init_weights(std, generator)
        with torch.no_grad():
            sel = self.candidate_selector
            for book in (sel.predecessor_codebook, sel.successor_codebook):
                book.normal_(0.0, std, generator=generator)
            for module in self.modules():
                if isinstance(module, GroupedDynamicConv):
                    module.base_kernel.zero_()
                    module.base_kernel[:, 0] = 1.0


@dataclass
class DraftBlock2(DraftBlock):
    """One DFlash 2 block: ``tokens`` are the selector's path (not the per-position arg-max of ``logits``)."""

    candidates: Optional[torch.Tensor] = None  # [B, T-1, K] long, the top-K ids of each position
    probs: Optional[torch.Tensor] = None  # [B, T-1, K] float32 the tokens were drawn from; None = greedy

    def vocab_probs(self) -> Optional[torch.Tensor]:
        """The sampling distributions spread over the vocabulary, [B, T-1, V] (zero off the candidates)."""
        if self.probs is None or self.candidates is None:
            return None
        full = torch.zeros(self.logits.shape, dtype=torch.float32, device=self.logits.device)
        return full.scatter_(-1, self.candidates, self.probs)


@torch.no_grad()
def draft_block2(
    drafter: DFlash2Drafter,
    cache: DraftKVCache,
    features: torch.Tensor,
    block_ids: torch.Tensor,
    *,
    embed_tokens: Union[nn.Module, torch.Tensor],
    lm_head: Union[nn.Module, torch.Tensor],
    temperature: float = 0.0,
    generator: Optional[torch.Generator] = None,
    feature_mask: Optional[torch.Tensor] = None,
    feature_positions: Optional[torch.Tensor] = None,
    block_positions: Optional[torch.Tensor] = None,
    block_valid: Optional[torch.Tensor] = None,
) -> DraftBlock2:
    """Draft one DFlash 2 block: ``draft_block`` (same arguments, same cache use), then the selector's
    left-to-right choice among each position's top-K, starting from the anchor ``block_ids[:, 0]``.

    temperature: 0 -> the best-scoring path (greedy); > 0 -> each choice drawn from
    softmax(score / temperature) over the K candidates (``probs``; ``vocab_probs()`` for [.., V]).
    """
    if not isinstance(drafter, DFlash2Drafter):
        raise TypeError(f"draft_block2 needs a DFlash2Drafter, got {type(drafter).__name__}")
    check_number("temperature", temperature, low=0.0, finite=True, hint=" (0 = greedy)")
    base = draft_block(drafter, cache, features, block_ids, embed_tokens=embed_tokens, lm_head=lm_head,
                       feature_mask=feature_mask, feature_positions=feature_positions,
                       block_positions=block_positions, block_valid=block_valid)
    tokens, cand, probs = drafter.candidate_selector.walk(base.hidden, base.logits, block_ids[:, 0],
                                                          temperature, generator)
    return DraftBlock2(tokens=tokens, logits=base.logits, hidden=base.hidden, candidates=cand, probs=probs)


__all__ = ["CandidateSelector", "DFlash2Config", "DFlash2Drafter", "DFlash2Layer", "DraftBlock2",
           "GroupedDynamicConv", "causal_windows", "draft_block2", "grouped_dynamic_conv"]
