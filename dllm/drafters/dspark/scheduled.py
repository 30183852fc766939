"""``scheduled``: any drafter, its drafts cut by a verify-length policy (DSpark's confidence-scheduled
verification, arXiv 2607.05147, applied to drafters without a confidence head).

    scheduled:inner=(dflash:model=tiny-ar-dflash),policy=(threshold:threshold=0.6)

Each round the inner drafter proposes as usual; the confidence of drafted position k is the top
probability of the drafter's own distribution there (``verify_length.top_confidence``: at T = 0 the
drafted token's probability when the drafter takes the arg-max of that distribution, as DFlash does;
a DFlash 2 selector may draft another token, and the top marginal is still the confidence; at T > 0
known before the token is drawn, which keeps sampling exact; either way it only cuts drafts); the
policy (``verify_length.py``) turns the confidences into per-row lengths, and the round forwards only
``[anchor, d_1..d_L]`` of the longest kept row (``Draft.lengths`` cuts the others). Lossless like every
draft: verification is unchanged, only fewer drafts reach it. Everything else (tapped layers, block
size, vocabulary, the last-block rule) is the inner drafter's.

Options: ``inner``, the inner drafter's spec (or pass a ``Drafter`` as ``inner=``), and ``policy``,
a verify-length policy spec (``full``, ``threshold``, ``survival``). The ``dspark`` drafter takes a
policy itself (``verify_length=``) and scores its drafts with its confidence head.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Optional

from dllm.drafters.base import Draft, DraftContext, DraftSession, DraftSetup, Drafter, TargetInfo, make_drafter, \
    register_drafter
from dllm.drafters.dspark.verify_length import VerifyLength, make_verify_length, schedule_draft, top_confidence


@dataclass(frozen=True)
class ScheduledConfig:
    inner: Optional[str] = None  # the inner drafter's spec, e.g. "(dflash:model=tiny-ar-dflash)" (or inner=<Drafter>)
    policy: str = "threshold"  # verify-length policy spec: full | threshold[:threshold=,min_length=] | survival[:...]

    def __post_init__(self) -> None:
        if self.inner is not None and (not isinstance(self.inner, str) or not self.inner):
            raise ValueError(f"inner must be a drafter spec such as '(dflash:model=tiny-ar-dflash)' (or pass a "
                             f"Drafter as inner=...), got {self.inner!r}")
        make_verify_length(self.policy)  # an unknown policy or option: the registry's error, naming the valid ones


@register_drafter("scheduled")
class ScheduledDrafter(Drafter):
    """Another drafter's drafts, cut per row by a confidence-scheduled verify length (DSpark)."""

    Config = ScheduledConfig

    def __init__(self, config: Optional[ScheduledConfig] = None, *, inner: Any = None, **options: Any) -> None:
        if isinstance(inner, str):
            options["inner"] = inner
            inner = None
        super().__init__(config, **options)
        drafter = inner
        if drafter is None:
            if self.config.inner is None:
                raise ValueError("the scheduled drafter needs an inner drafter: inner=<Drafter> or a spec "
                                 "(scheduled:inner=(dflash:model=tiny-ar-dflash))")
            drafter = make_drafter(self.config.inner)
        elif not isinstance(drafter, Drafter):
            raise TypeError(f"the scheduled drafter's inner drafter must be a Drafter or a drafter spec, "
                            f"got {type(drafter).__name__}")
        self.inner: Drafter = drafter
        self.policy: VerifyLength = make_verify_length(self.config.policy)
        if self.policy.cuts and drafter.gives_distributions is False:  # known now, not at the first round
            raise ValueError(f"a verify-length policy needs the inner drafter's per-position distributions, but "
                             f"{drafter.name!r} returns tokens only; use a drafter that gives them (dflash, dspark, "
                             f"dlm:marginals=true)")
        self.trims_last_block = drafter.trims_last_block  # type: ignore[misc]  # the inner drafter's rule
        self.default_block_size = drafter.default_block_size  # type: ignore[misc]

    @property
    def target_layers(self) -> tuple[int, ...]:
        return self.inner.target_layers

    @property
    def gives_distributions(self) -> Optional[bool]:
        return self.inner.gives_distributions

    @property
    def vocab_size(self) -> Optional[int]:
        return self.inner.vocab_size

    @property
    def block_size(self) -> int:
        return self.inner.block_size

    @property
    def block_head(self) -> Any:  # type: ignore[override]
        return self.inner.block_head

    def check_target(self, info: TargetInfo) -> None:
        self.inner.check_target(info)

    def begin(self, setup: DraftSetup) -> DraftSession:
        return ScheduledSession(self, setup, self.inner.begin(setup))


class ScheduledSession(DraftSession):
    """The inner drafter's session; every proposal cut by the policy."""

    def __init__(self, drafter: ScheduledDrafter, setup: DraftSetup, inner: DraftSession) -> None:
        super().__init__(drafter, setup)
        self.inner = inner
        self.policy = drafter.policy

    def propose(self, ctx: DraftContext) -> Draft:
        draft = self.inner.propose(ctx)
        if not self.policy.cuts or draft.tokens.shape[1] == 0:
            return draft
        return schedule_draft(draft, self.policy.lengths(top_confidence(draft)))

    def select(self, keep) -> None:
        self.inner.select(keep)


__all__ = ["ScheduledConfig", "ScheduledDrafter", "ScheduledSession"]
