"""One way to say how to decode: ``DecodeSettings``, checked and resolved once.

``dllm.generate`` builds one from its keywords and the server from a request (vLLM's
``SamplingParams`` plays this part there); both call ``resolve(model, prompt rows, gen_length)``,
which returns the sampler, the cache policy and the block plan, or raises ``SettingError`` whose
``field`` names the bad setting (``sampler``, ``sampler_options`` or the option's own name,
``cache``, ``block_length``, ``steps``, ``gen_length``, ``temperature``, ``cfg_scale``, ``seed``,
``prompt``). So every entry point refuses a bad setting with the same message, and the server
answers with the field as OpenAI's ``param`` without reading the message.

``k`` (tokens committed per step, a fixed-step sampler's) means one thing everywhere: the field
``tokens_per_step``, turned into ``steps`` over the call's block plan (``ceil(block / k)`` per block,
LLaDA's schedule). The evaluation commands (``dllm compare``, ``dllm stress``, ``dllm eval tasks``,
the lm-eval model) write it as ``k`` in their text form, ``DecodeSettings.parse``:

    SAMPLER[:OPTION=VALUE,...]           the registry's spec grammar (``dllm.registry.parse_spec``)

where two options are not the sampler's: ``k`` (tokens per step) and ``cache`` (the cache policy
spec; one with several options in parentheses, ``fast:cache=(dual:look_back=16,look_ahead=16)``, or,
where commas are taken as in lm-eval's ``model_args``, with semicolons between its options). Every
other option is the sampler's. ``generate`` and the server take ``steps`` instead; a ``k`` given to
them is refused with a pointer to ``steps``.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any, Mapping, Optional, Sequence

from dllm.cache import make_cache
from dllm.cache.base import CachePolicy
from dllm.cache.block_causal import block_size_of, policy_for_model
from dllm.inputs import fit_layers
from dllm.options import SettingError, SettingTypeError, check_int, check_number, check_optional_int, field_error
from dllm.registry import format_spec, parse_spec
from dllm.samplers import Sampler, make_sampler
from dllm.schedule import BlockPlan, plan_block_causal, plan_blocks


TOKENS_PER_STEP = "k"  # the text form's option that is ``tokens_per_step``, not a sampler option
CACHE = "cache"  # the text form's option that is the cache policy
SEED_MAX = 2**64 - 1  # torch.Generator.manual_seed takes seeds in [0, 2**64 - 1] (a uint64)
DEFAULT_GEN_LENGTH = 128  # generated positions when neither the call nor the prompt says


def default_gen_length(model: Any, rows: Sequence[Sequence[int]]) -> int:
    """``gen_length`` when the call gives none: what the model was trained to generate. For a task
    model (a word-level tokenizer over the task vocabulary, the embedded tiny models) and task
    prompts (``[BOS] sort D A C B [SEP]``), the longest of their tasks' answer regions (the answer
    and its EOS: ``tasks.answer_length``), as the models were trained; otherwise 128."""
    from dllm import tasks as T

    tok = getattr(model, "tokenizer", None)
    if tok is None or not hasattr(tok, "convert_ids_to_tokens"):
        return DEFAULT_GEN_LENGTH
    lengths = []
    for row in rows:
        try:
            ex = T.parse_prompt(tok.convert_ids_to_tokens(list(row)))
        except (ValueError, KeyError, TypeError):
            return DEFAULT_GEN_LENGTH
        lengths.append(T.answer_length(ex.task, ex.size))
    return max(lengths) if lengths else DEFAULT_GEN_LENGTH


@dataclass(frozen=True)
class Resolved:
    """What a ``DecodeSettings`` means for one call: the sampler, the cache policy, the block plan."""

    sampler: Sampler
    policy: CachePolicy
    plan: BlockPlan


@dataclass(frozen=True)
class DecodeSettings:
    """How to decode (the keywords of ``dllm.generate`` beside the prompts and ``gen_length``)."""

    sampler: Any = "low_confidence"  # a registered name or spec string ("threshold:threshold=0.8"), a mapping, a Sampler
    cache: Any = "none"  # a registered cache spec ("dual:refresh=4"), a mapping, a CachePolicy
    block_length: Optional[int] = None  # None: one block of gen_length
    steps: Optional[int] = None  # fixed-step samplers: steps in all (None: one token per step)
    temperature: float = 0.0
    cfg_scale: float = 0.0
    seed: Any = None  # an int, one per prompt (a list; None entries: fresh seeds), or None (the global generator)
    options: tuple[tuple[str, Any], ...] = ()  # sampler options given apart from the spec, sorted by name
    tokens_per_step: Optional[int] = None  # k, fixed-step samplers: steps = ceil(block / k) per block (not with steps)
    label: Optional[str] = field(default=None, compare=False)  # the text it was parsed from (a table's row name)

    @classmethod
    def of(cls, options: Optional[Mapping[str, Any]] = None, **fields: Any) -> "DecodeSettings":
        """Settings with ``options`` as a mapping (kept sorted, so equal settings compare equal)."""
        return cls(options=tuple(sorted((options or {}).items())), **fields)

    @classmethod
    def parse(cls, text: str, *, k: Optional[int] = None, cache: Optional[str] = None,
              block_length: Optional[int] = None, options: Optional[Mapping[str, Any]] = None,
              kind: str = "sampler spec") -> "DecodeSettings":
        """The text form (``"threshold:threshold=0.8,k=2,cache=(dual:refresh=4)"``) completed by ``k``,
        ``cache``, ``block_length`` and ``options`` (``generate``'s other keywords: decode fields such as
        ``temperature``, else sampler options). Anything said twice (``k`` in the text and as ``k=``, an
        option in the text and in ``options``) is refused: one place says each. SettingError naming it."""
        if not isinstance(text, str):
            raise SettingError("sampler", f"{kind} must be a string such as 'low_confidence:k=2', got {text!r}")
        try:
            name, spec_options = parse_spec(text, kind)
        except ValueError as err:
            raise field_error("sampler", err) from None
        extra = dict(options or {})
        given = {TOKENS_PER_STEP: k, CACHE: cache if cache is not None else extra.pop(CACHE, None)}
        for key, value in given.items():
            if key in spec_options and value is not None:
                raise SettingError(key, f"{kind} {text!r} sets {key}={spec_options[key]!r} and {key}={value!r} is "
                                        f"given too; give it once")
        spec_k = spec_options.pop(TOKENS_PER_STEP, None)
        if spec_k is not None:
            try:
                check_int("k", spec_k, 1)
            except ValueError as err:
                raise SettingError("tokens_per_step", f"{kind} {text!r}: {err}") from None
        spec_cache = spec_options.pop(CACHE, None)
        if spec_cache is not None and not isinstance(spec_cache, str):
            raise SettingError("cache", f"{kind} {text!r}: cache must be a cache policy spec such as dual, "
                                        f"got {spec_cache!r}")
        check_optional_int("block_length", block_length, 1)
        own = {f.name for f in dataclasses.fields(cls)} - {"sampler", "cache", "options", "label", "tokens_per_step"}
        twice = sorted(set(extra) & set(spec_options))
        if twice:
            raise SettingError(twice[0], f"{kind} {text!r} sets {twice} and they are given as options too; give "
                                         f"each once")
        cache_text = spec_cache if given[CACHE] is None else given[CACHE]
        return cls.of(sampler=name, options={**spec_options, **{n: v for n, v in extra.items() if n not in own}},
                      cache="none" if cache_text is None else cache_spec(cache_text), block_length=block_length,
                      tokens_per_step=spec_k if k is None else k, label=text,
                      **{n: v for n, v in extra.items() if n in own})

    @property
    def name(self) -> str:
        """The sampler's name as given (a registered name or alias)."""
        if isinstance(self.sampler, str):
            return parse_spec(self.sampler, "sampler spec")[0]
        return getattr(self.sampler, "name", None) or dict(self.sampler).get("name", "")

    @property
    def sampler_options(self) -> dict[str, Any]:
        return dict(self.options)

    @property
    def spec(self) -> str:
        """The text form (``parse(spec)`` gives these settings back, block length and decode fields aside)."""
        extra = {} if self.tokens_per_step is None else {TOKENS_PER_STEP: self.tokens_per_step}
        cache_text = _spec_text(self.cache, make_cache)
        cache = {} if cache_text == "none" else {CACHE: cache_text}
        name, spec_options = parse_spec(_spec_text(self.sampler, make_sampler), "sampler spec")
        return format_spec(name, {**spec_options, **dict(self.options), **extra, **cache})

    def generate_kwargs(self) -> dict[str, Any]:
        """The keyword arguments of ``dllm.generate`` (without the prompts and ``gen_length``). Settings
        with ``tokens_per_step`` give their steps first (``with_steps``)."""
        if self.tokens_per_step is not None:
            raise ValueError(f"settings {self.label or self.spec!r} give tokens_per_step={self.tokens_per_step}, "
                             f"which generate takes as steps: call with_steps(model, rows, gen_length) first")
        skip = {"options", "label", "tokens_per_step"}
        kw = {f.name: getattr(self, f.name) for f in dataclasses.fields(self) if f.name not in skip}
        kw.update(dict(self.options))
        return kw

    def replace(self, **changes: Any) -> "DecodeSettings":
        return dataclasses.replace(self, **changes)

    def with_steps(self, model: Any, rows: Sequence[Sequence[int]], gen_length: int) -> "DecodeSettings":
        """These settings with ``tokens_per_step`` turned into ``steps`` over the call's block plan
        (``plan_steps``); unchanged without one. A k that ``check`` refuses (not an integer >= 1, or for
        an adaptive sampler, which would ignore the steps) is refused here too (SettingError)."""
        if self.tokens_per_step is None:
            return self
        self._checked()
        plan = plan_for(model, rows, gen_length, self.block_length, None, fixed_steps=False)
        return self.replace(steps=plan_steps(plan, self.tokens_per_step), tokens_per_step=None)

    def check(self) -> Sampler:
        """The checks that need no model or prompt (fail before either loads): the sampler and its
        options, ``tokens_per_step`` (fixed-step samplers only, not with ``steps``), the cache policy,
        the numbers. Returns the sampler. SettingError naming the field."""
        return self._checked()[0]

    def _checked(self) -> tuple[Sampler, CachePolicy]:
        """``check``'s sampler and the cache policy it built."""
        policy = _cache(self.cache)
        sampler = _sampler(self.sampler, dict(self.options), policy)
        if self.tokens_per_step is not None:
            try:
                check_int("k", self.tokens_per_step, 1, hint=" (tokens per step)")
            except SettingError as err:
                raise SettingError("tokens_per_step", str(err)) from None
            if self.steps is not None:
                raise SettingError("tokens_per_step", f"give steps={self.steps} or tokens_per_step="
                                                      f"{self.tokens_per_step} (k), not both")
            if not sampler.fixed_steps:
                raise SettingError("tokens_per_step", f"sampler {self.label or self.name!r}: k applies to fixed-step "
                                                      f"samplers only ({self.name!r} is adaptive: it chooses how "
                                                      f"many tokens each step commits)")
        check_number("temperature", self.temperature, low=0.0, finite=True)
        check_number("cfg_scale", self.cfg_scale, low=0.0, finite=True)
        return sampler, policy

    def resolve(self, model: Any, rows: Sequence[Sequence[int]], gen_length: int) -> Resolved:
        """Check every setting against the model and the prompts (token-id rows), and plan the call.
        Raises ``SettingError`` (a ValueError; ``SettingTypeError`` also a TypeError) naming the field."""
        check_seed(self.seed, len(rows))
        sampler, policy = self._checked()
        settings = self.with_steps(model, rows, gen_length)
        policy = policy_for_model(model, policy)  # block-causal models: "auto" is "block", approximate ones refused
        if policy.uses_kv and not getattr(model, "supports_kv_cache", True):  # refused here, not at allocate
            raise SettingError("cache", f"cache {policy.spec!r} reuses keys/values, but {type(model).__name__} has no "
                                        f"attention layers to cache them (no KV cache); use cache='none'")
        plan = plan_for(model, rows, gen_length, self.block_length, settings.steps, fixed_steps=sampler.fixed_steps)
        try:
            policy.check(model, block_length=plan.block_length, gen_length=gen_length)
        except (ValueError, TypeError) as err:
            raise field_error("cache", err) from None
        check_positions(model, max(len(r) for r in rows), gen_length)
        if sampler.greedy_only and self.temperature > 0:
            raise SettingError("temperature", f"sampler {sampler.name!r} is greedy only; got temperature="
                                              f"{self.temperature} (use temperature=0)")
        refusal = policy.sampler_refusal(sampler)
        if refusal is not None:
            raise SettingError("cache", f"sampler {sampler.name!r} {refusal}")
        at_fault = sampler.block_refusal(block_size_of(model) or plan.block_length)
        if at_fault is not None:
            raise SettingError(*at_fault)
        need_attn = fit_layers(sampler.attention_layers, model)
        if need_attn and not getattr(model, "supports_kv_cache", True):
            raise SettingError("sampler", f"sampler {sampler.name!r} reads the model's attention probabilities "
                                          f"(layers {list(need_attn)}), but {type(model).__name__} has no "
                                          f"transformer layers to return them; use a sampler that reads only logits")
        if sampler.soft_inputs and getattr(model, "input_embedding", lambda: None)() is None:
            raise SettingError("sampler", f"sampler {sampler.name!r} feeds soft inputs (mixed token embeddings), but "
                                          f"{type(model).__name__} has no input embedding to mix; use a weight-backed "
                                          f"model")
        return Resolved(sampler, policy, plan)


