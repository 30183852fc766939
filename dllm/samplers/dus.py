"""DUS, the Dilated Unmasking Scheduler (``dus``; omerlux/DUS, arXiv 2506.19037).

A model-free order inside each block of B positions. With base b (2) and ``R = ceil(log_b B)``
rounds (at least 1), round t = 1..R uses the stride ``s_t = b^(R - t)`` and reveals the
not-yet-revealed 1-indexed positions k with ``(k - 1) mod s_t == 0``. For a power-of-two block
this is the paper's ``s_t = B / 2^t``: round 1 reveals 2 positions (the block's first and middle
ones), round t reveals 2^(t-1), the last B/2 (every other position), B = 8: {1, 5}, {3, 7},
{2, 4, 6, 8}. Tokens are the arg-max (T = 0) or LLaDA's float64 Gumbel-max sample (T > 0), never
the mask id. Cost: R forwards per block (B / log2 B tokens per forward).

Decisions:
- Step count. DUS needs R steps per block whatever ``steps`` says, so it is an *adaptive* sampler
  (``fixed_steps = False``: the engine ignores ``steps`` and loops until the block has no masks)
  whose rule commits, per row, exactly the active positions of the *earliest round that still has
  masked positions*. On a fresh block that is round 1, 2, ..., R at steps 0, 1, ..., R-1, so the
  block takes exactly R forwards. The round is read off the positions themselves, so there is no
  round counter to keep in ``state.extras``: a block that starts partly filled just skips the
  rounds that are already complete, and every step commits at least one position per row.
- Blocks that are not a power of b (including a short last block) use the schedule of the next
  power ``B' = b^R >= B`` restricted to the block: strides stay powers of b, every round is
  non-empty and the block still takes ``R = ceil(log_b B)`` forwards (B = 6: {1, 5}, {3},
  {2, 4, 6}). The authors' code instead halves an integer stride (``B // 2, B // 4, ...``) and
  merges a small last level into the one before, which for such blocks gives ``floor(log2 B)``
  or fewer uneven rounds (B = 5 becomes a single round of all five positions).
- No remasking. The authors' ``generate_scheduled`` by default (``remasking='low_confidence'``,
  ``confidence_threshold=0.3``, the README's setting) masks again, after every round but a block's
  last, each position of that round whose ``p(x0)`` (float64 softmax; at T > 0 of the perturbed
  logits, where it is ~1 and rarely fires) is below the threshold, and never revisits it: later
  rounds list other positions, so it is still masked in the answer. Their harness's default
  ``confidence_threshold`` is 0.0, which never fires. The method as the paper describes it (arXiv
  2506.19037) has no remasking, and neither do we: ``remasking='none'`` (or a threshold of 0).

Compared with the authors' code (tests/samplers/test_dus_upstream.py, against the transcription
tests/reference/decoders/dus_generate.py of omerlux/DUS ``generate.py`` ``generate_scheduled``,
``scheduler='dilated'``): where the schedules agree -- blocks of a power of the base, their remasking
off -- the same tokens and forwards on 16 suite prompts, greedy, on tiny-llada (blocks of 8, 16 and
32) and tiny-dream (their harness shifts Dream's logits, as we do), and sampled (T = 1) on tiny-llada: at
T > 0 the Gumbel uniforms are the block's columns of a draw over the whole canvas ([B, L, V], the other
columns drawn and dropped), their stream (the one of their cacheless loop; under cache none the logits
are theirs too). Other differences: a proposal equal to the mask id is committed by them (the position
stays masked), never proposed here; their harness stops a row in mid-block once a stop string appears
(``stop_at_eos`` here acts after the block, on EOS).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from dllm.options import check_int
from dllm.samplers._ops import window_of, window_output
from dllm.samplers.base import Sampler, register_sampler
from dllm.samplers.chunked import argmax_excluding, columns_gumbel_argmax, constant
from dllm.state import DecodeState, StepInput, StepOutput


def num_rounds(block: int, base: int = 2) -> int:
    """``R = ceil(log_base block)``, at least 1 (exact integer arithmetic)."""
    r = 1
    while base**r < block:
        r += 1
    return r


def dilated_rounds(block: int, base: int = 2, device=None) -> torch.Tensor:
    """[block] long: the round (1..R) in which each 0-indexed block position is revealed.

    Position k is revealed in round ``R - v(k)`` with ``v(k)`` the largest j < R such that b^j
    divides k (k = 0: round 1).
    """
    r = num_rounds(block, base)
    k = torch.arange(block, device=device)
    v = torch.zeros_like(k)
    for j in range(1, r):  # R = O(log B) host-side integers, no tensor read back
        v += (k % base**j == 0).long()
    return r - v


@dataclass(frozen=True)
class DUSConfig:
    base: int = 2  # dilation base b: round 1 reveals b positions, rounds = ceil(log_b B), >= 2

    def __post_init__(self) -> None:
        check_int("base", self.base, 2)


@register_sampler("dus", aliases=("dilated",))
class DUS(Sampler):
    """DUS: reveal each block in ceil(log2 B) dilated rounds (coarse to fine), tokens by arg-max."""

    Config = DUSConfig
    reads_block_only = True  # the engine computes the block's logits only
    fixed_steps = False  # it sets its own step count: ceil(log_b B) per block (see the docstring)

    @property
    def commits_every_step(self) -> bool:
        return True  # every active mask of the earliest round that still has one

    def step(self, inp: StepInput, state: DecodeState) -> StepOutput:
        ws, we = inp.window
        x0 = proposals(window_of(inp.logits, inp.window), inp, state)  # [B, W]
        active = window_of(inp.active, inp.window)  # [B, W]
        rounds, score = round_tables(we - ws, self.config.base, x0.device)  # [W] long, [1, W] float32
        pending = torch.where(active, rounds, we - ws + 1)  # [B, W] past every round where not active
        current = pending.min(dim=1, keepdim=True).values  # [B, 1] earliest unfinished round
        out = window_output(inp, active & (rounds == current), x0, score)  # the engine reads scores at masks
        out.active_only = True
        return out


def proposals(logits: torch.Tensor, inp: StepInput, state: DecodeState) -> torch.Tensor:
    """The block's tokens, never the mask id: the arg-max of logits [B, W, V] (T = 0; ``state`` unread), else
    LLaDA's float64 Gumbel-max on the block's columns of uniforms drawn over the whole canvas' logits [B, L, V]
    (``chunked.columns_gumbel_argmax``: the authors' stream). -> [B, W] long."""
    if inp.temperature == 0:
        return argmax_excluding(logits, inp.mask_id)
    s = inp.query_start + inp.window[0]  # the block's first canvas column
    return columns_gumbel_argmax(logits, inp.temperature, inp.generator, inp.mask_id, state.x.shape[1], s)


def round_tables(block: int, base: int, device) -> tuple[torch.Tensor, torch.Tensor]:
    """``dilated_rounds(block, base)`` [block] long and its step score ``-round`` as [1, block]
    float32 (earlier rounds first), made once per (block, base, device) (``chunked.constant``)."""
    def make() -> tuple[torch.Tensor, torch.Tensor]:
        rounds = dilated_rounds(block, base, device=device)
        return rounds, (-rounds).to(torch.float32)[None]

    return constant(("dus rounds", block, base, device), make)
