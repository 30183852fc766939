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
from dllm.samplers._ops import expand_window, window_of
from dllm.samplers.base import Sampler, register_sampler
from dllm.samplers.chunked import argmax_excluding, pick_last, without_column
from dllm.state import DecodeState, StepInput, StepOutput

OPEN_KEY = "dmax_open"  # state.extras: [B, W] bool, the block's masks at its start in rows not settled
SETTLED_KEY = "dmax_settled"  # state.extras: [B] bool, rows whose block is final
FILL_KEY = "dmax_fill"  # state.extras: [B, W] long, the mask id (the soft inputs' second token)
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
    """(arg-max never the mask id [B, W] long, its float32 softmax probability [B, W]) of logits [B, W, V]:
    the release's ``exp(z[x] - logsumexp(z))`` with z the float32 logits. Where the mask id is an inner
    id, one ``max`` gives the arg-max (its first index, as ``argmax``) and the value at it."""
    v = logits.shape[-1]
    if 0 < mask_id < v:  # argmax_excluding's own rule: the mask's column at -inf
        best, x0 = without_column(logits, mask_id).max(dim=-1)
    else:
        x0 = argmax_excluding(logits, mask_id)  # [B, W]
        best = pick_last(logits, x0)  # [B, W]
    if best.dtype == torch.float64:  # the release subtracts in float32; narrower dtypes widen exactly
        best = best.float()
    z = logits if logits.dtype == torch.float32 else logits.float()  # [B, W, V] float32
    return x0, torch.exp(best - torch.logsumexp(z, dim=-1))


def past_first_low(masks: torch.Tensor, conf: torch.Tensor, threshold: float) -> torch.Tensor:
    """[B, W] bool: the columns at or after both a mask with ``conf < threshold`` (a low mask) and the
    row's second mask: its masks past them are the ones ``left_to_right`` leaves. masks [B, W] bool,
    conf [B, W].

    One cumsum of 1 per mask plus ``K = W`` per low mask: with m masks and c low masks up to column i,
    ``m + K c > K + 1`` exactly when c >= 1 and m >= 2 (as m <= W), and the sum never decreases, so the
    last column says whether the row has such a mask at all."""
    w = masks.shape[1]
    step = torch.where(conf < threshold, w + 1, 1) * masks  # [B, W] long: 0, 1, or K + 1 at a low mask
    return step.cumsum(dim=1) > w + 1


def left_to_right(masks: torch.Tensor, conf: torch.Tensor, threshold: float) -> torch.Tensor:
    """The masks before the first mask with ``conf < threshold``; a row where that is none: its
    leftmost mask. masks [B, W] bool, conf [B, W] -> [B, W] bool."""
    return masks > past_first_low(masks, conf, threshold)  # bool > bool: masks and not past


def mask_mixture(x0: torch.Tensor, conf: torch.Tensor, where: torch.Tensor, fill: torch.Tensor) -> SoftInputs:
    """DMax's soft inputs: ``conf E[x0] + (1 - conf) E[mask]`` at ``where``, norm-restored ([B, W]);
    ``fill`` [B, W] holds the mask id."""
    tokens = torch.stack([x0, fill], dim=-1)  # [B, W, 2]
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

    @property
    def commits_every_step(self) -> bool:
        return True  # the left-to-right rule always takes a row's leftmost mask

    def begin_block(self, state: DecodeState) -> None:
        s, e = state.block_start, state.block_end
        state.extras[OPEN_KEY] = state.x[:, s:e] == state.mask_id  # [B, W]: every row is open
        state.extras[SETTLED_KEY] = torch.zeros(state.batch_size, dtype=torch.bool, device=state.x.device)
        state.extras[FILL_KEY] = torch.full((state.batch_size, e - s), state.mask_id, device=state.x.device)

    def max_block_steps(self, block_len: int) -> int:
        return self.config.max_steps or block_len  # the engine passes the nominal block length (refines)

    def step(self, inp: StepInput, state: DecodeState) -> StepOutput:
        """One step of the module docstring's rule. A settled row has no masks (it settled with none
        left, and no step writes a mask), so its commits need no test of the row; its decoded positions
        are left alone through the open map (the block's masks at its start, in rows not settled). A
        row stays unsettled while masks are left or some open position is below ``confident`` and some
        changed (a committed mask always changes)."""
        cfg = self.config
        logits = window_of(inp.logits, inp.window)  # [B, W, V]
        current, masks = window_of(inp.tokens, inp.window), window_of(inp.active, inp.window)  # [B, W]
        open_, settled = state.extras[OPEN_KEY], state.extras[SETTLED_KEY]  # [B, W], [B]
        x0, conf = top1_prob(logits, inp.mask_id)
        past = past_first_low(masks, conf, cfg.threshold)  # [B, W]
        commit = masks > past  # left_to_right: masks not past the first low one
        rewrite = open_ > masks  # decoded active positions of the rows not settled
        revised = rewrite | commit  # [B, W] the open positions that hold a token after this step
        # per row: an open position below ``confident`` and an open position that changed (a mask does)
        unsure_and_changed = (torch.stack([conf < cfg.confident, x0 != current]) & open_).any(
            dim=-1, keepdim=True).all(dim=0)  # [B, 1]
        stays = unsure_and_changed | past[:, -1:]  # [B, 1] not settled: unsure and changed, or masks left
        #   (past's last column)
        state.extras[OPEN_KEY] = open_ & stays
        settled = settled >= stays[:, 0]  # bool >=: settled or not staying
        state.extras[SETTLED_KEY] = settled
        fill = state.extras[FILL_KEY]
        if fill.shape != x0.shape:
            fill = torch.full_like(x0, inp.mask_id)
        width = inp.tokens.shape[1]  # the query's (the window itself, no copies, on the block view)
        return StepOutput(
            commit=expand_window(commit, inp.window, width, False),
            tokens=expand_window(x0, inp.window, width, inp.mask_id),
            score=expand_window(conf, inp.window, width, float("-inf")),  # the engine reads it at masks only
            active_only=True,
            rewrite=expand_window(rewrite, inp.window, width, False),
            settled=settled,
            soft=mask_mixture(x0, conf, revised & stays, fill),
        )