def steps_for(gen_length: int, block_length: Optional[int], k: Optional[int]) -> Optional[int]:
    """``generate``'s total ``steps`` for k tokens per step on a bidirectional model: blocks x
    ``ceil(block / k)`` (at most one step per position); None for k None. ``block_length`` None: one block."""
    if k is None:
        return None
    bl = min(block_length or gen_length, gen_length)
    return -(-gen_length // bl) * min(-(-bl // k), bl)


def plan_steps(plan: BlockPlan, k: Optional[int]) -> Optional[int]:
    """``steps`` for k tokens per step over the blocks of ``plan`` (``plan_for``: blocks of the block
    length, or a block-causal model's grid, whose first block may be the prompt's partial one):
    ``ceil(block_length / k)`` per block (``generate`` caps a short block at its size). None for k None."""
    if k is None:
        return None
    return len(plan.blocks) * min(-(-plan.block_length // k), plan.block_length)


def cache_spec(text: Optional[str]) -> Optional[str]:
    """A cache spec with its options separated by semicolons (``dual:look_back=16;look_ahead=16``), as
    lm-eval's comma-split ``model_args`` need, in the registry's comma form; other text unchanged."""
    return text.replace(";", ",") if isinstance(text, str) else text


def plan_for(model: Any, rows: Sequence[Sequence[int]], gen_length: int, block_length: Optional[int],
             steps: Optional[int], *, fixed_steps: bool) -> BlockPlan:
    """The block plan of a call on ``model``, the one place that tells the kinds of model apart: blocks
    of ``block_length`` on a bidirectional model (``plan_blocks``), the model's own grid on a
    block-causal one (SDAR, LLaDA 2, Fast-dLLM v2: ``plan_block_causal``, which needs every prompt row
    in ``rows`` to end at the same offset inside a block). SettingError naming the field."""
    bs = block_size_of(model)
    if bs is None:
        return plan_blocks(gen_length, block_length, steps, fixed_steps=fixed_steps)
    return plan_block_causal(gen_length, block_length, steps, fixed_steps=fixed_steps, block_size=bs,
                             prompt_lengths=[len(r) for r in rows],
                             model_name=getattr(model, "display_name", "this model"))


def check_seed(seed: Any, n_rows: int, *, per_row: bool = True) -> None:
    """An int in [0, 2**64 - 1], None, or (``per_row``) a list of them (None entries allowed) with one
    per row."""
    seeds = seed if isinstance(seed, (list, tuple)) else [seed]
    for s in seeds:
        if s is not None and (not isinstance(s, int) or isinstance(s, bool) or not 0 <= s <= SEED_MAX):
            rows = " a list of them (one per prompt, None for an unseeded row)," if per_row else ""
            raise SettingError("seed", f"seed must be an integer in [0, 2**64 - 1] (torch.Generator's range),"
                                       f"{rows} or None, got {seed!r:.200}")
    if isinstance(seed, (list, tuple)) and len(seed) != n_rows:
        raise SettingError("seed", f"seed is a list of {len(seed)} seeds for {n_rows} prompts; give one per prompt "
                                   f"(or one integer for the whole batch)")


def check_call_seed(seed: Any) -> None:
    """One seed for a whole call (``speculative_generate``, a speculative request): an int in
    [0, 2**64 - 1] or None."""
    if isinstance(seed, (list, tuple)):
        raise SettingTypeError("seed", f"seed must be one integer for the call (or None), got a list {seed!r:.200}")
    check_seed(seed, 1, per_row=False)


def check_positions(model: Any, longest: int, gen_length: int) -> None:
    max_positions = getattr(model, "max_positions", None)
    if max_positions is not None and longest + gen_length > max_positions:
        raise SettingError("prompt" if longest >= max_positions else "gen_length",
                           f"prompt ({longest} tokens) + gen_length ({gen_length}) = {longest + gen_length} exceeds "
                           f"the model's {max_positions} positions; shorten the prompt or gen_length")


def _cache(cache: Any) -> CachePolicy:
    """``make_cache``, its error naming the field ``cache``: a bad option value inside the cache spec
    (``dual:refresh=0``) is the ``cache`` setting's, whatever option its own check names (the server
    answers with the field as the request's ``param``)."""
    try:
        return make_cache(cache)
    except (ValueError, TypeError, KeyError) as err:
        raise _refield(err, "cache") from None


def _sampler(sampler: Any, options: dict[str, Any], policy: CachePolicy) -> Sampler:
    """``make_sampler``, its error naming the field at fault: the spec (``sampler``), or, when the spec
    alone is fine, the options given apart (the option's own name, else ``sampler_options``). An
    option the cache policy knows (``generate(..., cache="dual", refresh=4)``) is refused with a
    pointer to the cache spec, and ``k`` with a pointer to ``steps``."""
    try:
        return make_sampler(sampler, **options)
    except (ValueError, TypeError, KeyError) as err:
        spec_err = _spec_error(sampler) if options else err  # the spec alone, when options came apart
        if spec_err is not None:
            if "k" in _spec_options(sampler):
                raise _k_error(spec_err) from None
            raise _refield(spec_err, "sampler") from None
        if "k" in options:
            raise _k_error(err) from None
        misplaced = [k for k in options if k in {f.name for f in dataclasses.fields(policy.config)}]
        if misplaced and not isinstance(err, SettingError):  # not an option's own check: an unknown name
            k = misplaced[0]
            cache_options = parse_spec(policy.spec)[1]  # the policy's options that differ from its defaults
            where = (f"cache={policy.spec!r} already sets {k}={cache_options[k]!r}; give it once, in the cache spec"
                     if k in cache_options else
                     f"give it in the cache spec: cache={format_spec(policy.name, {**cache_options, k: options[k]})!r}")
            raise SettingTypeError(k, f"{err}. {k!r} is an option of cache policy {policy.name!r}, not of the "
                                      f"sampler: {where}") from None
        field = err.field if isinstance(err, SettingError) and err.field in options else "sampler_options"
        raise _refield(err, field) from None


def _spec_text(value: Any, make: Any) -> str:
    """A sampler or cache setting as its spec string: a string as given; a mapping or an instance
    through its registry (``Configurable.spec``: the name and the options that differ from the
    defaults)."""
    return value if isinstance(value, str) else make(value).spec


def _spec_error(sampler: Any) -> Optional[BaseException]:
    """The error of the sampler spec alone (None: it is fine)."""
    try:
        make_sampler(sampler)
    except (ValueError, TypeError, KeyError) as err:
        return err
    return None


def _refield(err: BaseException, field: str) -> SettingError:
    out = field_error(field, err)
    return out if out.field == field else type(out)(field, str(out))


def _k_error(err: BaseException) -> SettingTypeError:
    return SettingTypeError("k", f"{err}. 'k' (tokens committed per step) is a setting of `dllm compare` and "
                                 f"`dllm stress`; generate and the server take it as steps = gen_length / k "
                                 f"(generate(..., steps=N), `dllm generate --steps N`)")


def _spec_options(sampler: Any) -> dict:
    try:
        return parse_spec(sampler)[1] if isinstance(sampler, str) else {}
    except (ValueError, TypeError):
        return {}


__all__ = ["CACHE", "DEFAULT_GEN_LENGTH", "SEED_MAX", "TOKENS_PER_STEP", "DecodeSettings", "Resolved",
           "SettingError", "SettingTypeError", "cache_spec", "check_call_seed", "check_positions", "check_seed", "default_gen_length",
           "plan_for", "plan_steps", "steps_for"]
