"""The sampler protocol and the sampler registry.

A sampler is a small class with a frozen ``Config`` dataclass, registered by name. Its
``step(inp, state)`` is tensor math on one step's logits and returns which positions to commit
(``StepOutput``). It never runs its own decode loop and never reads tensors back to the host,
except where a reference algorithm's random stream forces it (each such place says so).

Two kinds of samplers:
- ``fixed_steps = True``: the engine runs exactly the block's step budget (``steps`` split over
  blocks, LLaDA style) and commits every remaining mask on the block's last step.
- ``fixed_steps = False`` (adaptive): the engine loops until the block has no masks and commits the
  best-scoring position of any unfinished row that chose nothing, so every step makes progress.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, ClassVar, Mapping, Optional

from dllm.registry import Configurable, NoOptions, Registry
from dllm.state import DecodeState, StepInput, StepOutput

if TYPE_CHECKING:
    import torch


class Sampler(Configurable):
    """Base class: holds the frozen config; subclasses implement ``step``."""

    kind: ClassVar[str] = "sampler"
    Config: ClassVar[type] = NoOptions
    fixed_steps: ClassVar[bool] = True
    attention_layers: ClassVar[tuple[int, ...]] = ()  # layers whose attention probs the sampler reads
    needs_variants: ClassVar[bool] = False  # asks the engine for extra forwards (StepInput.forward_variants)
    greedy_only: ClassVar[bool] = False  # defined at temperature 0 only
    shadow_block: ClassVar[bool] = False  # reads leave-one-out logits of the block (StepInput.shadow_logits)
    revises: ClassVar[bool] = False  # may re-mask committed tokens (StepOutput.remask); the engine
    #   ignores ``remask`` from a sampler that does not declare it
    refines: ClassVar[bool] = False  # rewrites committed tokens of the current block (StepOutput.rewrite)
    #   and runs the block past its masks until every row is settled (StepOutput.settled); its
    #   ``max_block_steps`` then receives the nominal block length (the engine's bound on such a block)
    loads: ClassVar[tuple[str, ...]] = ()  # options naming a model or file the sampler loads: a server keeps
    #   its own value (a request may not make it load what the request names)
    soft_inputs: ClassVar[bool] = False  # feeds mixed input embeddings (StepOutput.soft): needs a model
    #   with an input embedding (DiffusionLM.input_embedding)
    reads_block_only: ClassVar[bool] = False  # reads nothing outside the block window (logits,
    #   tokens, scores): the engine then computes logits for the block's columns only and hands the
    #   sampler a StepInput whose query IS the block (query_start = block start, window = (0, W)).
    #   The same decisions by construction; tests/test_block_view.py compares both paths.

    @property
    def reads_right_of_block(self) -> bool:
        """Whether its decisions read logits of columns right of the block (all the canvas's masks, the
        next block's): the block cache of a block-causal model never forwards them (no block attends to
        a later one), so there such a sampler decides from what it gets, not as without a cache."""
        return False

    def prepare(self, device: torch.device) -> None:
        """Load what the sampler needs besides the model (APD's verifier) before a timed decode:
        ``generate`` calls it and leaves its time out of ``wall_time``, an evaluation before its clock."""

    def begin_block(self, state: DecodeState) -> None:
        """Called once when a block starts (after ``state.block_*`` are set)."""

    def step(self, inp: StepInput, state: DecodeState) -> StepOutput:
        raise NotImplementedError

    @property
    def commits_every_step(self) -> bool:
        """True when every step commits at least one active mask of every row that has one (an
        adaptive sampler whose rule always keeps its best position): the engine's progress rule is then
        a no-op and is skipped. tests/samplers/test_commits_every_step.py holds each one that says so."""
        return False

    @property
    def reads_block_masks(self) -> bool:
        """Whether the sampler reads ``DecodeState.block_masks_at_start`` (each row's masks in the block
        at its start, one sum per block); the engine leaves it None for one that says False."""
        return True

    def joins_mid_block(self, width: int, steps: Optional[int]) -> bool:
        """Whether rows at different steps of a block of ``width`` columns (``steps`` budgeted, None for
        an adaptive sampler) may share one step (``dllm.engine.running.RunningDecode``): the step reads
        no step index, nothing of the block's start but its width, and decides each row from that
        row's logits and canvas alone, drawing (temperature > 0) only through ``draws.rand``,
        ``chunked.gumbel_argmax`` or ``chunked.window_uniforms``. False unless a sampler says so (and
        a test of tests/test_running_decode.py holds it)."""
        return False

    def max_block_steps(self, block_len: int) -> int:
        """Adaptive samplers: the most steps a block of ``block_len`` may take (the engine raises
        past it). One commit per step needs ``block_len``; a revising sampler must bound its
        re-masking so that it finishes within what it returns here."""
        return block_len

    def block_refusal(self, block_size: int) -> Optional[tuple[str, str]]:
        """Why this sampler's options cannot decode blocks of ``block_size`` (a block-causal model's
        own, else the call's ``block_length``): (the option at fault, the message), or None.
        ``DecodeSettings.resolve`` refuses the call with it before any forward; ``begin_block`` too."""
        return None


samplers: Registry[type[Sampler]] = Registry("sampler", base=Sampler)
register_sampler = samplers.register_class  # class decorator: @register_sampler("name", aliases=...)


def make_sampler(sampler: "str | Sampler | Mapping[str, Any]", **options: Any) -> Sampler:
    """A sampler from a registered name, a spec string (``"threshold:threshold=0.8"``), a mapping
    with a ``"name"`` key, or an instance (no options then). Keyword options override the spec's."""
    return samplers.make(sampler, **options)
