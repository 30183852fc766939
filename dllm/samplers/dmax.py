"""DMax's soft parallel decoding (arXiv 2604.08302; czg1225/DMax ``dInfer/python/dinfer/decoding/``
``generate_uniform.py`` ``BlockDiffusionRunner.decode_uniform`` with ``parallel_strategy.py``
``ThresholdParallelDecoder.decode_uniform`` and ``get_transfer_index_uniform``).

DMax decodes a block as a self-refinement from mask embeddings to token embeddings. Every position of
the block that was a mask when the block started is *active*; a decoded active position stays
revisable until the block ends, and its next input is not its token but the interpolation
``p E[x] + (1 - p) E[mask]`` of its current prediction x (confidence p) with the mask, rescaled to
``p |E[x]| + (1 - p) |E[mask]|`` (the engine's soft inputs, ``dllm.models.core.soft_inputs``). One
step, per row:

1. proposals x = arg-max of the block's logits, confidence p = softmax probability of x (float32);
2. decode the masks left to right up to the first mask with ``p < threshold`` (none qualifying: the
   leftmost mask);
3. every decoded active position is rewritten with its new x (``StepOutput.rewrite``);
4. the row is *settled* (its block final) once it has no masks and either every active position has
   ``p >= confident`` or the step changed no token; a settled row is left alone;
5. otherwise its decoded active positions are soft inputs for the next forward.

A block ends when every row is settled, or after ``max_steps`` forwards (the release: the block
length). The engine serves any cache policy: the finished blocks' keys/values come from their final
tokens (the release's cross-block update), the block's own from its soft inputs.

Differences from the release, for the engine's contracts: decisions are per row (the release tests
``mask_index.any()``, the confidence and "changed" conditions over the whole batch; its runs are
batch 1), so a ragged batch decodes each row as alone; proposals never take the mask id (the
release's arg-max may, which leaves or turns a position back into a mask, and a block can then end
with masks); a row settles only without masks (the release may stop a block with masks left when
``threshold > confident``). With ``threshold <= confident`` and a model that never ranks the mask
first, the tokens are the release's (tests/samplers/test_dmax_reference.py). Greedy only, as the
release's evaluations. The defaults are its evaluation settings (``threshold=0.5``,
``dInfer/evaluations/eval_llada_dmax_math.sh``) and its fixed 0.9. The release pairs it with DMax
weights (On-Policy Uniform Training); on other weights it is a sampler like any other.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

import torch

from dllm.models.core.soft_inputs import SoftInputs
from dllm.options import check_optional_int, check_unit
from dllm.samplers._ops import expand_window
from dllm.samplers.base import Sampler, register_sampler
from dllm.samplers.chunked import argmax_excluding
from dllm.state import DecodeState, StepInput, StepOutput

ACTIVE_KEY = "dmax_active"  # state.extras: [B, W] bool, the block's masks at its start
SETTLED_KEY = "dmax_settled"  # state.extras: [B] bool, rows whose block is final
RENORM_EPS = 1e-6  # the release's epsilon in the soft embedding's rescaling


@dataclass(frozen=True)
class DMaxConfig:
    threshold: float = 0.5  # decode the masks left to right while p >= this, in [0, 1]
    confident: float = 0.9  # a row's block is final when every active p >= this, in (0, 1]
    max_steps: Optional[int] = None  # forwards per block at most (None: the block length, as the release)

    def __post_init__(self) -> None:
        check_unit("threshold", self.threshold)
        check_unit("confident", self.confident, low_open=True)
        check_optional_int("max_steps", self.max_steps, 1)


def top1_prob(logits: torch.Tensor, mask_id: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(arg-max never the mask id [B, W] long, its float32 softmax probability [B, W]) of logits [B, W, V]."""
    x0 = argmax_excluding(logits, mask_id)  # [B, W]
    z = logits.float()
    return x0, torch.exp(z.gather(-1, x0[..., None]).squeeze(-1) - torch.logsumexp(z, dim=-1))


