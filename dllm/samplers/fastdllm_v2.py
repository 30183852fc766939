"""``fastdllm_v2``: Fast-dLLM v2's block decoding with sub-blocks and threshold parallel commits
(Fast-dLLM v2, arXiv 2509.26328; ``Fast_dLLM_QwenForCausalLM.generate`` in the HF folder
Efficient-Large-Model/Fast_dLLM_v2_7B ``modeling.py``, and NVlabs/Fast-dLLM
``v2/generation_functions.py``).

Per grid block of the block-causal model (``bs`` = its ``block_size``, the prompt's last ``n % bs``
tokens in the first one) the official loop:

1. commits the block's first column alone when it is generated: the greedy arg-max of the previous
   block's last row (the token shift: row i - 1 predicts column i), computed once that block is
   complete. The official code does it in the forward that stores the finished block
   (``update_past_key_values=True``) and appends the token; here it is the block's first step, whose
   forward also recomputes the finished block's keys (``cache="block"``). Greedy at every temperature,
   as there;
2. then walks the block's sub-blocks ``[g + k * sbs, g + (k + 1) * sbs)`` (``small_block_size``) left
   to right; while the current sub-block holds a mask, one step proposes ``x0`` and ``p(x0)`` for
   every row of the sub-block (``sample_with_top_p``: at T = 0 the arg-max of ``softmax(logits)``; at
   T > 0 ``softmax(logits / T)``, nucleus ``top_p`` on the sorted probabilities, renormalised by
   their sum, one ``torch.multinomial`` over the sub-block's rows, so a ``seed`` gives the official
   random stream), and commits every mask with ``p(x0) > threshold`` plus the most confident mask.

Caches: ``none`` and ``block`` (exact) reproduce ``use_block_cache=False``; ``subblock``
(``dllm/cache/subblock.py``) reproduces ``use_block_cache=True``, whose later steps forward the current
sub-block alone (the query then starts at the sub-block: the step reads those rows only).

Differences from the original, on purpose:

- the official loop ends a block early once its first ``<|im_end|>`` has no mask before it, and then
  stops; ``dllm.generate`` finishes the block (``stop_at_eos=True`` stops after it), so the tokens up
  to that stop token are the same, and the official output is cut there;
- a drawn ``x0`` (or a block's first, greedy token) equal to the mask token is replaced by the best
  other token of its row (the official loop would "commit" the mask, leaving the position masked,
  and at T = 0 could loop forever);
- when ``gen_length`` ends inside a grid block, the official canvas still runs to the block end; the
  last sub-block's draws then cover columns beyond the canvas (sampled, never committed), which
  keeps the stream of the columns inside it;
- the official ``generate`` takes one row (``multinomial`` on row 0 of a batch) and runs the first
  block without the prompt when the prompt is exactly ``bs`` tokens long (no cache, positions from 0);
  here rows are independent and that prompt is read like any other;
- on a model without the token shift (SDAR) or without blocks (LLaDA, Dream: the call's
  ``block_length`` is the block), step 1 is skipped: every column goes through the sub-blocks.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

import torch
import torch.nn.functional as F

from dllm.options import check_int, check_unit
from dllm.samplers import draws
from dllm.samplers.base import Sampler, register_sampler
from dllm.samplers.chunked import column_ids, constant, neg_inf, without_column
from dllm.samplers.sdar import block_of
from dllm.schedule import BLOCK_SIZE_KEY, LOGIT_SHIFT_KEY, SUB_BLOCK_KEY, grid_start
from dllm.state import DecodeState, StepInput, StepOutput


@dataclass(frozen=True)
class FastDLLMv2Config:
    threshold: float = 0.9  # commit every mask of the sub-block with p(x0) > threshold (README / eval.py: 0.9)
    small_block_size: int = 8  # sub-block width; divides the block, or is >= it (then the block) (README: 8)
    top_p: float = 0.95  # nucleus mass at T > 0 (generate's default)

    def __post_init__(self) -> None:
        check_unit("threshold", self.threshold)
        check_int("small_block_size", self.small_block_size, 1)
        check_unit("top_p", self.top_p, low_open=True)


def sample_with_top_p(logits: torch.Tensor, top_p: float, temperature: float,
                      generator: draws.Generator) -> tuple[torch.Tensor, torch.Tensor]:
    """logits [B, W, V] -> (x0 [B, W] long, p(x0) [B, W]) as the official ``sample_with_top_p``:
    T = 0: arg-max of the softmax; T > 0: softmax(logits / T), tokens past the ``top_p`` mass
    (cumulative sum of the sorted probabilities, shifted by one) zeroed, renormalised by the sum, one
    ``multinomial`` over the B*W rows; p(x0) read from the renormalised distribution."""
    if temperature == 0:
        p, x0 = F.softmax(logits, dim=-1).max(dim=-1)  # the first maximum, as argmax
        return x0, p
    probs = F.softmax(logits / temperature, dim=-1)
    sorted_probs, order = torch.sort(probs, descending=True)
    drop = torch.cumsum(sorted_probs, dim=-1) > top_p
    drop[..., 1:] = drop[..., :-1].clone()
    drop[..., 0] = False
    probs = probs.masked_fill(torch.zeros_like(drop).scatter_(-1, order, drop), 0.0)
    probs = probs / probs.sum(dim=-1, keepdim=True)
    b, w, v = probs.shape
    x0 = draws.multinomial(probs.reshape(b * w, v), 1, generator).view(b, w)  # per-row: W rows each
    return x0, torch.gather(probs, -1, x0[..., None])[..., 0]


@register_sampler("fastdllm_v2")
class FastDLLMv2Sampler(Sampler):
    """Fast-dLLM v2 generate: the block's first column greedy from the previous block, then sub-blocks
    left to right, each step committing the masks with p(x0) > threshold (at least one)."""

    Config = FastDLLMv2Config
    fixed_steps = False

    @property
    def commits_every_step(self) -> bool:
        return True  # the most confident mask of the row's sub-block, which holds its first mask (or the
        #   block's first column alone, a mask at the block's first step)

    def block_refusal(self, block_size: int) -> Optional[tuple[str, str]]:
        bs, sbs = block_size, self.config.small_block_size
        if sbs >= bs or bs % sbs == 0:
            return None
        valid = [d for d in range(1, bs + 1) if bs % d == 0]
        return "small_block_size", (f"sampler 'fastdllm_v2': small_block_size={sbs} must divide the block size {bs} "
                                    f"(valid: {', '.join(map(str, valid))}, or any width >= {bs}, which is the whole "
                                    f"block)")

    def begin_block(self, state: DecodeState) -> None:
        bs = block_of(state)
        refusal = self.block_refusal(bs)
        if refusal is not None:
            raise ValueError(refusal[1])
        state.extras[SUB_BLOCK_KEY] = min(self.config.small_block_size, bs)  # cache 'subblock' forwards this
        #   sub-block alone

    def step(self, inp: StepInput, state: DecodeState) -> StepOutput:
        cfg = self.config
        s, e = state.block_start, state.block_end
        sbs, q0 = min(cfg.small_block_size, block_of(state)), inp.query_start  # a wider sub-block is the block
        blocked = BLOCK_SIZE_KEY in state.extras
        g = grid_start(state, s) if blocked else s
        if g < q0 and (q0 - g) % sbs:  # a query may start at a sub-block (cache 'subblock'), nowhere else
            raise ValueError(f"sampler 'fastdllm_v2' needs the logits of the current sub-block of the grid block "
                             f"from column {g}, but the step's query starts at column {q0}; use cache 'none', "
                             f"'block' or 'subblock'")
        b, q, v = inp.logits.shape
        if blocked and state.extras.get(LOGIT_SHIFT_KEY, 0) and g == s and inp.step == 0:
            # the block's first column is generated: alone, greedy, from the previous block's last row
            # (no draw, as the official loop takes it in the forward that stores the finished block)
            commit = torch.zeros_like(inp.active)
            commit[:, s - q0] = inp.active[:, s - q0]
            tokens = inp.tokens.clone()
            first_logits = inp.logits[:, s - q0].clone()  # [B, V]
            first_logits[:, inp.mask_id] = float("-inf")  # never the mask itself (see the module docstring)
            tokens[:, s - q0] = first_logits.argmax(dim=-1)
            return StepOutput(commit=commit, tokens=tokens)
        if _in_one_sub_block(inp, g, sbs):
            return _one_sub_block(inp, cfg.threshold)
        # the current sub-block of each row: the one holding its first mask of the block
        dev = inp.logits.device
        col = column_ids(q, dev)  # [Q] query rows
        first = torch.where(inp.active, col, q).amin(dim=1)  # [B] first mask (Q: none)
        rows_of, inside_of = _sub_block_tables(g - q0, e - q0, q, sbs, dev)
        rows, inside = rows_of[first], inside_of[first]  # [B, sbs] query rows (clamped), in the block
        batch = constant(("fastdllm_v2 rows", b, dev), lambda: torch.arange(b, device=dev)[:, None])  # [B, 1]
        wl = inp.logits[batch, rows]  # [B, sbs, V]
        x0, p = sample_with_top_p(wl, cfg.top_p, inp.temperature, inp.generator)
        x0 = _never_the_mask(x0, wl, inp.mask_id)
        masks = inp.active.gather(1, rows) & inside  # [B, sbs]
        conf = torch.where(masks, p, neg_inf(p.device))
        chosen = conf > cfg.threshold
        chosen.scatter_(1, conf.argmax(dim=1, keepdim=True), True)
        chosen &= masks
        target = torch.where(chosen, rows, q)  # unchosen rows go to a dropped extra column
        commit = torch.scatter(_zeros((b, q + 1), torch.bool, dev), 1, target, chosen)  # [B, Q + 1]
        tokens = torch.scatter(_zeros((b, q + 1), torch.long, dev), 1, target, x0)  # read where committed only
        return StepOutput(commit=commit[:, :q], tokens=tokens[:, :q], active_only=True)


def _never_the_mask(x0: torch.Tensor, logits: torch.Tensor, mask_id: int) -> torch.Tensor:
    """x0 [B, W], with the arg-max of the logits [B, W, V] without the mask id where it is the mask id
    (see the module docstring)."""
    other = without_column(logits, mask_id)
    return torch.where(x0 == mask_id, other.argmax(dim=-1), x0)


def _in_one_sub_block(inp: StepInput, g: int, sbs: int) -> bool:
    """A greedy step whose query lies in one sub-block of the grid block from column g (``sbs`` wide)."""
    q0, q = inp.query_start, inp.logits.shape[1]
    return inp.temperature == 0 and q <= sbs and q0 >= g and (q0 - g) % sbs == 0


def _one_sub_block(inp: StepInput, threshold: float) -> StepOutput:
    """A greedy step whose query lies in one sub-block (the block when it is at most one, cache
    ``subblock``'s later steps): the sub-block of every row with a mask, so its masks are the active
    ones and no row is gathered. The same decisions as the gathered path, row for row (T = 0 reads no
    other row)."""
    x0, p = sample_with_top_p(inp.logits, 1.0, 0.0, None)  # [B, Q] x2
    x0 = _never_the_mask(x0, inp.logits, inp.mask_id)
    conf = torch.where(inp.active, p, neg_inf(p.device))  # [B, Q]
    chosen = conf > threshold
    chosen.scatter_(1, conf.argmax(dim=1, keepdim=True), True)
    return StepOutput(commit=chosen & inp.active, tokens=x0, active_only=True)


def _zeros(shape: tuple[int, int], dtype: torch.dtype, device: torch.device) -> torch.Tensor:
    """A zero tensor made once (``constant``): the base of an out-of-place ``scatter``."""
    return constant(("fastdllm_v2 zeros", shape, dtype, device), lambda: torch.zeros(shape, dtype=dtype, device=device))


def _sub_block_tables(g: int, e: int, q: int, sbs: int, device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
    """By a row's first mask f in [0, Q] (query coordinates; Q: none): the query rows of its sub-block
    ``g + k * sbs + [0, sbs)``, ``k = (min(f, e - 1) - g) // sbs``, clamped to the query, and which of
    them lie in the block [g, e) -> ([Q + 1, sbs] long, [Q + 1, sbs] bool); made once (``constant``)."""
    def make() -> tuple[torch.Tensor, torch.Tensor]:
        f = torch.arange(q + 1, device=device)[:, None]  # [Q + 1, 1]
        win = g + (f.clamp(max=e - 1) - g) // sbs * sbs + torch.arange(sbs, device=device)  # [Q + 1, sbs]
        return win.clamp(0, q - 1), (win >= 0) & (win < e)

    return constant(("fastdllm_v2 sub-blocks", g, e, q, sbs, device), make)


__all__ = ["FastDLLMv2Config", "FastDLLMv2Sampler", "sample_with_top_p"]
