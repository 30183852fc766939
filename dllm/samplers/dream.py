"""Dream's reference algorithms (``diffusion_generate`` in the ``generation_utils.py`` of the
Dream-org/Dream-v0-* checkpoints, HKUNLP/Dream): ``origin``, ``maskgit_plus``, ``topk_margin`` and
``entropy``.

Schedule per block of ``S`` steps: ``t = linspace(1, eps, S + 1)`` (float32); at step i,
``t = t_i``, ``s = t_{i+1}``.
- ``origin``: each masked position is revealed independently with probability ``1 - s/t``
  (all at the last step), its token drawn by ``sample_tokens``. It has no top-k, so it refuses
  ``alg_temp > 0`` and ``ties="first"`` (Dream accepts ``alg_temp`` with ``origin`` and ignores it).
- confidence algorithms: ``k = int(mean_rows(#masks) * (1 - s/t))`` (all remaining masks at the
  last step); commit the top-k masked positions by confidence (``maskgit_plus``: p(x0);
  ``topk_margin``: p(1) - p(2); ``entropy``: sum p log(p + 1e-10)); with ``alg_temp > 0`` the k
  positions are sampled without replacement from ``softmax(confidence / alg_temp)``.
``sample_tokens``: logits / T (T > 0), top-p, top-k, softmax; x0 = a categorical sample (T > 0)
or the arg-max, confidence = p(x0).

Exactness: one block of the whole generation (the default) reproduces ``diffusion_generate`` token
for token at T = 0 and, under the same seed, at T > 0: the draws are made in the reference's order
and shapes (``origin``: ``rand(#masked)`` then one multinomial over the revealed rows; others: one
multinomial over all masked rows when T > 0, then one multinomial without replacement for
``alg_temp > 0``). The top-k (``ties="reference"``, the default) is Dream's own
``torch.topk(confidence, k)`` over the [B, L] canvas (-inf off the masks, in the logits dtype), so
equal confidences -- common once the softmax saturates to exactly 1.0 (peaked logits, bf16) -- are
resolved as Dream resolves them on the same device; that order is the device's (CUDA keeps the
lowest indices, the CPU kernel does not). ``ties="first"`` takes the lowest indices on every device
(a stable sort). ``k`` is a host integer (``topk``'s k, the sample count of ``alg_temp``): every
step's k follows from the block's mask counts (each row commits ``min(k, its masks)``), so
``begin_block`` reads those counts and the time grid once (one host read per block) and plans the
block's ks; the confidence algorithms make no host read per step at T = 0, and one at T > 0 (the
masked positions, as Dream samples only those: the multinomial's shape, hence its random stream,
depends on their number). ``origin`` reads the masked positions every step (``rand(#masked)``), and
at T > 0 the revealed ones (one multinomial over them). With ``steps == gen_length`` the first step
commits nothing (``k = int(G * (1 - s/t)) = 0``), as in Dream. Deliberate difference: the mask token is never
proposed (where Dream would sample or pick it, the arg-max over the other tokens is used).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional, Sequence

import numpy as np
import torch

from dllm.options import check_choice, check_int, check_number, check_unit
from dllm.samplers._ops import (
    TIES,
    argmax_excluding,
    expand_window,
    gather_prob,
    negative_entropy,
    take_top_k,
    top_k_filter,
    top_p_filter,
    top_two_margin,
)
from dllm.samplers import draws
from dllm.samplers.base import Sampler, register_sampler
from dllm.state import DecodeState, StepInput, StepOutput


@dataclass(frozen=True)
class DreamConfig:
    top_p: Optional[float] = None  # nucleus filter, in (0, 1]
    top_k: Optional[int] = None  # keep the k largest logits, k >= 1
    alg_temp: Optional[float] = None  # > 0: sample which positions to commit (confidence algs)
    eps: float = 1e-3  # final time of the schedule, in (0, 1)
    ties: str = "reference"  # equal confidences at the top-k cut: reference (Dream's torch.topk, the
    #   device's order) | first (lowest index first on every device, as torch.topk on CUDA)

    def __post_init__(self) -> None:
        if self.top_p is not None:
            check_unit("top_p", self.top_p, low_open=True)
        if self.top_k is not None:
            check_int("top_k", self.top_k, 1)
        if self.alg_temp is not None:
            check_number("alg_temp", self.alg_temp, low=0.0, finite=True)
        check_unit("eps", self.eps, low_open=True, high_open=True)
        check_choice("ties", self.ties, TIES)


def sample_tokens(
    logits: torch.Tensor,  # [N, V]
    temperature: float,
    top_p: Optional[float],
    top_k: Optional[int],
    mask_id: int,
    generator: draws.Generator,
    segments: Optional[Sequence[int]] = None,  # per-row generators: rows of ``logits`` per batch row
) -> tuple[torch.Tensor, torch.Tensor]:
    """Dream's proposal: returns (probs [N, V], x0 [N]). Confidence kinds are computed from probs."""
    if temperature > 0:
        logits = logits / temperature
    if top_p is not None and top_p < 1:
        logits = top_p_filter(logits, top_p)
    if top_k is not None:
        logits = top_k_filter(logits, top_k)
    probs = torch.softmax(logits, dim=-1)  # [N, V] in the logits dtype
    greedy = argmax_excluding(probs, mask_id)
    if temperature > 0 and probs.shape[0] > 0:
        # Dream draws Categorical(probs).sample(): multinomial over renormalised probs
        normed = probs / probs.sum(-1, keepdim=True)
        x0 = draws.multinomial(normed, 1, generator, replacement=True, segments=segments).squeeze(-1)
        x0 = torch.where(x0 == mask_id, greedy, x0)
    else:
        x0 = greedy
    return probs, x0


