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

from dataclasses import dataclass
from typing import Any, ClassVar

from dllm.registry import Registry, build_config as _build_config
from dllm.state import DecodeState, StepInput, StepOutput


@dataclass(frozen=True)
class NoOptions:
    """A sampler without options."""


class Sampler:
    """Base class: holds the frozen config; subclasses implement ``step``."""

    name: ClassVar[str] = ""
    Config: ClassVar[type] = NoOptions
    fixed_steps: ClassVar[bool] = True
    attention_layers: ClassVar[tuple[int, ...]] = ()  # layers whose attention probs the sampler reads
    hidden_layers: ClassVar[tuple[int, ...]] = ()  # layers whose hidden states the sampler reads
    needs_variants: ClassVar[bool] = False  # asks the engine for extra forwards (StepInput.forward_variants)
    greedy_only: ClassVar[bool] = False  # defined at temperature 0 only
    shadow_block: ClassVar[bool] = False  # reads leave-one-out logits of the block (StepInput.shadow_logits)
    revises: ClassVar[bool] = False  # may re-mask committed tokens of the block (StepOutput.remask)

    def __init__(self, config: Any | None = None, **options: Any) -> None:
        if config is not None and options:
            raise TypeError("pass either a Config or keyword options, not both")
        self.config = config if config is not None else build_config(self.Config, options, self.name)

    def begin_block(self, state: DecodeState) -> None:
        """Called once when a block starts (after ``state.block_*`` are set)."""

    def step(self, inp: StepInput, state: DecodeState) -> StepOutput:
        raise NotImplementedError

    def max_block_steps(self, block_len: int) -> int:
        """Adaptive samplers: the most steps a block of ``block_len`` may take (the engine raises
        past it). One commit per step needs ``block_len``; a revising sampler must bound its
        re-masking so that it finishes within what it returns here."""
        return block_len

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.config})"


def build_config(config_cls: type, options: dict[str, Any], sampler: str) -> Any:
    """A sampler's frozen config from keyword options; unknown keys list the valid ones."""
    return _build_config(config_cls, options, "sampler", sampler)


samplers: Registry[type[Sampler]] = Registry("sampler")


def register_sampler(name: str, *, aliases: tuple[str, ...] = (), description: str | None = None):
    """Class decorator: register a ``Sampler`` subclass under ``name``."""

    def deco(cls: type[Sampler]) -> type[Sampler]:
        cls.name = name
        samplers.add(name, cls, aliases=aliases, description=description)
        return cls

    return deco


def make_sampler(sampler: "str | Sampler", **options: Any) -> Sampler:
    """A sampler instance from a registered name (plus options) or an instance (no options)."""
    if isinstance(sampler, Sampler):
        if options:
            raise TypeError(
                f"options {sorted(options)} were given together with a sampler instance "
                f"{sampler!r}; set them on its Config instead"
            )
        return sampler
    if not isinstance(sampler, str):
        raise TypeError(f"sampler must be a registered name or a Sampler, got {type(sampler).__name__}")
    cls = samplers.get(sampler)
    return cls(**options)
