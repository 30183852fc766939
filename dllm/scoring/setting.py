"""One decode setting: a sampler with its options, a cache policy, k tokens per step, a block length.

``DecodeSetting.parse`` reads the one text form every evaluation command takes (``dllm compare``,
``dllm eval-tasks``, ``dllm stress``, ``e2e``, ``choose_fast`` / ``choose_cache``, the lm-eval model):

    SAMPLER[:OPTION=VALUE,...]           the registry's spec grammar (``dllm.registry.parse_spec``)

with two options that are not the sampler's:

- ``k``: tokens per step, fixed-step samplers only (an adaptive sampler chooses how many tokens a
  step commits); ``steps_for`` turns it into ``generate``'s ``steps``: ``ceil(block / k)`` per block
  (LLaDA's schedule spreads a remainder over the first steps of a block);
- ``cache``: the cache policy spec. One with several options goes in parentheses
  (``fast:cache=(dual:look_back=16,look_ahead=16)``) or, where commas are taken (lm-eval's
  ``model_args``), with semicolons between its options (``cache=dual:look_back=16;look_ahead=16``).

Every other option goes to ``generate`` (the sampler's Config, or a decode option such as
``temperature``). Examples: ``low_confidence`` (one token per step), ``low_confidence:k=2``,
``threshold:threshold=0.8``, ``fast:cache=dual``.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Optional

from dllm.options import check_int, check_optional_int
from dllm.registry import format_spec, parse_spec
from dllm.schedule import BlockPlan

TOKENS_PER_STEP = "k"  # the spec option that is k, not a sampler option
CACHE = "cache"  # the spec option that is the cache policy


def steps_for(gen_length: int, block_length: Optional[int], k: Optional[int]) -> Optional[int]:
    """``generate``'s total ``steps`` for k tokens per step: blocks x ``ceil(block / k)`` (at most one
    step per position); None for k None (the sampler's own steps). ``block_length`` None: one block."""
    if k is None:
        return None
    bl = min(block_length or gen_length, gen_length)
    return -(-gen_length // bl) * min(-(-bl // k), bl)


def plan_steps(plan: BlockPlan, k: Optional[int]) -> Optional[int]:
    """``steps`` for k tokens per step over the blocks of ``plan`` (``dllm.settings.plan_for``: blocks
    of the block length, or a block-causal model's grid, whose first block may be the prompt's partial
    one): ``ceil(block_length / k)`` per block (``generate`` caps a short block at its size). None for
    k None (the sampler's own steps: one token per step for a fixed-step sampler)."""
    if k is None:
        return None
    return len(plan.blocks) * min(-(-plan.block_length // k), plan.block_length)


def cache_spec(text: Optional[str]) -> Optional[str]:
    """A cache spec with its options separated by semicolons (``dual:look_back=16;look_ahead=16``), as
    lm-eval's comma-split ``model_args`` need, in the registry's comma form; other text unchanged."""
    return text.replace(";", ",") if isinstance(text, str) else text


def check_tokens_per_step(sampler: str, k: Optional[int], label: Optional[str] = None) -> None:
    """``sampler`` is registered and ``k`` (tokens per step) is None, or an integer >= 1 for a
    fixed-step sampler (an adaptive sampler chooses how many tokens each step commits, so a k would
    be ignored)."""
    from dllm.samplers import samplers

    name, _ = parse_spec(sampler, "sampler")
    cls = samplers.get(name)  # an unknown name fails here, listing the valid ones
    if k is None:
        return
    check_int("tokens_per_step", k, 1)
    if not cls.fixed_steps:
        raise ValueError(f"sampler {label or sampler!r}: k applies to fixed-step samplers only "
                         f"({name!r} is adaptive: it chooses how many tokens each step commits)")


@dataclass(frozen=True)
class DecodeSetting:
    """A sampler (``name`` + ``sampler_options``), a cache policy, k tokens per step, a block length."""

    label: str  # as the user wrote it (the row name of a table)
    name: str  # the sampler's registered name or alias
    sampler_options: dict[str, Any] = field(default_factory=dict)  # to generate: sampler Config / decode options
    cache: Optional[str] = None  # cache policy spec; None: generate's default
    k: Optional[int] = None  # tokens per step, fixed-step samplers only; None: the sampler's own steps
    block_length: Optional[int] = None  # None: one block of the answer

    @classmethod
    def parse(cls, text: str, *, k: Optional[int] = None, cache: Optional[str] = None,
              block_length: Optional[int] = None, kind: str = "sampler spec") -> "DecodeSetting":
        """``"threshold:threshold=0.8,k=2,cache=(dual:refresh=4)"`` -> its setting. ``k`` / ``cache`` /
        ``block_length`` given here as well as in the text is an error (one place says each)."""
        if not isinstance(text, str):
            raise ValueError(f"{kind} must be a string such as 'low_confidence:k=2', got {text!r}")
        name, options = parse_spec(text, kind)
        for key, given in ((TOKENS_PER_STEP, k), (CACHE, cache)):
            if key in options and given is not None:
                raise ValueError(f"{kind} {text!r} sets {key}={options[key]!r} and {key}={given!r} is given too; "
                                 f"give it once")
        spec_k = options.pop(TOKENS_PER_STEP, None)
        if spec_k is not None:
            try:
                check_int("k", spec_k, 1)
            except ValueError as err:
                raise ValueError(f"{kind} {text!r}: {err}") from None
        spec_cache = options.pop(CACHE, None)
        if spec_cache is not None and not isinstance(spec_cache, str):
            raise ValueError(f"{kind} {text!r}: cache must be a cache policy spec such as dual, got {spec_cache!r}")
        check_optional_int("block_length", block_length, 1)
        return cls(text, name, options, cache_spec(spec_cache if cache is None else cache),
                   spec_k if k is None else k, block_length)

    @classmethod
    def of(cls, sampler: "str | DecodeSetting", *, k: Optional[int] = None, block_length: Optional[int] = None,
           options: Optional[dict[str, Any]] = None) -> "DecodeSetting":
        """A setting from ``decode_and_score``'s keyword form: a spec (or a setting, taken as it is when
        nothing else is given) plus k, a block length and ``generate`` options (``cache=`` among them)."""
        options = dict(options or {})
        if isinstance(sampler, DecodeSetting):
            if k is not None or block_length is not None or options:
                raise ValueError("give a DecodeSetting alone, or a sampler spec with tokens_per_step / block_length "
                                 f"/ options; got a setting and {({'k': k, 'block_length': block_length, **options})}")
            return sampler
        setting = cls.parse(sampler, k=k, cache=options.pop(CACHE, None), block_length=block_length)
        clash = sorted(set(options) & set(setting.sampler_options))
        if clash:
            raise ValueError(f"sampler spec {sampler!r} sets {clash} and they are given as options too; give each once")
        return cls(setting.label, setting.name, {**setting.sampler_options, **options}, setting.cache, setting.k,
                   setting.block_length)

    @property
    def options(self) -> dict[str, Any]:
        """``generate``'s keyword arguments besides steps and block length: the sampler options and
        ``cache`` (when set)."""
        return {**self.sampler_options, **({CACHE: self.cache} if self.cache is not None else {})}

    @property
    def spec(self) -> str:
        """The normalised text form (``parse(spec)`` gives this setting back, block length aside)."""
        extra = {TOKENS_PER_STEP: self.k} if self.k is not None else {}
        return format_spec(self.name, {**self.sampler_options, **extra, **({CACHE: self.cache} if self.cache else {})})

    def steps(self, gen_length: int, block_length: Optional[int] = None) -> Optional[int]:
        """``generate``'s ``steps`` for ``gen_length`` positions in blocks of ``block_length`` (default
        this setting's; None: one block)."""
        return steps_for(gen_length, block_length or self.block_length, self.k)

    def check(self) -> None:
        """Fail before any model loads or decodes: an unknown sampler (listing the valid ones), a k with
        an adaptive sampler, an unknown cache policy or a bad cache option."""
        check_tokens_per_step(self.name, self.k, self.label)
        if self.cache is not None:
            from dllm.cache import make_cache

            try:
                make_cache(self.cache)
            except (KeyError, TypeError, ValueError) as err:
                raise ValueError(f"sampler spec {self.label!r}: cache {self.cache!r}: {err}") from None


__all__ = ["CACHE", "TOKENS_PER_STEP", "DecodeSetting", "cache_spec", "check_tokens_per_step", "plan_steps",
           "steps_for"]