class _DreamBase(Sampler):
    Config = DreamConfig
    fixed_steps = True

    def begin_block(self, state: DecodeState) -> None:
        assert state.block_steps is not None
        state.extras["dream_timesteps"] = torch.linspace(
            1, self.config.eps, state.block_steps + 1, device=state.x.device
        )  # [S + 1] float32

    def _times(self, inp: StepInput, state: DecodeState) -> tuple[torch.Tensor, torch.Tensor]:
        ts = state.extras["dream_timesteps"]
        return ts[inp.step], ts[inp.step + 1]


def planned_counts(masks_at_start: Sequence[int], timesteps: Sequence[float]) -> list[int]:
    """Dream's ``k`` for every step of a block, as host integers.

    masks_at_start: each row's masks when the block starts; timesteps: Dream's float32 grid of
    S + 1 times (its values, as built on the canvas device). Step i: ``mean = sum(masks) / B``
    (float32, as Dream's ``num_mask_token``), ``k_i = int(mean * (1 - t_{i+1} / t_i))`` and
    ``int(mean)`` at the last step; then every row loses ``min(k_i, its masks)``: exactly what the
    step commits, so the counts never need to be read again. The float32 arithmetic runs on numpy
    scalars, which round as the device does (IEEE division, subtraction and product). Pure host
    arithmetic: the caller reads the counts and the grid (once per block).
    """
    masks = [int(m) for m in masks_at_start]
    ts = [np.float32(t) for t in timesteps]
    steps = len(ts) - 1
    counts = []
    for i in range(steps):
        mean = np.float32(sum(masks)) / np.float32(len(masks))  # int64 / int -> float32, as Dream
        k = int(mean) if i == steps - 1 else int(mean * (np.float32(1) - ts[i + 1] / ts[i]))
        counts.append(k)
        masks = [m - min(k, m) for m in masks]
    return counts