def left_to_right(masks: torch.Tensor, conf: torch.Tensor, threshold: float) -> torch.Tensor:
    """The masks before the first mask with ``conf < threshold``; a row where that is none: its
    leftmost mask. masks [B, W] bool, conf [B, W] -> [B, W] bool."""
    failed = (masks & (conf < threshold)).long().cumsum(dim=1) > 0  # [B, W] from the first low mask on
    chosen = masks & ~failed
    first = masks & (masks.long().cumsum(dim=1) == 1)
    return torch.where(chosen.any(dim=1, keepdim=True), chosen, first)


def mask_mixture(x0: torch.Tensor, conf: torch.Tensor, where: torch.Tensor, mask_id: int) -> SoftInputs:
    """DMax's soft inputs: ``conf E[x0] + (1 - conf) E[mask]`` at ``where``, norm-restored ([B, W])."""
    tokens = torch.stack([x0, torch.full_like(x0, mask_id)], dim=-1)  # [B, W, 2]
    weights = torch.stack([conf, (1.0 - conf).clamp_min(0.0)], dim=-1)  # [B, W, 2]
    return SoftInputs(where, tokens, weights, renorm_eps=RENORM_EPS)


@register_sampler("dmax", description="DMax: soft parallel decoding, decoded positions revised from "
                  "embedding-interpolated inputs until the block settles (greedy)")
class DMax(Sampler):
    """Left-to-right threshold decoding; decoded positions are revised every step from soft inputs
    (prediction-mask interpolations) until the row's block is confident or stable."""

    Config = DMaxConfig
    fixed_steps = False
    greedy_only = True
    reads_block_only = True  # the engine computes the block's logits only
    refines = True  # rewrites committed tokens of the block and runs it until every row settles
    soft_inputs = True  # feeds mixed input embeddings (StepOutput.soft): a model with an input embedding

    def begin_block(self, state: DecodeState) -> None:
        s, e = state.block_start, state.block_end
        state.extras[ACTIVE_KEY] = state.x[:, s:e] == state.mask_id  # [B, W]
        state.extras[SETTLED_KEY] = torch.zeros(state.batch_size, dtype=torch.bool, device=state.x.device)

    def max_block_steps(self, block_len: int) -> int:
        return self.config.max_steps or block_len  # the engine passes the nominal block length (refines)

    def step(self, inp: StepInput, state: DecodeState) -> StepOutput:
        cfg = self.config
        ws, we = inp.window
        logits, current = inp.logits[:, ws:we], inp.tokens[:, ws:we]  # [B, W, V], [B, W]
        active, settled = state.extras[ACTIVE_KEY], state.extras[SETTLED_KEY]  # [B, W], [B]
        x0, conf = top1_prob(logits, inp.mask_id)
        masks = current == inp.mask_id  # [B, W]
        live = ~settled[:, None]  # [B, 1]
        commit = left_to_right(masks, conf, cfg.threshold) & live
        rewrite = active & ~masks & live
        changed = ((commit | rewrite) & (x0 != current)).any(dim=1)  # [B]
        left = masks & ~commit  # [B, W] masks after this step
        confident = (conf >= cfg.confident).logical_or_(~active).all(dim=1)  # [B]
        settled = settled | ((confident | ~changed) & ~left.any(dim=1))
        state.extras[SETTLED_KEY] = settled
        width = inp.tokens.shape[1]
        return StepOutput(
            commit=expand_window(commit, inp.window, width, False),
            tokens=expand_window(x0, inp.window, width, inp.mask_id),
            score=expand_window(conf.masked_fill(~masks, float("-inf")), inp.window, width, float("-inf")),
            active_only=True,
            rewrite=expand_window(rewrite, inp.window, width, False),
            settled=settled,
            soft=mask_mixture(x0, conf, active & ~left & ~settled[:, None], inp.mask_id),
        )
