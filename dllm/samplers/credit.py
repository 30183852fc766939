"""dInfer's credit decoding (``credit``; inclusionAI/dInfer
``python/dinfer/decoding/parallel_strategy.py`` ``CreditThresholdParallelDecoder``; CreditDecoding,
arXiv 2510.06133; dInfer, arXiv 2510.08666).

Rule (defaults alpha 0.7, gamma 0.2, beta 0.8, threshold 0.9): a per-block credit tensor
``C`` [B, W, V] (W = block length), zero at each block start. Each step ``C <- beta * C``; at every
masked position of the block add ``p_top1 ** gamma`` at its top-1 token; decode with the fused
logits ``l + alpha * log(1 + C)`` under the threshold rule (commit ``c >= threshold``, always the
most confident). ``p_top1`` comes from the RAW logits (``softmax(l)`` in float32, as dInfer's
``_apply_credit_fusion``), and the top-1 token is the raw arg-max excluding the mask id; the
proposal and confidence that decide the commit come from the FUSED logits.

Adaptive: the engine loops until the block has no masks, so ``steps`` is ignored. Proposals are
the arg-max (T = 0) or LLaDA's float64 Gumbel-max sample (T > 0) of the fused logits, never the
mask id; confidence is ``p(x0)`` from their float64 softmax (dInfer uses the logits dtype or
float32; float64 keeps our threshold samplers on one footing).
Memory: B x W x V float32 (32 x 126464 x 4 bytes = 16 MB per row for LLaDA-8B).

Compared with dInfer's code through dInfer's decode loops (tests/samplers/test_credit_upstream.py,
against the transcription tests/reference/decoders/credit_generate.py): ``dllm.generate(...,
sampler="credit", stop_at_eos=True)`` gives the same tokens, and as many forwards as dInfer's forwards
that found a mask in their block, on tiny-llada (no cache, dInfer's ``dual`` and ``prefix`` caches),
tiny-dream (dInfer's ``use_shift``) and a random tiny LLaDA 2 (its block-diffusion loop), greedy and
sampled (the same float64 Gumbel uniforms), at dInfer's defaults and other options, and the same
canvas and fused confidences (to 1e-6) over whole blocks of random float32 / bfloat16 logits.
Where they differ, none of it met on those runs except the mask id on the random LLaDA 2:

* the mask id: dInfer credits a raw top-1 equal to it and leaves a position whose fused arg-max is
  the mask id uncommitted (greedy, a block whose every remaining mask does so commits nothing again
  and again: dInfer's loop never ends); ``credit`` credits and proposes the runner-up;
* near-ties: dInfer commits every position within 1e-5 of the block's most confident one (when
  that one is under ``threshold``); ``credit`` only the most confident (the first among equals);
* precision: dInfer's confidence is float32 (ours float64, above), it adds ``log(C + 1)`` (ours
  ``log1p(C)``, within a float32 rounding) and takes the top-1 of the float32 probabilities (ours of
  the logits: the same token unless two probabilities round equal);
* the credit's lifetime: dInfer keys it by the block's columns and drops it only when a decode
  leaves no mask in the canvas, so after a call that stopped on EOS before its last block the next
  call of its scripts (one decoder for every prompt) starts the blocks at the same columns with the
  earlier prompt's credit; ``credit`` starts every block from zero.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from dllm.options import check_number, check_unit
from dllm.samplers._ops import argmax_excluding, expand_window, propose_with_prob, threshold_commit, window_of
from dllm.samplers.base import Sampler, register_sampler
from dllm.state import DecodeState, StepInput, StepOutput


@dataclass(frozen=True)
class CreditConfig:
    alpha: float = 0.7  # weight of log(1 + C) added to the logits, >= 0
    gamma: float = 0.2  # credit added per step is p_top1 ** gamma, >= 0
    beta: float = 0.8  # per-step decay of the credit, in [0, 1]
    threshold: float = 0.9  # commit fused confidence >= this (always the top-1), in (0, 1]

    def __post_init__(self) -> None:
        check_number("alpha", self.alpha, low=0.0, finite=True)
        check_number("gamma", self.gamma, low=0.0, finite=True)
        check_unit("beta", self.beta)
        check_unit("threshold", self.threshold, low_open=True)


@register_sampler("credit")
class Credit(Sampler):
    """dInfer CreditDecoding: threshold rule on logits fused with decayed per-block top-1 credit."""

    Config = CreditConfig
    reads_block_only = True  # the engine computes the block's logits only
    fixed_steps = False

    @property
    def commits_every_step(self) -> bool:
        return True  # threshold_commit always keeps the most confident active mask

    def begin_block(self, state: DecodeState) -> None:
        state.extras["credit"] = None  # allocated at the block's first step (needs V)

    def step(self, inp: StepInput, state: DecodeState) -> StepOutput:
        cfg = self.config
        logits = window_of(inp.logits, inp.window)  # [B, W, V] raw logits of the block
        active = window_of(inp.active, inp.window)  # [B, W]
        credit = state.extras.get("credit")
        if credit is None or credit.shape != logits.shape:
            credit = torch.zeros(logits.shape, dtype=torch.float32, device=logits.device)  # [B, W, V]
            state.extras["credit"] = credit
        else:
            credit.mul_(cfg.beta)
        # credit: raw top-1 token (never the mask id) gets p_top1 ** gamma, masked positions only
        logits32 = logits if logits.dtype == torch.float32 else logits.float()  # [B, W, V]
        raw_probs = torch.softmax(logits32, dim=-1)  # [B, W, V]
        raw_top = argmax_excluding(logits, inp.mask_id, keepdim=True)  # [B, W, 1]
        boost = raw_probs.gather(-1, raw_top).pow(cfg.gamma) * active[..., None]  # [B, W, 1]
        credit.scatter_add_(2, raw_top, boost)
        fused = logits32 + cfg.alpha * torch.log1p(credit)  # [B, W, V]

        x0, conf_w = propose_with_prob(fused, inp.temperature, inp.generator, inp.mask_id)  # [B, W], float64
        width = inp.logits.shape[1]
        tokens = expand_window(x0, inp.window, width, inp.mask_id)  # [B, Q]
        conf = expand_window(conf_w, inp.window, width, float("-inf"))  # [B, Q]
        commit = threshold_commit(conf, inp.active, cfg.threshold)  # [B, Q] active masks only
        return StepOutput(commit=commit, tokens=tokens, score=conf, active_only=True)
