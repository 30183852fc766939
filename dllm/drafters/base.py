"""The drafter protocol and the drafter registry.

A drafter proposes the K = block_size - 1 tokens that follow each row's last committed token (the
*anchor*); the target then verifies ``[anchor, d_1..d_K]`` in one forward (``loop.py``). Drafters
are small registered classes with a frozen ``Config`` (like samplers), built by ``make_drafter``
from a name, a spec string (``"ngram:max_ngram=4"``), a mapping or an instance.

Lifecycle of one ``speculative_generate`` call (the drafter object itself holds weights and options
only; everything that changes during a call lives in the session, so a drafter can serve call after
call without carrying state over):

    drafter.check_target(info)              # ValueError: vocabulary or tapped layers do not fit
    session = drafter.begin(setup)          # per call: the drafter's own caches (DraftSession)
    every round:
        draft = session.propose(ctx)        # DraftContext -> Draft: tokens [R, K] (+ q [R, K, V])
        session.select(keep)                # only when rows stopped: keep these rows, in this order

What the loop passes (``DraftContext``), for the R rows still running:
- the committed token ids per row (prompt + generated; the last one is the anchor), the anchors and
  their positions as tensors, K, the sampling settings and the call's generator;
- for drafters that declare ``target_layers`` (decoder-layer indices of the target, the DFlash
  convention: layer i is ``hidden_states[i + 1]`` of a transformers model), the target's hidden
  states of the tokens committed since the previous ``propose``, the tapped layers concatenated on
  the last dimension in the declared order: ``[R, N, len(target_layers) * D]``, with a validity mask
  and positions. First round: the prompt (left-padded); then block positions 0..accepted of the
  last verification (the previous anchor and the accepted drafts). The anchor itself never has
  hidden states yet: the target has not processed it.

How a target-conditioned drafter (DFlash, arXiv 2602.06036) fits, in one file: ``target_layers``
from its config; ``begin`` takes the target's ``get_input_embeddings()`` and
``get_output_embeddings()`` from ``setup.target`` and creates its own KV cache in its session;
``propose`` projects the new features into that cache, runs the block ``[anchor, MASK * K]`` at
positions ``anchor_position + 0..K``, reads arg-max tokens, and crops its cache back to the context
(dropping the block's K/V); ``select`` drops finished rows from that cache.
"""

from __future__ import annotations

import importlib
import importlib.util
from dataclasses import dataclass
from typing import Any, ClassVar, Mapping, Optional, Union

import torch

from dllm.drafters.verify import SamplingParams
from dllm.registry import Configurable, NoOptions, Registry

# modules under dllm.drafters that register built-in drafters (imported on first use of the
# registry; a module that is not there yet is skipped, so a new drafter is one new file)
BUILTIN_MODULES: tuple[str, ...] = ("ngram", "dlm", "failfast", "dflash.drafter", "jetspec.drafter", "dspark.drafter")


@dataclass(frozen=True)
class TargetInfo:
    """What a drafter may check about the target before a call."""

    vocab_size: int  # width of the target's logits (embedding rows, possibly padded)
    num_layers: int  # decoder layers
    hidden_size: int
    eos_ids: tuple[int, ...]  # ids that end a row
    pad_id: int
    model_type: str  # transformers' config.model_type ("qwen3", "llama", ...)
    tokenizer: Any = None  # the tokenizer the call uses, when there is one


@dataclass(frozen=True)
class DraftSetup:
    """What ``Drafter.begin`` gets once per call."""

    target: Any  # the transformers model (embed: target.get_input_embeddings(), head: get_output_embeddings())
    info: TargetInfo
    block_size: int  # B; K = B - 1 drafts per round
    batch_size: int  # rows at the start of the call
    params: SamplingParams
    generator: Optional[torch.Generator]
    device: torch.device
    paths: bool = False  # a tree builder of the call reads path estimates (Draft.paths; the taps builder)


@dataclass
class DraftContext:
    """One round's request, for the R rows still running (in the loop's current row order)."""

    tokens: list[list[int]]  # [R] committed ids per row (prompt + generated); tokens[r][-1] is the anchor.
    #   The loop's own lists, read them during propose (copy what you keep: they grow afterwards)
    rows: torch.Tensor  # [R] long, each row's index in the call's batch
    anchor: torch.Tensor  # [R] long, the last committed token
    anchor_position: torch.Tensor  # [R] long, its position (0 = the row's first prompt token)
    num_draft: int  # K = block_size - 1
    round: int  # 0 on the first propose of the call
    params: SamplingParams
    generator: Optional[torch.Generator]
    # target features of the tokens committed since the previous propose (None unless the drafter
    # declares target_layers): [R, N, len(target_layers) * D], model dtype
    hidden: Optional[torch.Tensor] = None
    hidden_mask: Optional[torch.Tensor] = None  # [R, N] bool, True on real entries
    hidden_positions: Optional[torch.Tensor] = None  # [R, N] long, positions of those tokens
    lengths: Optional[torch.Tensor] = None  # [R] long, drafts each row may use (its own K near
    #   max_new_tokens, its own block size with per-row plans); None = all K. Drafts past a row's
    #   length are never accepted; a block drafter may hide them (DFlash does, so a row drafts as alone)

    @property
    def batch_size(self) -> int:
        return len(self.tokens)


