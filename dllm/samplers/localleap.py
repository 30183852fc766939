"""LocalLeap, anchor-relaxed confidence thresholding (``localleap``; arXiv 2510.07081).

Rule (one step, per row), with confidence ``c_i = p_i(x0_i)`` of the proposal at active mask i:
anchors are the active masks with ``c >= tau``; commit the most confident active mask, plus every
active i with

    c_i >= tau_relax   if some anchor j has |i - j| <= radius   (an anchor's neighbourhood)
    c_i >= tau         otherwise

Anchors themselves pass (``c >= tau >= tau_relax``), so with no anchor this is Fast-dLLM's
``threshold`` rule at ``tau``. Distances are in canvas positions (committed positions count).

Adaptive: the engine loops until the block has no masks, so ``steps`` is ignored. Proposals are
the arg-max (T = 0) or LLaDA's float64 Gumbel-max sample (T > 0), never the mask id; confidence
from the float64 softmax (``_ops.propose_with_confidence_on``).

Source and defaults: the paper gives the idea; the rule and the defaults ``tau = 0.9``,
``tau_relax = 0.75``, ``radius = 4`` (block 32) follow DAWN's reimplementation
(lizhuo-luo/DAWN ``get_transfer_index_localleap``), whose comparisons are inclusive (``>=``) and
whose neighbourhood is the closed interval ``[j - radius, j + radius]``. DAWN's Dream scripts use
``tau_relax = 0.8`` (``relaxed_threshold=0.8`` reproduces them); its ``relaxed_threshold=None`` (no
relaxation) is ``relaxed_threshold=threshold`` here.

Compared with DAWN's code (tests/samplers/test_localleap_upstream.py, against the transcription
tests/reference/decoders/localleap_generate.py of DAWN at ab42898: ``llada/generate.py``
``generate(local_leap=True)`` and ``dream/model/generation_utils.py`` ``_sample_block(alg='local_leap')``):
the same tokens and forwards on 16 suite prompts, greedy, on tiny-llada (DAWN's LLaDA settings with
blocks of 8 and 32, and other options) and tiny-dream (DAWN's Dream settings), and the same step on
random logits. Differences (no tie and no mask-id proposal arose on those prompts):
- T > 0: the Gumbel uniforms are the block's columns of a draw over the step's whole query [B, Q, V]
  (the other columns drawn and dropped), so under cache none, DAWN's only setting, the stream is
  DAWN's draw over the canvas ([1, L, V]): the same tokens, seeded alike (tested). Under a cache the
  query is shorter: another stream of the same distribution (a running decode's rows draw their own
  query's too). DAWN's Dream samples with ``Categorical`` instead (another stream).
- Dream: DAWN's confidence is ``sample_tokens``'s softmax in the logits' dtype, ours float64; a bar
  decides otherwise only for a confidence within that rounding of it.
- Several masks tied at the top confidence below tau: DAWN commits the one ``torch.topk`` ranks
  first (the device's order), we the lowest index.
- A proposal equal to the mask id: DAWN commits it (the position stays masked); we propose the
  runner-up.
- DAWN runs LocalLeap in its cacheless driver only; the caches here have no counterpart there.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

import torch
import torch.nn.functional as F

from dllm.options import check_int, check_number, check_unit
from dllm.samplers._ops import propose_with_confidence_on
from dllm.samplers.base import Sampler, register_sampler
from dllm.samplers.chunked import neg_inf, window_uniforms
from dllm.state import DecodeState, StepInput, StepOutput


def window_max(x: torch.Tensor, radius: int) -> torch.Tensor:
    """[B, N]: at each i the largest x_j with |i - j| <= radius (one ``max_pool1d``, padded with -inf).
    x: [B, N] float."""
    r = min(radius, x.shape[1] - 1)  # a wider window sees the whole row all the same
    return F.max_pool1d(x, 2 * r + 1, stride=1, padding=r) if r > 0 else x


def near_anchor(anchor: torch.Tensor, radius: int) -> torch.Tensor:
    """[B, N] bool: position i has an anchor j with |i - j| <= radius. anchor: [B, N] bool."""
    return window_max(anchor.to(torch.float32), radius) > 0


def query_uniforms(inp: StepInput) -> Optional[torch.Tensor]:
    """The block window's columns [B, W, V] of float64 uniforms drawn over the whole query's logits
    [B, Q, V] (``chunked.window_uniforms``; the canvas under cache none: DAWN's ``rand`` over [1, L, V]);
    None at T = 0."""
    if inp.temperature == 0:
        return None
    return window_uniforms(inp.logits.shape, inp.window, inp.generator, inp.logits.device,
                           query_start=inp.query_start)


@dataclass(frozen=True)
class LocalLeapConfig:
    threshold: float = 0.9  # tau: anchors, and the bar far from any anchor, in (0, 1]
    relaxed_threshold: float = 0.75  # tau_relax: the bar within radius of an anchor, in (0, tau]
    radius: int = 4  # neighbourhood half-width in positions, >= 0

    def __post_init__(self) -> None:
        check_unit("threshold", self.threshold, low_open=True)
        check_number("relaxed_threshold", self.relaxed_threshold, low=0.0, high=self.threshold, low_open=True,
                      hint=" (at most threshold)")
        check_int("radius", self.radius, 0)


@register_sampler("localleap", aliases=("local_leap",))
class LocalLeap(Sampler):
    """LocalLeap: confidence threshold, relaxed near high-confidence anchors."""

    Config = LocalLeapConfig
    fixed_steps = False

    @property
    def commits_every_step(self) -> bool:
        return True  # the row's most confident active mask is always committed

    def joins_mid_block(self, width: int, steps: Optional[int]) -> bool:
        return True  # anchors and bars read each row's own masks only, no step index

    def step(self, inp: StepInput, state: DecodeState) -> StepOutput:
        """The rule as ``threshold_commit`` with the per-position bar, in fewer calls: i is near an anchor
        exactly when the largest confidence within the radius passes tau, and a position that passes tau
        is its own anchor, so the positions that pass their bar are the near ones with ``c >= tau_relax``."""
        cfg = self.config
        noise = query_uniforms(inp)  # [B, W, V] float64, None at T = 0
        tokens, conf = propose_with_confidence_on(inp, noise)  # [B, Q] long, [B, Q] float64 (-inf off the window)
        conf = torch.where(inp.active, conf, neg_inf(conf.device))  # [B, Q] anchors and commits: active masks only
        near = window_max(conf, cfg.radius) >= cfg.threshold  # [B, Q]
        commit = near & (conf >= cfg.relaxed_threshold)  # [B, Q]
        commit.scatter_(-1, conf.argmax(dim=-1, keepdim=True), True)  # always the most confident active mask
        return StepOutput(commit=commit & inp.active, tokens=tokens, score=conf, active_only=True)
