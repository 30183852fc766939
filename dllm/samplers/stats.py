"""Where a sampler computes its per-step vocabulary statistics: ``torch`` or the fused Triton kernel.

A confidence sampler needs, per position of the block window, the proposal ``x0`` (arg-max without
the mask id at T = 0, LLaDA's Gumbel-max sample at T > 0) and its probability ``p(x0)``. The
reference path (``torch``) gets them from a full softmax over [B, W, V] (float64 in Fast-dLLM, the
logits dtype in LLaDA): for LLaDA-8B's 126,464-word vocabulary that is a [B, W, V] float64 copy per
step. The ``fused`` path reads the logits once in ``dllm.kernels.triton.stats.vocab_stats`` and keeps
float32 running scalars; nothing of size V is allocated except, at T > 0, the uniforms, which are
still drawn with torch so that a seed gives the reference's random stream.

Choices (a sampler option, ``threshold:stats=fused``):

- ``torch`` (default): the reference path, token-for-token equal to the published code.
- ``fused``: the kernel; needs CUDA tensors (or ``TRITON_INTERPRET=1`` on CPU) and ``triton``.
  Tokens equal the reference's except where two candidates tie within float32 rounding, or on a
  row with a +inf / NaN logit (``dllm.samplers.chunked.greedy_with_prob``).
- ``auto``: ``fused`` when the logits are on a CUDA device and the kernel can run there, else ``torch``.

The kernel module is imported only when the fused path is taken (importing it fixes whether Triton
runs compiled or interpreted).
"""

from __future__ import annotations

import functools
from typing import Optional

import torch

from dllm.options import check_choice

STATS_CHOICES: tuple[str, ...] = ("torch", "fused", "auto")


def check_stats(value: object) -> str:
    """Validate a ``stats=`` option; returns it."""
    check_choice("stats", value, STATS_CHOICES)
    return str(value)


@functools.lru_cache(maxsize=None)
def fused_unavailable_reason() -> Optional[str]:
    """Why the fused kernel cannot run in this process (None when it can)."""
    try:
        from dllm.kernels.triton.attention import unavailable_reason
    except ImportError as exc:  # triton missing
        return f"triton is not importable ({exc}); pip install triton"
    return unavailable_reason()


def use_fused(choice: str, logits: torch.Tensor) -> bool:
    """Whether ``choice`` takes the fused path for these logits (``auto``: CUDA and a working kernel)."""
    if choice == "torch":
        return False
    if choice == "fused":
        reason = fused_unavailable_reason()
        if reason is not None:
            raise RuntimeError(f"stats='fused' cannot run: {reason}; use stats='torch' or 'auto'")
        return True
    return logits.is_cuda and fused_unavailable_reason() is None


def fused_propose(
    window_logits: torch.Tensor,  # [B, W, V] float32 / float16 (bf16 on GPU)
    temperature: float,
    noise: Optional[torch.Tensor],  # [B, W, V] uniforms when temperature > 0
    mask_id: int,
) -> tuple[torch.Tensor, torch.Tensor]:
    """The fused neighbour of ``propose`` + ``gather_prob(softmax(logits), x0)``.

    Returns (x0 [B, W] long, p(x0) [B, W] float32): the arg-max (T = 0) or the Gumbel-max draw on
    ``noise`` (T > 0), never ``mask_id``, and its softmax probability at temperature 1.
    """
    from dllm.kernels.triton.stats import vocab_stats

    if temperature > 0:
        st = vocab_stats(window_logits, banned=mask_id, temperature=temperature, uniforms=noise)
        assert st.sample is not None and st.sample_prob is not None
        return st.sample, st.sample_prob
    st = vocab_stats(window_logits, banned=mask_id)
    return st.argmax, st.top1_prob


__all__ = ["STATS_CHOICES", "check_stats", "fused_propose", "fused_unavailable_reason", "use_fused"]
