"""Deterministic random weights for the tiny models (``dllm.models.tiny``, ``dllm.models.families.llada2``)."""

from __future__ import annotations

import math

import torch

from dllm.models.families.pretrained import TransformerLM

HEAD_STD = 0.5  # LM head std: normalised hidden (RMS 1) x 64 dims -> logit std ~4, peaked softmax


def init_weights(model: TransformerLM, seed: int) -> None:
    """Deterministic random init (independent of the global RNG).

    Linear weights ~ N(0, 1/fan_in) so attention is far from uniform; embeddings ~ N(0, 1); biases
    ~ N(0, 0.1); norm weights ~ 1 + N(0, 0.1) (not exactly one, so a swapped norm shows); LM head
    (or tied embedding) ~ N(0, HEAD_STD^2). Drawn on the weights' device, from a generator of that
    device (a model built on a GPU, ``tiny(..., device=...)``, draws there: other values than a CPU
    model's, as deterministic).
    """
    device = next(model.transformer.parameters()).device
    gen = torch.Generator(device=device).manual_seed(seed)
    tied = model.config.tie_embeddings
    with torch.no_grad():
        for name, p in model.transformer.named_parameters():
            noise = torch.randn(p.shape, generator=gen, dtype=torch.float32, device=device)
            if name == "lm_head.weight" or (tied and name == "embed.weight"):
                value = noise * HEAD_STD
            elif name == "embed.weight":
                value = noise
            elif name.endswith("norm.weight"):
                value = 1.0 + 0.1 * noise
            elif name.endswith(".bias"):
                value = 0.1 * noise
            else:
                value = noise / math.sqrt(p.shape[1])
            p.copy_(value)
