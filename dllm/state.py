"""The data that flows through the decode loop.

- ``DecodeState``: the canvas and everything the engine tracks while decoding (counters are Python
  ints, per-row state is device tensors).
- ``StepInput``: what a sampler sees at one step (logits of the query positions, which of them are
  active masks of the current block, the schedule clock).
- ``StepOutput``: what a sampler decides (which positions to commit, with which tokens).
- ``GenerationOutput``: what ``dllm.generate`` returns.

Coordinates: the canvas ``x`` is [B, L] with L = Lp + G (left-padded prompts of width Lp, then G
generated positions). A forward computes logits for Q query positions starting at canvas column
``query_start`` (Q = L and query_start = 0 for a full forward; a cached step of a cache policy
queries fewer columns, see ``dllm.cache``). Samplers work in query coordinates.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable, Optional, Union

import torch


@dataclass
class DecodeState:
    """Mutable state of one ``generate`` call."""

    x: torch.Tensor  # [B, L] canvas (prompt | generated), long, written in place
    key_padding_mask: torch.Tensor  # [B, L] bool, True on real tokens (False on left pads)
    positions: torch.Tensor  # [B, L] long, RoPE positions (pads get 0)
    prompt_mask: torch.Tensor  # [B, L] bool, True on prompt columns (pads included)
    prompt_length: int  # Lp, the padded prompt width
    gen_length: int  # G
    mask_id: int
    temperature: float
    generator: Optional[torch.Generator]  # or one per row: dllm.samplers.draws.RowGenerators
    trace: torch.Tensor  # [B, G] long: global step at which each position was committed (-1: never)
    padded: bool  # True when some row is left-padded (the model then needs the key-padding mask)
    block_start: int = 0  # canvas column where the current block starts
    block_end: int = 0  # canvas column where the current block ends (exclusive)
    block_index: int = 0
    block_length: int = 0  # nominal block length BL (the last block may be shorter)
    block_step: int = 0  # step index inside the current block
    block_steps: Optional[int] = None  # steps budgeted for this block (None: sampler decides)
    block_masks_at_start: Optional[torch.Tensor] = None  # [B] long, masks in the block at its start
    step: int = 0  # global step counter (sampler decisions)
    nfe: int = 0  # model forwards (a CFG forward on the doubled batch counts once)
    forwarded_tokens: int = 0  # sum over forwards of rows x query length
    finished: Optional[torch.Tensor] = None  # [B] bool, rows whose answer ended (stop_at_eos)
    released: frozenset = frozenset()  # rows no longer needed: filled, skipped by forwards (dllm.rows)
    kv: Any = None  # dllm.models.core.kv.KVCache of the call's cache policy (None: no cache)
    extras: dict[str, Any] = field(default_factory=dict)  # per-call scratch for samplers

    @property
    def batch_size(self) -> int:
        return self.x.shape[0]

    @property
    def generated(self) -> torch.Tensor:
        """[B, G] view of the generated region of the canvas."""
        return self.x[:, self.prompt_length:]


class BlockViews:
    """Views of a ``DecodeState``'s canvas tensors by column range, and other values of one block
    (small constant masks, cache views), made once per block (``clear`` at a block's start), and the
    engine's writes through them. Taking a view is an ATen call, which a GPU step pays in host time;
    the canvas tensors are written in place and never rebound, so a view taken at a block's first
    step stays current."""

    def __init__(self, state: DecodeState) -> None:
        self.state = state
        self._made: dict[tuple, Any] = {}

    def clear(self) -> None:
        self._made.clear()

    def memo(self, key: tuple, make: Callable[[], Any]) -> Any:
        """``make()`` the first time ``key`` is asked for in this block, the same value after."""
        value = self._made.get(key)
        if value is None:
            value = self._made[key] = make()
        return value

    def get(self, name: str, a: int, b: int) -> torch.Tensor:
        """``state.<name>[:, a:b]`` for a [B, ...] tensor of the state (x, positions, trace)."""
        return self.memo((name, a, b), lambda: getattr(self.state, name)[:, a:b])

    def in_window(self, width: int, a: int, b: int) -> torch.Tensor:
        """bool [1, width], True on columns [a, b) only."""
        def make() -> torch.Tensor:
            mask = torch.zeros((1, width), dtype=torch.bool, device=self.state.x.device)
            mask[:, a:b] = True
            return mask

        return self.memo(("window", width, a, b), make)

    def write(self, where: torch.Tensor, tokens: Union[torch.Tensor, int], trace_value: int, q0: int) -> None:
        """Write ``tokens`` [B, Q] (or one id everywhere) into the canvas where ``where`` [B, Q] (query
        coordinates from column q0) and set the trace of the generated columns written to ``trace_value``."""
        q_len = where.shape[1]
        view = self.get("x", q0, q0 + q_len)
        if isinstance(tokens, int):
            view.masked_fill_(where, tokens)
        else:
            torch.where(where, tokens, view, out=view)  # in place: out is exactly the third input
        lp = self.state.prompt_length
        g0 = max(q0, lp)
        if g0 < q0 + q_len:
            trace = self.get("trace", g0 - lp, q0 + q_len - lp)
            trace.masked_fill_(where if g0 == q0 else where[:, g0 - q0:], trace_value)


@dataclass
class StepInput:
    """One step's inputs for a sampler, in query coordinates."""

    logits: torch.Tensor  # [B, Q, V] logits[:, q] predicts the token at canvas column query_start+q
    tokens: torch.Tensor  # [B, Q] current canvas tokens at the query positions
    active: torch.Tensor  # [B, Q] bool: masked positions of the current block (may be committed)
    query_start: int  # canvas column of query position 0
    window: tuple[int, int]  # [ws, we): the current block in query coordinates
    step: int  # step index inside the block (0-based)
    steps: Optional[int]  # steps budgeted for this block, None for adaptive samplers
    mask_id: int
    temperature: float
    generator: Optional[torch.Generator]  # or one per row: dllm.samplers.draws.RowGenerators
    attn: dict[int, torch.Tensor] = field(default_factory=dict)  # layer -> [B, H, Q, K]
    # extra forwards for samplers that declare ``needs_variants`` (speculative verification,
    # lookahead variants): tokens [N, Q] (modified copies of the query tokens), rows [N] (the batch
    # row each copy belongs to), group (rows comes in runs of that many variants of one row), and
    # the keyword every_row (True: the runs are every batch row in order, known without a read) ->
    # logits [N, W, V] of the block window (``[:, k]`` predicts query position ``window[0] + k``).
    # The engine counts it (NFE, forwarded tokens).
    forward_variants: Optional[Callable[..., torch.Tensor]] = None
    # samplers that declare ``shadow_block``: [B, W, V] leave-one-out logits of the block window,
    # [:, k] predicts query position ws + k without seeing its token (``DiffusionLM.shadow_forward``)
    shadow_logits: Optional[torch.Tensor] = None
    # the values of the last step's ``StepOutput.read_next``, read to the host with the engine's test that
    # the block still has masks (one read for both), when this step follows that one in its block; None
    # where the engine read nothing for it (a block's first step, engines without that test)
    host_read: Optional[list[int]] = None
    reads_next: bool = False  # the engine reads a ``StepOutput.read_next`` with its next test of the block's masks

    @property
    def is_last_step(self) -> bool:
        return self.steps is not None and self.step == self.steps - 1


@dataclass
class StepOutput:
    """A sampler's decision for one step, in query coordinates."""

    commit: torch.Tensor  # [B, Q] bool: positions to write this step
    tokens: torch.Tensor  # [B, Q] long: proposed token per position (read where commit is True)
    score: Optional[torch.Tensor] = None  # [B, Q] float: the sampler's confidence, used for the
    #   engine's progress fallback (commit the best active position of a row that chose none)
    beyond: Optional[torch.Tensor] = None  # [B, Q] bool: masked positions AFTER the current block to
    #   commit now as well (all-in samplers such as Prophet); later blocks then need no forward
    remask: Optional[torch.Tensor] = None  # [B, Q] bool: committed tokens of the current block to turn
    #   back into masks (revising samplers such as WINO); never the prompt, never this step's commits
    active_only: bool = False  # the sampler's ``commit`` holds active positions only (it ANDed them
    #   itself): the engine then takes it as it is instead of ANDing it with ``active`` again
    next_logits: Optional[torch.Tensor] = None  # [B, W, V]: the block window's logits of the canvas
    #   after exactly this step's commits, from the sampler's own variant forward (LoPA's reuse); the
    #   engine hands them to the next step of the block instead of forwarding again (block view only:
    #   ``reads_block_only``; the full-query reference path forwards anew). Every unfinished row must
    #   commit (no progress fallback); no remask, no beyond; rows without masks left may hold anything
    soft: Any = None  # a dllm.models.core.soft_inputs.SoftInputs over the block window ([B, W] spans, its
    #   offset ignored): the inputs of this block's next forwards are these mixtures of token embeddings at
    #   its ``where`` positions (their canvas tokens elsewhere) until a later step replaces them (None: plain
    #   token inputs again); dropped at the block's end. Plain and cached forwards take them, every family
    rewrite: Optional[torch.Tensor] = None  # [B, Q] bool: committed tokens of the current block to replace
    #   by ``tokens`` (refining samplers such as DMax: ``Sampler.refines``); never the prompt, never a mask
    settled: Optional[torch.Tensor] = None  # [B] bool: rows whose block is final (refining samplers): the
    #   engine runs a refining sampler's block while a row has masks or is not settled, at most
    #   ``max_block_steps`` steps
    read_next: Optional[torch.Tensor] = None  # [K] integer: values the next step of the block needs on the
    #   host (LoPA's candidate counts, the shape of its variant batch): the engine reads them with its own test
    #   of the block's masks, one host read for both, and hands them over as ``StepInput.host_read``
    fills_block: bool = False  # known on the host without a read (LoPA's candidate counts, read for its batch
    #   shape, are all zero): ``commit`` holds every active mask of every row, so this step ends the block and
    #   the engine skips its test of the block's masks (one host read less). With no remask, beyond,
    #   rewrite, settled or soft inputs; a sampler that says so and leaves a mask fails the call


@dataclass
class GenerationOutput:
    """Result of ``dllm.generate``."""

    sequences: torch.Tensor  # [B, Lp + G] canvas incl. the left-padded prompt
    prompt_length: int  # Lp
    texts: Optional[list[str]]  # decoded generated text per row (cut at the first EOS/EoT)
    nfe: int  # model forwards
    steps: int  # sampler steps
    forwarded_tokens: int  # sum over forwards of rows x query positions
    generated_tokens: int  # generated positions a step committed, all rows (EOS padding a step committed included;
    #   not the EOS that stop_at_eos writes into a finished row's remaining masks, which no forward decoded: trace -1)
    content_tokens: int  # generated tokens up to (excluding) each row's first EOS/EoT
    wall_time: float  # seconds
    trace: Optional[torch.Tensor] = None  # [B, G] step at which each position was committed
    generated_ids: Optional[list[list[int]]] = None  # the generated tokens per row, on the host (read once)

    @property
    def generated(self) -> torch.Tensor:
        """[B, G] the generated tokens."""
        return self.sequences[:, self.prompt_length:]

    @property
    def tokens_per_forward(self) -> float:
        """Generated tokens per row per forward (EOS padding a step committed included; ``generated_tokens``)."""
        rows = self.sequences.shape[0]
        return self.generated_tokens / rows / max(self.nfe, 1)

    @property
    def content_tokens_per_forward(self) -> float:
        rows = self.sequences.shape[0]
        return self.content_tokens / rows / max(self.nfe, 1)

    @property
    def tokens_per_second(self) -> float:
        return self.generated_tokens / self.wall_time if self.wall_time > 0 else float("inf")

    def summary(self) -> dict[str, float]:
        return {
            "nfe": self.nfe,
            "steps": self.steps,
            "forwarded_tokens": self.forwarded_tokens,
            "generated_tokens": self.generated_tokens,
            "content_tokens": self.content_tokens,
            "tokens_per_forward": round(self.tokens_per_forward, 4),
            "content_tokens_per_forward": round(self.content_tokens_per_forward, 4),
            "tokens_per_second": round(self.tokens_per_second, 2),
            "wall_time_s": round(self.wall_time, 4),
        }


StepCallback = Callable[[DecodeState], None]