def flat_positions(active: torch.Tensor) -> torch.Tensor:
    """[B, Q] bool -> [N] long: the flat (row-major) indices of the True entries, the order in which
    Dream's boolean indexing ``x[mask]`` lists them. A host sync (N is data-dependent)."""
    return active.reshape(-1).nonzero().squeeze(1)


def _row_counts(where: torch.Tensor, generator: draws.Generator) -> Optional[list[int]]:
    """Per-row generators only: the True entries of each row of ``where`` [B, Q] (the segments of a
    row-major flat draw over them; a host read where Dream already reads the positions)."""
    return where.sum(dim=1).tolist() if draws.per_row(generator) else None


def scatter_rows(values: torch.Tensor, flat: torch.Tensor, shape: tuple[int, int], fill) -> torch.Tensor:
    """Place ``values`` [N] at the flat indices ``flat`` [N] of a [B, Q] tensor filled with ``fill``
    (Dream's ``x[mask] = values`` without a second boolean index)."""
    out = values.new_full((shape[0] * shape[1],), fill)
    return out.index_copy(0, flat, values).reshape(shape)


@register_sampler("origin")
class Origin(_DreamBase):
    """Dream reference: reveal each mask with probability 1 - s/t (random count per step)."""

    def __init__(self, config: Optional[DreamConfig] = None, **options) -> None:
        super().__init__(config, **options)
        # options of the confidence algorithms' top-k, which origin does not have: refused, not ignored
        if self.config.alg_temp:
            raise ValueError(f"sampler 'origin' reveals masks at random and picks no top-k: alg_temp="
                             f"{self.config.alg_temp!r} has nothing to sample; leave it None, or use maskgit_plus, "
                             f"topk_margin or entropy")
        if self.config.ties != "reference":
            raise ValueError(f"sampler 'origin' has no top-k cut: ties={self.config.ties!r} has nothing to resolve; "
                             f"leave ties='reference'")

    def step(self, inp: StepInput, state: DecodeState) -> StepOutput:
        t, s = self._times(inp, state)
        p_transfer = 1 - s / t if not inp.is_last_step else torch.ones_like(t)
        active = inp.active  # [B, Q]
        shape = (active.shape[0], active.shape[1])
        masked = flat_positions(active)  # [N] host sync: Dream draws rand(#masked)
        lengths = _row_counts(active, inp.generator) or [masked.numel()]
        reveal = draws.rand_segments(lengths, inp.generator, active.device) < p_transfer  # [N]
        cfg = self.config
        if inp.temperature > 0:
            # Dream samples only the revealed rows (one multinomial over them): index them (host sync)
            revealed = masked[reveal.nonzero().squeeze(1)]  # [R] flat indices
            rows = inp.logits.flatten(0, 1)[revealed]  # [R, V]
            segments = _row_counts(scatter_rows(reveal, masked, shape, False), inp.generator)
            _, x0 = sample_tokens(rows, inp.temperature, cfg.top_p, cfg.top_k, inp.mask_id, inp.generator, segments)
            tokens = scatter_rows(x0, revealed, shape, inp.mask_id)  # [B, Q]
        else:
            # deterministic: every position of the block window, the revealed ones kept
            ws, we = inp.window
            _, x0_w = sample_tokens(inp.logits[:, ws:we], 0.0, cfg.top_p, cfg.top_k, inp.mask_id, None)
            x0 = expand_window(x0_w, inp.window, shape[1], inp.mask_id)  # [B, Q]
            revealed = scatter_rows(reveal, masked, shape, False)  # [B, Q]
            tokens = torch.where(revealed, x0, torch.full_like(x0, inp.mask_id))
        commit = active & (tokens != inp.mask_id)
        return StepOutput(commit=commit, tokens=tokens, score=None)


