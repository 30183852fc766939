"""The masked-diffusion SFT objective of LLaDA (Nie et al., "Large Language Diffusion Models",
arXiv 2502.09992, section 2.3; ``eps`` from the authors' GUIDELINES.md, github.com/ML-GSAI/LLaDA).

Per row b of a batch:

1. draw ``t_b ~ U(0, 1)`` and set the mask probability ``p_b = (1 - eps) * t_b + eps`` with
   ``eps = 1e-3`` (LLaDA's pre-training form: ``p_b ~ U(eps, 1)``, so ``1 / p_b <= 1000`` stays
   bounded; the SFT code uses the same p);
2. mask every ANSWER token independently with probability ``p_b`` (the prompt is never noised; the
   answer includes its EOS padding, which is trained on);
3. loss = ``(1 / B) * sum_b [ sum_{i masked} CE_i / p_b ] / answer_len_b``.

Rows with no masked token contribute zero (the estimator stays unbiased). The mean over rows is
NOT a mean over masked tokens: this is what makes it an upper bound on the answer's negative log
likelihood per token (in nats).

Layout: ``logits[:, i]`` predicts the token AT position i for every family. Dream's official
logits are shifted (the hidden state at i-1 predicts i); ``Dream.forward`` applies the shift, so
:func:`diffusion_loss` reads ``model(...).logits`` and never shifts by itself.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

import torch
import torch.nn.functional as F

MASK_EPS = 1e-3  # p = (1 - eps) t + eps, as in LLaDA's GUIDELINES.md


def mask_probability(t: torch.Tensor, eps: float = MASK_EPS) -> torch.Tensor:
    """t [B] in [0, 1) -> p [B] = (1 - eps) t + eps, in [eps, 1)."""
    return (1.0 - eps) * t + eps


def mask_answer(
    ids: torch.Tensor,  # [B, L] long, clean tokens
    answer_mask: torch.Tensor,  # [B, L] bool, True on answer tokens (EOS padding included)
    generator: Optional[torch.Generator] = None,
    *,
    mask_id: int,
    eps: float = MASK_EPS,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Noise the answer region: returns (noisy [B, L] long, masked [B, L] bool, p [B] float32).

    The uniforms are drawn on the generator's device (CPU by default) in float32 and then moved to
    ``ids.device``, so a seed gives the same masks on every device.
    """
    b, l = ids.shape
    gen_device = generator.device if generator is not None else torch.device("cpu")
    t = torch.rand(b, generator=generator, device=gen_device)  # [B]
    u = torch.rand(b, l, generator=generator, device=gen_device)  # [B, L]
    p = mask_probability(t, eps).to(ids.device)  # [B]
    masked = (u.to(ids.device) < p[:, None]) & answer_mask  # [B, L]
    noisy = ids.masked_fill(masked, mask_id)  # [B, L]
    return noisy, masked, p


def sft_loss(
    logits: torch.Tensor,  # [B, L, V], logits[:, i] predicts position i
    targets: torch.Tensor,  # [B, L] long, clean tokens
    masked: torch.Tensor,  # [B, L] bool, positions that were masked (answer only)
    p: torch.Tensor,  # [B] mask probability of each row
    answer_len: torch.Tensor,  # [B] number of answer tokens per row (EOS padding included)
) -> torch.Tensor:
    """LLaDA SFT loss: ``mean_b( sum_{masked i} CE_i / p_b / answer_len_b )``, a float32 scalar.

    Cross-entropy is computed in float32 on the masked positions only.
    """
    b = targets.shape[0]
    weight = 1.0 / (p.float() * answer_len.float())  # [B]
    rows = masked.nonzero(as_tuple=True)  # N masked positions: (row idx [N], col idx [N])
    ce = F.cross_entropy(logits[rows].float(), targets[rows], reduction="none")  # [N]
    return (ce * weight[rows[0]]).sum() / b


@dataclass
class LossOutput:
    """What one objective evaluation produced (for logging and tests)."""

    loss: torch.Tensor  # float32 scalar, differentiable
    noisy: torch.Tensor  # [B, L] the model's input
    masked: torch.Tensor  # [B, L] bool
    p: torch.Tensor  # [B]
    logits: torch.Tensor  # [B, L, V] (shifted for Dream: [:, i] predicts i)


def diffusion_loss(
    model: torch.nn.Module,
    input_ids: torch.Tensor,  # [B, L] clean tokens
    answer_mask: torch.Tensor,  # [B, L] bool
    key_padding_mask: Optional[torch.Tensor] = None,  # [B, L] bool, True = real token
    positions: Optional[torch.Tensor] = None,  # [B, L] long RoPE positions
    generator: Optional[torch.Generator] = None,
    *,
    eps: float = MASK_EPS,
) -> LossOutput:
    """Mask the answers, run the model's own forward (which applies Dream's shift) and score.

    ``key_padding_mask=None`` means no padding anywhere (skips the model's mask path).
    """
    noisy, masked, p = mask_answer(input_ids, answer_mask, generator, mask_id=model.mask_id, eps=eps)
    logits = model(noisy, positions=positions, key_padding_mask=key_padding_mask).logits  # [B, L, V]
    answer_len = answer_mask.sum(dim=1)  # [B]
    loss = sft_loss(logits, input_ids, masked, p, answer_len)
    return LossOutput(loss, noisy, masked, p, logits)


__all__ = ["MASK_EPS", "LossOutput", "diffusion_loss", "mask_answer", "mask_probability", "sft_loss"]
