"""Block layout and per-block step budgets (validated once per ``generate`` call): ``plan_blocks`` for a
bidirectional model (blocks of ``block_length``), ``plan_block_causal`` for a block-causal one (the
model's grid). ``dllm.settings.plan_for`` picks one by the model's kind, in one place."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional, Sequence

from dllm.options import SettingError


@dataclass(frozen=True)
class BlockPlan:
    gen_length: int
    block_length: int
    blocks: tuple[tuple[int, int, Optional[int]], ...]  # (start, end, steps) in generated coords


def plan_blocks(gen_length: int, block_length: Optional[int], steps: Optional[int], *,
                fixed_steps: bool) -> BlockPlan:
    """Split ``gen_length`` into blocks and give each its step budget.

    Blocks are ``[k * BL, min((k + 1) * BL, G))``; the last may be shorter. Fixed-step samplers
    get ``steps / NB`` steps per block (``steps`` a multiple of the number of blocks NB and at most
    ``block_length`` per block; default: one token per step), the last partial block
    ``min(steps / NB, its length)``. Adaptive samplers get ``None`` (they stop when the block is
    full). Offsets are relative to the start of the generated region.
    """
    if not isinstance(gen_length, int) or isinstance(gen_length, bool) or gen_length <= 0:
        raise SettingError("gen_length", f"gen_length must be a positive integer, got {gen_length!r}")
    if block_length is None:
        block_length = gen_length
    if not isinstance(block_length, int) or isinstance(block_length, bool) or not 0 < block_length <= gen_length:
        raise SettingError("block_length", f"block_length must be a positive integer <= gen_length={gen_length} (None: one "
                         f"block of gen_length), got {block_length!r}")
    n_blocks = -(-gen_length // block_length)
    bounds = [(k * block_length, min((k + 1) * block_length, gen_length)) for k in range(n_blocks)]
    if steps is not None and (not isinstance(steps, int) or isinstance(steps, bool) or steps <= 0):
        raise SettingError("steps", f"steps must be a positive integer, got {steps!r}")
    if not fixed_steps:
        return BlockPlan(gen_length, block_length, tuple((s, e, None) for s, e in bounds))
    if steps is None:
        per_block = [e - s for s, e in bounds]
    else:
        if steps % n_blocks != 0:
            valid = [n_blocks * k for k in range(1, block_length + 1)]
            raise SettingError(
                "steps", f"steps={steps} cannot be split evenly over {n_blocks} blocks "
                f"(gen_length={gen_length}, block_length={block_length}); valid steps are multiples "
                f"of {n_blocks} up to {n_blocks * block_length}, e.g. {_preview(valid)}"
            )
        s_per = steps // n_blocks
        if s_per > block_length:
            raise SettingError(
                "steps", f"steps={steps} gives {s_per} steps per block but a block holds only {block_length} "
                f"tokens (a step must commit at least one); use steps <= {n_blocks * block_length}"
            )
        per_block = [min(s_per, e - s) for s, e in bounds]
    return BlockPlan(gen_length, block_length,
                     tuple((s, e, n) for (s, e), n in zip(bounds, per_block)))


def _preview(values: list[int], n: int = 6) -> str:
    shown = ", ".join(str(v) for v in values[:n])
    return shown + (", ..." if len(values) > n else "")


# ----------------------------------------------------------------------------------------------
# Block-causal models (SDAR): the model's block grid starts at position 0 of the prompt

BLOCK_SIZE_KEY = "block_size"  # DecodeState.extras: a block-causal model's trained block (set by the engine)
LOGIT_SHIFT_KEY = "logit_shift"  # DecodeState.extras: the model's logit_shift (Dream, Fast-dLLM v2: 1)
SUB_BLOCK_KEY = "small_block_size"  # DecodeState.extras: fastdllm_v2's sub-block width (read by cache 'subblock')


GRID_OFFSET_KEY = "grid_offset"  # DecodeState.extras: column - position of row 0's real columns (host int)


def grid_start(state, column: int) -> int:
    """Canvas column where the model's grid block holding ``column`` (a real column of row 0: the
    generated ones are) starts: ``column - position % block_size`` (the block of
    ``state.extras[BLOCK_SIZE_KEY]``, else ``state.block_length``). The rows of a call share the grid
    (``plan_block_causal`` refuses batches that do not), so row 0 tells. A real
    column's position is ``column - offset`` with one offset per call: read from the device once per
    call (one host read), then kept in ``state.extras[GRID_OFFSET_KEY]``."""
    bs = state.extras.get(BLOCK_SIZE_KEY) or state.block_length
    offset = state.extras.get(GRID_OFFSET_KEY)
    if offset is None:
        offset = column - int(state.positions[0, column])
        state.extras[GRID_OFFSET_KEY] = offset
    return column - (column - offset) % bs


def plan_block_causal(gen_length: int, block_length: Optional[int], steps: Optional[int], *, fixed_steps: bool,
                      block_size: int, prompt_lengths: Sequence[int], model_name: str = "this model") -> BlockPlan:
    """The engine's blocks for a block-causal model (trained block ``block_size``): the model's grid
    over the generated region, which starts at position 0 of the prompt, so the first block is the
    prompt's partial one (``[0, -len % block_size)``, if any), then blocks of ``block_size``.

    ``block_length`` must be the checkpoint's block (None: that block); every prompt must end at the
    same offset inside a block (``len % block_size`` equal over ``prompt_lengths``), since the rows
    share the engine's blocks. Fixed-step samplers: ``steps`` split evenly over the blocks as
    ``plan_blocks`` does. ``model_name`` names the model in the errors (``SettingError``).
    """
    bs = block_size
    if not isinstance(gen_length, int) or isinstance(gen_length, bool) or gen_length <= 0:
        raise SettingError("gen_length", f"gen_length must be a positive integer, got {gen_length!r}")
    if block_length is not None and block_length != bs:
        raise SettingError(
            "block_length", f"block_length={block_length!r} disagrees with the checkpoint's trained block: "
            f"{model_name} attends block-causally with block_size {bs} (config.json); use block_length={bs} or None")
    offsets = sorted({(-n) % bs for n in prompt_lengths})
    if len(offsets) > 1:
        lengths = sorted(set(prompt_lengths))
        raise SettingError(
            "prompt", f"prompts of lengths {_preview(lengths)} end at different offsets inside the model's blocks of "
            f"{bs} (lengths mod {bs}: {sorted({n % bs for n in lengths})}); a batch of a block-causal "
            f"model shares its blocks, so batch prompts whose lengths agree mod {bs}, or decode them "
            f"separately")
    first = min(offsets[0], gen_length)
    bounds = [(0, first)] if first else []
    start = first
    while start < gen_length:
        bounds.append((start, min(start + bs, gen_length)))
        start += bs
    if steps is not None and (not isinstance(steps, int) or isinstance(steps, bool) or steps <= 0):
        raise SettingError("steps", f"steps must be a positive integer, got {steps!r}")
    if not fixed_steps:
        return BlockPlan(gen_length, bs, tuple((s, e, None) for s, e in bounds))
    n_blocks = len(bounds)
    if steps is None:
        per_block = [e - s for s, e in bounds]
    else:
        if steps % n_blocks != 0 or steps // n_blocks > bs:
            valid = [n_blocks * k for k in range(1, bs + 1)]
            raise SettingError(
                "steps", f"steps={steps} cannot be split evenly over the {n_blocks} blocks of this call (block_size "
                f"{bs}, gen_length={gen_length}, the first block the prompt's partial one), at most {bs} "
                f"per block; valid steps: {_preview(valid)}")
        per_block = [min(steps // n_blocks, e - s) for s, e in bounds]
    return BlockPlan(gen_length, bs, tuple((s, e, n) for (s, e), n in zip(bounds, per_block)))