class _DreamConfidence(_DreamBase):
    def begin_block(self, state: DecodeState) -> None:
        super().begin_block(state)
        assert state.block_masks_at_start is not None
        b = state.batch_size
        # the block's one host read: the mask counts and the time grid together (k is topk's k)
        values = torch.cat([state.block_masks_at_start.to(torch.float64),
                            state.extras["dream_timesteps"].to(torch.float64)]).tolist()
        masks = [int(m) for m in values[:b]]
        held = [m for j, m in enumerate(masks) if j not in state.released]  # released rows (dllm.rows)
        state.extras["dream_counts"] = planned_counts(held or masks, values[b:])  # take no part in the mean

    def _confidence(self, probs: torch.Tensor, x0: torch.Tensor) -> torch.Tensor:
        raise NotImplementedError

    def step(self, inp: StepInput, state: DecodeState) -> StepOutput:
        cfg = self.config
        active = inp.active  # [B, Q]
        logits = inp.logits  # [B, Q, V]
        if inp.temperature > 0:
            # Dream samples only the masked rows (flattened row-major): index them (host sync)
            shape = (active.shape[0], active.shape[1])
            masked = flat_positions(active)  # [N]
            probs, x0_rows = sample_tokens(logits.flatten(0, 1)[masked], inp.temperature,
                                           cfg.top_p, cfg.top_k, inp.mask_id, inp.generator,
                                           _row_counts(active, inp.generator))
            conf_rows = self._confidence(probs, x0_rows).to(logits.dtype)  # [N]
            x0 = scatter_rows(x0_rows, masked, shape, inp.mask_id)  # [B, Q]
            conf = scatter_rows(conf_rows, masked, shape, float("-inf"))  # [B, Q]
        else:
            # deterministic: only the block window matters (confidence is -inf elsewhere)
            ws, we = inp.window
            probs, x0_w = sample_tokens(logits[:, ws:we], 0.0, cfg.top_p, cfg.top_k, inp.mask_id, None)
            width = logits.shape[1]
            x0 = expand_window(x0_w, inp.window, width, inp.mask_id)  # [B, Q]
            conf = expand_window(self._confidence(probs, x0_w), inp.window, width, float("-inf"))
            conf = conf.masked_fill(~active, float("-inf"))  # [B, Q]
        k = state.extras["dream_counts"][inp.step]  # host int, planned at the block start
        if k == 0:
            commit = torch.zeros_like(active)
        elif cfg.alg_temp:
            weights = torch.softmax(conf / cfg.alg_temp, dim=-1)  # [B, Q]
            commit = _chosen(active, draws.multinomial(weights, k, inp.generator))
        elif cfg.ties == "reference":
            # Dream's own op on the same [B, Q] tensor: equal confidences (a saturated softmax)
            # resolve as in Dream on this device
            commit = _chosen(active, torch.topk(conf, k, dim=-1).indices)
        else:
            commit = take_top_k(conf, torch.full((), k, device=conf.device), active)
        if inp.is_last_step:  # Dream's int(mean) is every mask left (rows in lock-step); the engine
            commit = active.clone()  # commits them all on a block's last step in any case
        return StepOutput(commit=commit, tokens=x0, score=conf)


def _chosen(active: torch.Tensor, idx: torch.Tensor) -> torch.Tensor:
    """[B, Q] bool map of the positions ``idx`` [B, k] that are active masks."""
    return torch.zeros_like(active).scatter_(1, idx, True) & active


@register_sampler("maskgit_plus")
class MaskGitPlus(_DreamConfidence):
    """Dream: commit the top-k masks by max probability on Dream's timestep schedule."""

    def _confidence(self, probs, x0):
        return gather_prob(probs, x0)


@register_sampler("topk_margin")
class TopKMargin(_DreamConfidence):
    """Dream: commit the top-k masks by the top-2 probability margin on Dream's schedule."""

    def _confidence(self, probs, x0):
        return top_two_margin(probs)


@register_sampler("entropy")
class Entropy(_DreamConfidence):
    """Dream: commit the top-k masks by negative entropy on Dream's schedule."""

    def _confidence(self, probs, x0):
        return negative_entropy(probs)
