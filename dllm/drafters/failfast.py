"""``failfast``: a dllm diffusion LM drafts with a dynamic length, fail fast / win big (FailFast,
Pan et al. arXiv 2512.20573; authors' code github.com/ruipeterpan/failfast).

The rule (paper Alg. 1; upstream ``generate_draft_tokens_arbitrary_length`` in the authors'
Fast_dLLM_v2 fork, called by ``failfast.py`` ``get_next_tokens_dllm`` (lines 234-311) in the round
at lines 558-584, the whole proposal verified at 597-651, defaults ``--spec_len 10 --sweep_incr_len
10 --sweep_max_spec_len 60 --sweep_lowconf_threshold 0.45`` at lines 355-373):

    L = first                                     # N tokens, drafted with ONE forward (fail fast)
    loop:
        forward [context, drafted, MASK x n]      # n = first, then chunk; arg-max tokens and their
        append the n tokens and their confidences #   confidence p(token) (the drafter's softmax)
        stop if a drafted token is an EOS         # the draft is cut after it (upstream truncates
                                                  #   the proposal after its stop token)
        stop if any confidence < tau              # a hard region: verify what we have (fail fast)
        stop if L >= max_draft                    # N_max
        L += chunk                                # an easy region: draft on (win big)
    the target verifies all L tokens in one forward (upstream verifies the whole proposal)

Each chunk costs exactly one drafter forward: the authors draft with Fast-dLLM's parallel decoding
at threshold 0.05, which commits in one forward every position whose top probability exceeds 0.05;
a position it leaves masked has confidence <= 0.05 < tau (for tau > 0.05), so that round stops at
that chunk either way. We commit such a position by its arg-max in the same forward instead of spending more
(``docs/guides/speculative.md``: the differences from the upstream model-specific decoder).

Drafts are one-hot (arg-max), so verification is exact at any target temperature. Lengths differ
per row and per round (``Draft.lengths``); the draft is only as wide as its longest row, so the
round's target forward covers what was drafted. The plan's block size B caps a draft at B - 1
(default B = max_draft + 1). Model, vocabulary and context rules are the ``dlm`` drafter's.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional, Sequence

import torch

from dllm.drafters.base import Draft, DraftContext, DraftSession, DraftSetup, register_drafter
from dllm.drafters.dlm import DLMDrafter
from dllm.models.quantize import check_quantization
from dllm.options import SettingError, check_int, check_optional_int, check_unit


@dataclass(frozen=True)
class FailFastConfig:
    model: Optional[str] = None  # embedded name / directory / Hub id (or pass model=<DiffusionLM>)
    first: int = 10  # tokens drafted before the first check (upstream --spec_len 10)
    chunk: int = 10  # tokens added per extension, N in Alg. 1 (upstream --sweep_incr_len 10)
    max_draft: int = 60  # N_max: the longest draft (upstream --sweep_max_spec_len 60)
    tau: float = 0.45  # extend only while every drafted token's confidence >= tau (upstream
    #   --sweep_lowconf_threshold, default 0.45; its sweep script uses 0.5)
    max_context: Optional[int] = None  # read at most the last max_context tokens (None: all that fit)
    quantization: Optional[str] = None  # "int8" | "int4" | "nf4": weight-only (dllm.models.quantize)

    def __post_init__(self) -> None:
        if self.model is not None and (not isinstance(self.model, str) or not self.model):
            raise ValueError(f"model must be a model name or path (or pass a DiffusionLM as model=...), "
                             f"got {self.model!r}")
        check_int("first", self.first, 1, hint=" (tokens drafted before the first confidence check)")
        check_int("chunk", self.chunk, 1, hint=" (tokens added per extension)")
        check_int("max_draft", self.max_draft, 1, hint=" (the longest draft, N_max)")
        if self.first > self.max_draft:
            raise SettingError("first", f"first ({self.first}) must not exceed max_draft ({self.max_draft})")
        check_unit("tau", self.tau, hint=" (the confidence below which drafting stops)")
        check_optional_int("max_context", self.max_context, 1)
        check_quantization(self.quantization)


def extend_step(tokens: Sequence[int], confidences: Sequence[float], drafted: int, cap: int, tau: float,
                eos: frozenset) -> tuple[int, bool]:
    """One chunk's decision for one row: (tokens of this chunk the row keeps, whether it drafts on).

    ``tokens`` / ``confidences``: the chunk's arg-max tokens and their probabilities, already cut
    to what the row may still draft (``cap - drafted``). Keeps them up to and including the first
    EOS (then stops); otherwise stops on a confidence below ``tau`` or at ``cap``, else goes on.
    """
    for i, t in enumerate(tokens):
        if t in eos:
            return i + 1, False
    keep = len(tokens)
    go_on = keep > 0 and min(confidences) >= tau and drafted + keep < cap
    return keep, go_on


@register_drafter("failfast")
class FailFastDrafter(DLMDrafter):
    """A dllm diffusion LM drafting a dynamic length: one forward per chunk, extended while confident (FailFast)."""

    Config = FailFastConfig
    trims_last_block = True  # near max_new_tokens draft no more than a row may still emit
    gives_distributions = False  # chunks of tokens (their confidences decide the length, not returned)

    @property
    def block_size(self) -> int:
        return self.config.max_draft + 1

    def begin(self, setup: DraftSetup) -> DraftSession:
        widest = max(self.config.first, self.config.chunk)
        if int(self.model.max_positions) - widest < 1:
            raise ValueError(f"failfast drafts chunks of {widest} masks, which leave no context in the drafter's "
                             f"{self.model.max_positions} positions; use smaller first / chunk")
        return FailFastSession(self, setup)

    def caps(self, ctx: DraftContext) -> list[int]:
        """Per row the most tokens it may draft: max_draft, the round's K, the row's own length."""
        cap = min(self.config.max_draft, ctx.num_draft)
        if ctx.lengths is None:
            return [cap] * ctx.batch_size
        return [min(cap, n) for n in ctx.lengths.tolist()]

    @torch.no_grad()
    def chunk_step(self, seqs: list[list[int]], n: int) -> tuple[list[list[int]], list[list[float]]]:
        """One drafter forward over ``[tail of seq, MASK x n]`` per row: the arg-max tokens of the n
        masks and their confidences (the drafter's probability of that token; mask id excluded)."""
        logits = self.marginal_logits([self.context(s, n) for s in seqs], n)  # [R, n, V]
        conf, tokens = logits.softmax(dim=-1).max(dim=-1)  # [R, n] x2
        return tokens.tolist(), conf.tolist()  # host sync: the rule and the next canvases are host-side

    def draft(self, ctx: DraftContext, eos: frozenset) -> Draft:
        """The round's drafts: tokens [R, W] (W = the longest row's length), lengths [R]."""
        cfg, caps = self.config, self.caps(ctx)
        drafted: list[list[int]] = [[] for _ in range(ctx.batch_size)]
        live = [r for r, c in enumerate(caps) if c > 0]  # rows still drafting
        forwards, n = 0, cfg.first
        while live:
            tokens, conf = self.chunk_step([ctx.tokens[r] + drafted[r] for r in live], n)
            forwards += 1
            nxt = []
            for i, r in enumerate(live):
                room = caps[r] - len(drafted[r])
                keep, go_on = extend_step(tokens[i][:room], conf[i][:room], len(drafted[r]), caps[r], cfg.tau, eos)
                drafted[r] += tokens[i][:keep]
                if go_on:
                    nxt.append(r)
            live, n = nxt, cfg.chunk
        return _pack(drafted, self.model.pad_id, ctx.anchor.device, forwards)


class FailFastSession(DraftSession):
    """Per call: the target's EOS ids (a draft ends at its first one)."""

    def __init__(self, drafter: FailFastDrafter, setup: DraftSetup) -> None:
        super().__init__(drafter, setup)
        self.eos = frozenset(setup.info.eos_ids)

    def propose(self, ctx: DraftContext) -> Draft:
        return self.drafter.draft(ctx, self.eos)


def _pack(drafted: list[list[int]], filler: int, device: torch.device, forwards: int) -> Draft:
    """Ragged per-row drafts -> tokens [R, W] (filler past a row's length), lengths [R]."""
    width = max(len(d) for d in drafted)
    tokens = torch.tensor([d + [filler] * (width - len(d)) for d in drafted], dtype=torch.long, device=device)
    lengths = torch.tensor([len(d) for d in drafted], dtype=torch.long, device=device)
    return Draft(tokens=tokens.reshape(len(drafted), width), lengths=lengths, forwards=forwards)


__all__ = ["FailFastConfig", "FailFastDrafter", "extend_step"]
