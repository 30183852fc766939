"""Learn2PD, learnable parallel decoding, with end-of-text prediction (Bao et al., "Learning to
Parallel: Accelerating Diffusion Large Language Models via Learnable Parallel Decoding", arXiv
2509.25188; code: ims-kdks/Learning-to-Parallel-Decoding, ``llada/generate.py``
``generate_learn2parallel`` and ``generate_l2p_eot``, the filter ``LogisticRegression`` of
``model/small_model.py``, trained in ``train.ipynb``).

A small learned *filter* reads the confidences of the current block and says which masked positions
already hold their final token; those are committed, plus the most confident mask (progress).

Each step, over the block's W positions (committed ones included, as the reference reads them):

1. proposals ``x0``: the arg-max (T = 0), or LLaDA's float64 Gumbel-max sample
   ``argmax exp(l) / (-log u)^T`` with the uniforms the reference draws (``rand_like`` of the whole
   canvas' float64 logits); never the mask id;
2. confidences ``c = softmax(l)[argmax]`` in the logits' dtype at every block position (a committed
   position's is the model's re-prediction there; the arg-max as the reference takes it, the mask
   id included, while a proposal is never the mask id: the runner-up there);
3. the filter (``Learn2PDFilter``: ``Linear(N, N) -> ReLU -> Linear(N, N)``, N its width, 32 as
   the authors'; a block narrower than N is zero-padded on the right and the first W outputs kept)
   maps ``c`` (float32; or ``-log(1 - c)``, a filter trained on that: ``input="surprisal"``, ours) to
   one logit per position; a mask is *accepted* when ``sigmoid > threshold`` (0.96, the authors'
   ``accept_thres``);
4. commit the accepted masks and the most confident mask (``torch.topk(c, 1)`` over the canvas row,
   -inf off the block's masks, as the reference: ``ties="reference"``; ``"first"``: the lowest index).
   The reference's per-step count is LLaDA's schedule with ``steps = gen_length`` (its runs), i.e.
   one: the filter's set plus the top-1.

EoTP, end-of-text prediction (``eotp=True``, the reference's ``generate_l2p_eot``): a row's text
ends when (a) the filter accepts an EOS proposal at a mask of the block: after the first such
position; else (b) when some mask of the block proposes EOS: after the most confident such one
(itself still decoded later). The reference then truncates its canvas there, so the model no longer
reads the columns after it and no later block is decoded. Here the canvas keeps its width: those
columns' masks are committed as EOS (the padding the model was trained with) in the same step, and
(c) a row whose text ended in an earlier block commits EOS on every mask of a later block at its
first step. ``dllm.generate(..., stop_at_eos=True)`` then releases the row after the block
(``dllm.rows``: no more forwards for it), the engine's own early end, not a second copy of it. Where the
reference's cut removes only masks no later forward reads differently (one block of the answer
length, the PB-mini layout of ``dllm compare``), the tokens up to the end of text are the reference's
(tests/samplers/test_learn2pd.py, 20 prompts on each tiny model); with blocks over an EOS-padded
canvas the model reads EOS where the reference reads nothing, and a committed token right of the cut
stays (this sampler never revises): measured with blocks of 4 and 8, tiny-llada differed on 5-7 of
20 prompts, tiny-dream on none. Exact EoTP needs a facility the engine lacks: cutting a row's canvas
(its columns right of the end hidden from attention and from the query). Rule (b) reads the block
only, as the reference's cached drivers do (its no-cache driver reads every mask of the canvas).

``filter``: a shipped filter's name, a directory holding ``filter.json`` + ``filter.safetensors``, or a
``Learn2PDFilter`` (the module, its files and loading: ``dllm.samplers.learn2pd_filter``). Shipped, both
trained in minutes on tiny-llada's and tiny-dream's own PB-mini traces (``dllm train --recipe NAME``,
``dllm/train/learn2pd.py``): ``learn2pd-tiny-surprisal`` (the default: it reads ``-log(1 - c)``, ours;
the tiny models put 42 % of their positions at ``c >= 0.99``, where the authors' raw input leaves the
filter almost nothing to tell apart) and ``learn2pd-tiny`` (the authors' input, ``c``; what the
transcription tests run). A filter is specific to the model whose confidences it was trained on.

Nothing is read back to the host (the filter runs where the logits are). NFE: one forward per step.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any, Optional

import torch
import torch.nn as nn

from dllm.options import SettingError, check_bool, check_choice, check_unit
from dllm.samplers._ops import TIES, gumbel_perturb, window_of, window_output
from dllm.samplers.base import Sampler, register_sampler
from dllm.samplers.chunked import (argmax_excluding, constant, max_prob_excluding, neg_inf, rows_per_chunk,
                                    softmax_prob, window_uniforms)
from dllm.samplers.learn2pd_filter import (DEFAULT_FILTER, FILTER_CONFIG, FILTER_WEIGHTS, INPUTS,
                                           FoldedFilter, Learn2PDFilter, copy_filter_to, filter_directory,
                                           fold_filter, load_filter, shipped_filters)
from dllm.state import DecodeState, StepInput, StepOutput


def block_confidence(logits: torch.Tensor, x0: torch.Tensor) -> torch.Tensor:
    """The filter's input: ``softmax(logits)[x0]`` in the logits' dtype (the reference's ``x0_p``).
    logits [B, W, V], x0 [B, W] -> [B, W]."""
    return softmax_prob(logits, x0, dtype=logits.dtype)


def top_confidence(logits: torch.Tensor) -> torch.Tensor:
    """``block_confidence(logits, logits.argmax(-1))`` (the T = 0 proposals) in two calls:
    ``softmax(l).amax(-1)``. The softmax ``exp(l - max) / sum`` is largest where l is (exp(0) = 1 is its
    largest term), so its maximum is its value at the arg-max, whichever of equal maxima argmax takes.
    logits [B, W, V] -> [B, W]; a tensor over ``chunked.CHUNK_ELEMENTS`` takes the chunked gather."""
    v = logits.shape[-1]
    if logits.numel() > rows_per_chunk(v) * v:
        return block_confidence(logits, logits.argmax(dim=-1))
    return max_prob_excluding(logits, None, logits.dtype)


def text_end(hi: torch.Tensor, x0: torch.Tensor, conf: torch.Tensor, active: torch.Tensor,
             eos: int) -> torch.Tensor:
    """The column after which each row's text ends (EoTP), [B, 1] long; W - 1 where it does not end in
    this block. One arg-max over a key that ranks (a) the EOS proposals the filter accepts at 2, all
    equal (the first wins), above (b) the other EOS proposals at their confidence in [0, 1] (the
    likeliest, the first among equals, as the reference's ``argmax``), above the other columns at
    -W..-1 (increasing: the last column, so no cut). hi [B, W] bool: the filter's yes (read at active
    EOS proposals only); x0 [B, W] long; conf [B, W] float; active [B, W] bool."""
    w = x0.shape[1]
    ramp = constant(("learn2pd ramp", w, conf.dtype, conf.device),
                    lambda: torch.arange(-w, 0, dtype=conf.dtype, device=conf.device))  # [W]
    eos_mask = active & (x0 == eos)  # [B, W]
    key = torch.where(eos_mask, torch.where(hi, 2.0, conf), ramp)  # [B, W]
    return key.argmax(dim=1, keepdim=True)  # [B, 1]


def end_of_text(accepted: torch.Tensor, x0: torch.Tensor, conf: torch.Tensor, active: torch.Tensor,
                eos: int) -> torch.Tensor:
    """EoTP's cut: [B, W] bool, True at the masks right of where each row's text ends (none for a row
    whose text does not end in this block). (a) after the first accepted EOS proposal; else (b) after
    the most confident mask proposing EOS (``argmax``: the first among equals, as the reference).
    accepted, active: [B, W] bool (accepted within active); x0 [B, W] long; conf [B, W] float."""
    col = torch.arange(x0.shape[1], device=x0.device)  # [W]
    return active & (col > text_end(accepted, x0, conf, active, eos))


@dataclass(frozen=True)
class _Block:
    """What a block's steps share, made once per block (``state.extras["learn2pd"]``)."""

    key: tuple[int, int]  # the block's canvas columns
    filter: FoldedFilter
    eos: int  # EoTP's end-of-text id (-1: no EoTP)
    after: Optional[torch.Tensor]  # [B, W] long: the block's column, + W in a row whose text ended in an
    #   earlier block (then every mask of it is right of any end); None: no EoTP


@dataclass(frozen=True)
class Learn2PDConfig:
    threshold: float = 0.96  # accept a mask when sigmoid(filter logit) > this (the authors' accept_thres)
    filter: Any = DEFAULT_FILTER  # an embedded filter name, a directory, or a Learn2PDFilter
    eotp: bool = True  # end-of-text prediction: a row's text ends at the EOS the filter accepts (or the
    #   likeliest EOS proposal): the rest of the row is EOS padding (stop_at_eos=True skips its forwards)
    ties: str = "reference"  # the top-1 among equal confidences: reference (torch.topk over the canvas
    #   row, the device's order, as the authors) | first (lowest index)

    def __post_init__(self) -> None:
        check_unit("threshold", self.threshold)
        if not isinstance(self.filter, (Learn2PDFilter, str, Path)) or (isinstance(self.filter, str) and not self.filter):
            raise SettingError("filter", f"filter must be a shipped filter's name ({DEFAULT_FILTER!r}), a directory or a "
                                         f"Learn2PDFilter, got {self.filter!r}")
        check_bool("eotp", self.eotp)
        check_choice("ties", self.ties, TIES)


@register_sampler("learn2pd")
class Learn2PD(Sampler):
    """Learn2PD: a learned filter over the block's confidences commits the final positions (+ top-1)."""

    Config = Learn2PDConfig
    fixed_steps = False
    reads_block_only = True  # the engine computes the block's logits only

    def __init__(self, config: Optional[Learn2PDConfig] = None, **options: Any) -> None:
        super().__init__(config, **options)
        self.filter = load_filter(self.config.filter)  # a bad name fails here, before any forward
        self._on: dict[torch.device, Learn2PDFilter] = {}  # the filter per device it ran on

    @property
    def commits_every_step(self) -> bool:
        return True  # the most confident mask of every row with masks is always committed

    def max_block_steps(self, block_len: int) -> int:
        return block_len

    def _filter_on(self, device: torch.device) -> Learn2PDFilter:
        if device not in self._on:
            f = self.filter
            self._on[device] = f if next(f.parameters()).device == device else copy_filter_to(f, device)
        return self._on[device]

    def block_refusal(self, block_size: int) -> Optional[tuple[str, str]]:
        if block_size <= self.filter.width:
            return None
        return "block_length", (f"sampler 'learn2pd': the filter reads blocks of at most {self.filter.width} "
                                f"positions, this block has {block_size}; decode with block_length <= "
                                f"{self.filter.width} or train a wider filter")

    def begin_block(self, state: DecodeState) -> None:
        refusal = self.block_refusal(state.block_end - state.block_start)
        if refusal is not None:
            raise SettingError(*refusal)
        state.extras["learn2pd"] = self._prepare(state)

    def _prepare(self, state: DecodeState) -> _Block:
        """The block's folded filter and EoTP columns (a row whose text ended in an earlier block pads
        its every mask: it holds EOS between the prompt and the block)."""
        s, e, x = state.block_start, state.block_end, state.x
        folded = fold_filter(self._filter_on(x.device))
        eos_ids = state.extras.get("eos_ids", ())
        if not (self.config.eotp and eos_ids):
            return _Block((s, e), folded, -1, None)
        eos = int(eos_ids[0])
        col = torch.arange(e - s, device=x.device)  # [W]
        ended = (x[:, state.prompt_length:s] == eos).any(dim=1, keepdim=True)  # [B, 1]
        return _Block((s, e), folded, eos, torch.where(ended, col + (e - s), col))

    def step(self, inp: StepInput, state: DecodeState) -> StepOutput:
        logits = window_of(inp.logits, inp.window)  # [B, W, V]
        active = window_of(inp.active, inp.window)  # [B, W]
        block = state.extras.get("learn2pd")
        if block is None or block.key != (state.block_start, state.block_end):  # a step without begin_block
            block = state.extras["learn2pd"] = self._prepare(state)
        x_any, x0 = self._propose(logits, inp, state)  # [B, W] x2 (x_any None at T = 0)
        conf = top_confidence(logits) if x_any is None else block_confidence(logits, x_any)  # [B, W]
        hi = torch.sigmoid(block.filter(conf)) > self.config.threshold  # [B, W] the filter's yes, anywhere
        pick = hi | self._top1(conf, active, inp, state.x.shape[1])  # [B, W]
        tokens = x0
        if block.after is not None:  # EoTP: the masks right of the text's end become EOS padding
            pad = block.after > text_end(hi, x0, conf, active, block.eos)  # [B, W]
            tokens = torch.where(pad, block.eos, x0)
            pick = pick | pad
        out = window_output(inp, active & pick, tokens, conf)
        out.active_only = True  # the commit holds active masks only
        return out

    def _propose(self, logits: torch.Tensor, inp: StepInput,
                 state: DecodeState) -> tuple[Optional[torch.Tensor], torch.Tensor]:
        """(the arg-max at every block position, mask id included, whose probability the filter reads
        as the reference does, None at T = 0 where it is the logits' own (``top_confidence``); the
        proposals, never the mask id: the runner-up where the arg-max is it, which is
        ``argmax_excluding``). At T > 0 the arg-max of the Gumbel-max perturbation, on the block's
        columns of uniforms shaped as the whole canvas' logits [B, L, V] (the reference's stream)."""
        if inp.temperature == 0:
            return None, argmax_excluding(logits, inp.mask_id)
        b, _, v = logits.shape
        s = inp.query_start + inp.window[0]
        noise = window_uniforms((b, state.x.shape[1], v), (s, s + logits.shape[1]), inp.generator, logits.device)
        z = gumbel_perturb(logits, inp.temperature, noise)
        return z.argmax(dim=-1), argmax_excluding(z, inp.mask_id)

    def _top1(self, conf: torch.Tensor, active: torch.Tensor, inp: StepInput, length: int) -> torch.Tensor:
        """The most confident mask of each row with one ([B, W] bool; anything in a row without one: the
        caller keeps active positions). ``ties="reference"``: ``torch.topk(c, 1)`` over the canvas row of
        ``length`` columns, -inf off the block's masks, as the reference; ``"first"``: the lowest index."""
        score = torch.where(active, conf, neg_inf(conf.device))  # [B, W]
        w = conf.shape[1]
        if self.config.ties == "first":
            return _columns(0, w, conf.device) == score.argmax(dim=1, keepdim=True)
        s = inp.query_start + inp.window[0]
        full = nn.functional.pad(score, (s, length - s - w), value=float("-inf"))  # [B, L]
        return _columns(s, w, conf.device) == torch.topk(full, 1, dim=-1).indices  # [B, W]


def _columns(start: int, width: int, device: torch.device) -> torch.Tensor:
    """long [W]: ``start, ..., start + width - 1``, made once (``chunked.constant``)."""
    return constant(("learn2pd columns", start, width, device), lambda: torch.arange(start, start + width, device=device))


__all__ = ["DEFAULT_FILTER", "FILTER_CONFIG", "FILTER_WEIGHTS", "INPUTS", "Learn2PD", "Learn2PDConfig",
           "Learn2PDFilter", "FoldedFilter", "block_confidence", "end_of_text", "filter_directory", "fold_filter",
           "load_filter", "shipped_filters", "text_end", "top_confidence"]
