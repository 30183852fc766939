"""LLaDA's reference remasking: ``low_confidence`` and ``random`` (ML-GSAI/LLaDA ``generate()``).

Rule (per block with ``m_j`` masks and ``S`` steps): step ``i`` commits
``n[j, i] = m_j // S + (i < m_j % S)`` positions of row j: the top ``n[j, i]`` masked positions of
the block by confidence (``low_confidence``: ``softmax(logits)[x0]`` in the logits dtype;
``random``: uniform scores). Proposals ``x0 = argmax(logits)`` at T = 0, else the Gumbel-max
sample ``argmax exp(l) / (-log u)^T`` with float64 uniforms.

Exactness: with the same weights, prompt and settings this gives the same tokens as
``generate()`` at HEAD (65cbed2) at T = 0, and at T > 0 under the same seed: the uniforms are drawn
as one float64 tensor of the full query shape [B, Q, V] (Q = the whole canvas without a KV cache,
as the reference draws them), then ``random`` draws float32 ``rand(B, Q)``, in that order. The
selection (``ties="reference"``, the default) is LLaDA's own ``torch.topk(confidence, n)`` on the
[B, Q] scores (-inf off the block's masks, in the logits dtype), so equal confidences -- a
float32/bf16 softmax saturating to exactly 1.0 at several masks -- resolve as in LLaDA on the same
device. ``torch.topk``'s order among equal values is the device's: CUDA keeps the lowest indices,
the CPU kernel (a partial sort) does not. A step makes one ``topk`` call over the batch with the
count of a block that starts full, ``k_i = W // S + (i < W % S)`` (host arithmetic on the block's
width W), and row j keeps the first ``n[j, i]`` entries of its sorted result (``top_k_of_topk``).
In ``generate`` a row starts a block either full (the generated region starts masked and a
fixed-step block ends with no mask) -- then ``n[j, i] = k_i`` and its choice is LLaDA's own per-row
call -- or, once finished or released, with no mask (``n = 0``). A row that started a block partly
filled would keep the first ``n[j, i]`` of the sorted output, whose order among equal scores is the
device's. ``ties="first"`` takes the lowest indices among equal scores on every device (a
stable sort, what CUDA's ``torch.topk`` does). Neither reads anything back to the host: the counts
``n`` stay on the device.
Deliberate differences, documented:
- the mask token is never proposed (the reference can "commit" the mask id, leaving the position
  masked and the block unfinished); where the arg-max is the mask id we take the runner-up;
- ``confidence_eos_eot_inf`` removes both EOS and EoT at every temperature (the reference removes
  only EoT when T > 0, ML-GSAI/LLaDA#137);
- EOS ids come from the model (the reference hard-codes the 8B vocabulary's 126081 / 126348).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

import torch

from dllm.options import check_bool, check_choice
from dllm.samplers._ops import (
    argmax_excluding,
    expand_window,
    gather_prob,
    gumbel_perturb,
    TIES,
    full_block_count,
    prefix_masks,
    take_top_k,
    top_k_of_topk,
    transfer_schedule,
    window_of,
)
from dllm.samplers import draws
from dllm.samplers.base import Sampler, register_sampler
from dllm.samplers.chunked import constant, max_prob_excluding, window_uniforms
from dllm.samplers.stats import check_stats, fused_propose, use_fused
from dllm.state import DecodeState, StepInput, StepOutput


@dataclass(frozen=True)
class LLaDAConfig:
    logits_eos_inf: bool = False  # EOS logit = -inf: EOS is never proposed
    confidence_eos_eot_inf: bool = False  # EOS/EoT proposals get confidence 0: committed last
    stats: str = "torch"  # torch | fused | auto (low_confidence only; dllm.samplers.stats)
    ties: str = "reference"  # equal scores at the cut: reference (LLaDA's torch.topk, the device's
    #   order) | first (lowest index first on every device, as torch.topk on CUDA)

    def __post_init__(self) -> None:
        check_bool("logits_eos_inf", self.logits_eos_inf)
        check_bool("confidence_eos_eot_inf", self.confidence_eos_eot_inf)
        check_stats(self.stats)
        check_choice("ties", self.ties, TIES)
        if self.stats == "fused" and self.confidence_eos_eot_inf:
            raise ValueError("stats='fused' does not serve confidence_eos_eot_inf=True (the confidence "
                             "would need a second pass over EOS-masked logits); use stats='torch' or 'auto'")


def keep_table(width: int, steps: int, device: torch.device) -> tuple[torch.Tensor, list[int]]:
    """``prefix_masks(transfer_schedule(m, steps), k0)`` for every mask count m in [0, width] (bool
    [width + 1, S, k0], k0 the largest count), and each step's count for a full block, made once per
    (width, steps, device): a block's prefixes are then its rows' mask counts looked up."""
    def make() -> tuple[torch.Tensor, list[int]]:
        ks = [full_block_count(width, steps, i) for i in range(steps)]
        counts = torch.arange(width + 1, device=device)  # [W + 1]
        return prefix_masks(transfer_schedule(counts, steps), ks[0]), ks  # [W + 1, S, k0]
    return constant(("llada keep", width, steps, device), make)


class _LLaDARemasking(Sampler):
    Config = LLaDAConfig
    fixed_steps = True
    fused_scores = False  # whether the scores are p(x0), which the fused stats kernel can give

    def __init__(self, config: LLaDAConfig | None = None, **options) -> None:
        super().__init__(config, **options)
        if self.config.stats != "torch" and not self.fused_scores:
            raise ValueError(f"sampler {self.name!r} computes no probabilities: stats="
                             f"{self.config.stats!r} has nothing to fuse; leave stats='torch'")

    def begin_block(self, state: DecodeState) -> None:
        assert state.block_steps is not None and state.block_masks_at_start is not None
        # commit counts of this block from the masks it holds now (on the device)
        masks, width, steps = state.block_masks_at_start, state.block_end - state.block_start, state.block_steps
        if self.config.ties == "reference":  # the steps' topk prefixes, once per block: [B, k] each
            table, ks = keep_table(width, steps, masks.device)  # [W + 1, S, k0]: every mask count's, made once
            k0 = ks[0]  # the largest k
            keep = table.index_select(0, masks).unbind(1)  # S x [B, k0]: prefix_masks of the rows' schedules
            state.extras["llada_keep"] = [m if k == k0 else m[:, :k] for m, k in zip(keep, ks)]
        else:
            state.extras["llada_schedule"] = transfer_schedule(masks, steps)  # [B, S]

    def step(self, inp: StepInput, state: DecodeState) -> StepOutput:
        ws, we = inp.window
        logits = inp.logits  # [B, Q, V]; this step's logits belong to the sampler
        eos_ids = state.extras.get("eos_ids", ())
        if self.config.logits_eos_inf and eos_ids:
            logits[:, ws:we, eos_ids[0]] = float("-inf")
        # the window's part of the reference's rand_like(float64 logits) over the full query width
        # (the same stream; on CPU the rest is drawn in pieces and dropped: dllm.samplers.chunked)
        noise = None if inp.temperature == 0 else window_uniforms(logits.shape, inp.window, inp.generator,
                                                                    logits.device, query_start=inp.query_start)
        window_logits = window_of(logits, inp.window)  # [B, W, V]
        if self._fused(window_logits):
            x0, score = fused_propose(window_logits, inp.temperature, noise, inp.mask_id)  # [B, W] x2
        else:
            z = gumbel_perturb(window_logits, inp.temperature, noise)
            x0 = argmax_excluding(z, inp.mask_id)  # [B, W]
            if self.config.confidence_eos_eot_inf and eos_ids:
                window_logits = window_logits.clone()
                for eos in eos_ids:  # int indices: no index tensor to upload
                    window_logits[..., eos] = float("-inf")
            score = self._window_scores(window_logits, x0, inp)  # [B, W]
        width = logits.shape[1]
        score = expand_window(score, inp.window, width, float("-inf"))
        tokens = expand_window(x0, inp.window, width, inp.mask_id)
        if self.config.ties == "reference":
            assert inp.steps is not None
            keep = state.extras["llada_keep"][inp.step]  # [B, k_max]: the first n[j, i] ranks (k_max a host int)
            commit = top_k_of_topk(score, None, keep.shape[1], inp.active, keep=keep)
        else:
            commit = take_top_k(score, state.extras["llada_schedule"][:, inp.step], inp.active)
        return StepOutput(commit=commit, tokens=tokens, score=score, active_only=True)

    def _window_scores(self, window_logits: torch.Tensor, x0: torch.Tensor, inp: StepInput) -> torch.Tensor:
        raise NotImplementedError

    def _fused(self, window_logits: torch.Tensor) -> bool:
        """The fused kernel gives ``p(x0)``: only for ``low_confidence`` without EOS-masked confidence."""
        return (self.fused_scores and not self.config.confidence_eos_eot_inf
                and use_fused(self.config.stats, window_logits))


@register_sampler("low_confidence", aliases=("llada",))
class LowConfidence(_LLaDARemasking):
    """LLaDA reference: commit the scheduled number of most confident masks per step."""

    fused_scores = True

    def joins_mid_block(self, width: int, steps: Optional[int]) -> bool:
        return steps is not None and width % steps == 0  # every step commits width / steps: no step index

    def _window_scores(self, window_logits, x0, inp):
        if inp.temperature == 0 and not self.config.confidence_eos_eot_inf:  # x0 is the arg-max without the mask:
            # p(x0) is the largest probability without it (the softmax is monotone), three calls, no gather
            return max_prob_excluding(window_logits, inp.mask_id)  # [B, W] in the logits dtype
        probs = torch.softmax(window_logits, dim=-1)  # [B, W, V] in the logits dtype, as LLaDA HEAD
        return gather_prob(probs, x0)


@register_sampler("random")
class RandomRemasking(_LLaDARemasking):
    """LLaDA reference: commit the scheduled number of masks per step in random order."""

    def _window_scores(self, window_logits, x0, inp):
        b, q = inp.logits.shape[:2]
        ws, we = inp.window
        # float32 rand(B, L) over the full query width, drawn after the Gumbel noise (as LLaDA)
        return draws.rand((b, q), inp.generator, x0.device, query_start=inp.query_start)[:, ws:we]