@dataclass
class Draft:
    """A drafter's proposal for the R rows of a ``DraftContext``."""

    tokens: torch.Tensor  # [R, K] long, the drafted tokens; a chain draft may be narrower, [R, W <= K]
    #   (a drafter of dynamic length gives its longest row's W: the round then forwards 1 + W tokens)
    probs: Optional[torch.Tensor] = None  # [R, K, V] the distributions the tokens were DRAWN from
    #   (exact speculative sampling then accepts with min(1, p/q)); None = one-hot / arg-max drafts
    lengths: Optional[torch.Tensor] = None  # [R] long, tokens really drafted per row (the rest of
    #   the row is filler and never accepted); None = all K
    forwards: int = 1  # drafter forwards this proposal cost (0 for model-free drafters)
    logits: Optional[torch.Tensor] = None  # [R, K, V] the drafter's per-position logits (marginals), for
    #   draft trees (a Plan's ``tree``, speculative_generate(plan=...)); None = the drafter gives its tokens only
    paths: Any = None  # a path_head.PathScorer: path-conditioned node estimates for the taps builder; None = none


class DraftSession:
    """Per-call state of a drafter. The default serves stateless drafters: ``propose`` calls
    ``drafter.propose`` and ``select`` has nothing to drop."""

    def __init__(self, drafter: "Drafter", setup: DraftSetup) -> None:
        self.drafter = drafter
        self.setup = setup

    def propose(self, ctx: DraftContext) -> Draft:
        return self.drafter.propose(ctx)

    def select(self, keep: torch.Tensor) -> None:
        """Rows stopped: keep rows ``keep`` [R'] (indices into the previous context's rows), in order."""


class Drafter(Configurable):
    """Base class: holds the frozen config (and weights, for model drafters). Stateless drafters
    implement ``propose``; drafters with per-call caches override ``begin`` to return their own
    ``DraftSession``."""

    kind: ClassVar[str] = "drafter"
    Config: ClassVar[type] = NoOptions
    default_block_size: ClassVar[int] = 8  # B used when the call's plan gives no block size
    trims_last_block: ClassVar[bool] = False  # near max_new_tokens, draft only the tokens a row may still
    #   emit (min(B - 1, left)): a block drafter whose reference does so (dflash); False: B - 1 always
    block_head: Any = None  # a block_head.BlockHead picking each row's B from the prefill (plan="auto")
    path_head: Any = None  # a path_head.PathHead scoring tree nodes by their paths (the taps builder)

    @property
    def target_layers(self) -> tuple[int, ...]:
        """Decoder layers of the target whose hidden states this drafter reads (() = none)."""
        return ()

    @property
    def vocab_size(self) -> Optional[int]:
        """Width of the drafter's token space, or None when it works on any vocabulary."""
        return None

    @property
    def block_size(self) -> int:
        """The block size B a call uses when it gives none (K = B - 1 drafts per round)."""
        return self.default_block_size

    @property
    def gives_distributions(self) -> Optional[bool]:
        """Whether its drafts carry per-position distributions (``Draft.logits``), which draft trees and
        verify-length policies read: True / False, or None when not known before a round (then a
        round that needs them says so)."""
        return None

    def check_target(self, info: TargetInfo) -> None:
        """ValueError when this drafter cannot serve the target (called before anything runs)."""
        if self.vocab_size is not None and self.vocab_size != info.vocab_size:
            raise ValueError(
                f"{self.kind} {self.name!r} has a vocabulary of {self.vocab_size} tokens but the target's "
                f"logits have {info.vocab_size}; drafter and target must share the tokenizer and vocabulary"
            )
        bad = [i for i in self.target_layers if not 0 <= i < info.num_layers]
        if bad:
            raise ValueError(f"{self.kind} {self.name!r} taps target layers {list(self.target_layers)}, but "
                             f"{bad} are not decoder layers of a {info.num_layers}-layer target "
                             f"(valid: 0 .. {info.num_layers - 1})")

    def begin(self, setup: DraftSetup) -> DraftSession:
        """The per-call session (validate call settings such as the block size here)."""
        return DraftSession(self, setup)

    def propose(self, ctx: DraftContext) -> Draft:
        raise NotImplementedError(f"{type(self).__name__} must implement propose (or begin, returning "
                                  f"a DraftSession that does)")


drafters: Registry[type[Drafter]] = Registry("drafter", base=Drafter)
register_drafter = drafters.register_class  # class decorator: @register_drafter("name", aliases=...)

DrafterSpec = Union[str, Drafter, Mapping[str, Any]]


def load_builtin_drafters() -> None:
    """Import the modules that register the built-in drafters (once; cheap afterwards)."""
    for name in BUILTIN_MODULES:
        module = f"dllm.drafters.{name}"
        try:
            found = importlib.util.find_spec(module) is not None
        except ModuleNotFoundError:  # its package is not there either
            found = False
        if found:
            importlib.import_module(module)


def make_drafter(drafter: DrafterSpec, **options: Any) -> Drafter:
    """A drafter from a registered name (``"ngram"``), a spec string (``"ngram:max_ngram=4"``), a
    mapping with a ``"name"`` key, or an instance (returned as is; no options then). Options that
    are objects (``dlm``'s ``model=``) go as keyword options."""
    if not isinstance(drafter, Drafter):
        load_builtin_drafters()
    return drafters.make(drafter, **options)


def list_drafters() -> list[tuple[str, str]]:
    """(name, one-line description) of every registered drafter, aliases noted."""
    load_builtin_drafters()
    return drafters.describe()


__all__ = ["BUILTIN_MODULES", "Draft", "DraftContext", "DraftSession", "DraftSetup", "Drafter", "DrafterSpec",
           "TargetInfo", "drafters", "list_drafters", "load_builtin_drafters", "make_drafter", "register_drafter"]
