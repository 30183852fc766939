"""The settings of the lm-eval model ``dllm`` (``model_args``) and their validation.

``split_model_args`` separates the harness's own keys (``HarnessConfig``) from the sampler's
options: every other key must be a field of the chosen sampler's Config, and an unknown key is an
error that lists both the harness keys and the sampler's options.

lm-eval splits ``model_args`` at every comma, so a cache policy with several options is written
either with semicolons between them, ``cache=dual:look_back=16;look_ahead=16``, or as one key per
option, ``cache=dual,cache_look_back=16,cache_look_ahead=16`` (``cache_<option>``); a sampler's
options are keys of their own (``sampler=threshold,threshold=0.8``). ``HarnessConfig`` is lm-eval's
flat key namespace, not a second way to say how to decode: ``decode_setting`` turns its decode keys
into the one ``dllm.settings.DecodeSettings`` the model decodes with, checked by the same code as
``dllm.generate``; an option given twice (in the sampler spec and as a key, or in the cache spec and
as ``cache_<option>``) is an error.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any, Optional

from dllm.options import check_bool, check_int, check_number, check_optional_int

IGNORED_KEYS = ("max_batch_size",)  # passed by lm-eval's evaluator; batches here are fixed
CACHE_PREFIX = "cache_"  # ``cache_<option>=value``: one option of the cache policy


def default_device() -> str:
    """``cuda`` when a GPU is visible, else ``cpu``."""
    import torch

    return "cuda" if torch.cuda.is_available() else "cpu"


@dataclass(frozen=True)
class HarnessConfig:
    pretrained: str  # embedded name (tiny-llada), local directory, Hub id, or "oracle"
    sampler: str = "low_confidence"  # registered sampler or spec "name:key=value"; options may also be keys
    cache: str = "none"  # cache policy spec ("dual", "dual:refresh=4", "dual:look_back=16;look_ahead=16")
    gen_length: int = 256  # generated positions; a request's max_gen_toks lowers it
    block_length: Optional[int] = None  # semi-autoregressive blocks (None: one block of gen_length)
    tokens_per_step: Optional[int] = None  # k for fixed-step samplers (None: one token per step)
    stop_at_eos: bool = False  # finish rows after the block where their answer ended (upstream: False)
    temperature: float = 0.0  # default when a request gives none; do_sample=false forces 0
    cfg_scale: float = 0.0  # LLaDA classifier-free guidance, generation and likelihood
    mc_num: int = 128  # Monte-Carlo samples per loglikelihood request (upstream: 128; 1 for one token)
    check_greedy: bool = True  # loglikelihood's is_greedy by one greedy decode (False: always False)
    batch_size: int = 8  # rows per generate call; likelihood: copies per forward (largest divisor of mc_num <= it)
    seed: int = 0  # likelihood draws (per request) and sampled decoding
    dtype: str = "auto"  # float32 / bfloat16 / float16 / auto (the checkpoint's)
    device: Optional[str] = None  # None: cuda if visible else cpu; under accelerate: the process's device
    attn_backend: str = "auto"
    add_bos_token: bool = True  # prepend BOS to prompts that do not start with it (LLaDA's tokenizer does)
    max_length: Optional[int] = None  # prompt + generation / context + continuation (None: the model's)

    def __post_init__(self) -> None:
        if not isinstance(self.pretrained, str) or not self.pretrained:
            raise ValueError(f"model_args pretrained must name a model (an embedded name such as "
                             f"tiny-llada, a directory or a Hub id), got {self.pretrained!r}")
        for name in ("sampler", "cache", "dtype", "attn_backend"):
            if not isinstance(getattr(self, name), str):
                raise ValueError(f"model_args {name} must be a string, got {getattr(self, name)!r}")
        check_int("gen_length", self.gen_length, 1)
        check_optional_int("block_length", self.block_length, 1)
        check_optional_int("tokens_per_step", self.tokens_per_step, 1)
        check_optional_int("max_length", self.max_length, 2)
        check_int("mc_num", self.mc_num, 1)
        check_int("batch_size", self.batch_size, 1, hint=" ('auto' is not supported)")
        check_int("seed", self.seed, 0)
        check_number("temperature", self.temperature, low=0.0, finite=True)
        check_number("cfg_scale", self.cfg_scale, low=0.0, finite=True)
        for name in ("stop_at_eos", "check_greedy", "add_bos_token"):
            check_bool(name, getattr(self, name))


HARNESS_KEYS: tuple[str, ...] = tuple(f.name for f in dataclasses.fields(HarnessConfig))


def _coerce(key: str, value: Any) -> Any:
    """lm-eval's ``--batch_size 8`` arrives as the string "8"; floats like 0 for temperature are fine."""
    if key == "batch_size" and isinstance(value, str) and value.strip().isdigit():
        return int(value)
    if key in ("temperature", "cfg_scale") and isinstance(value, int) and not isinstance(value, bool):
        return float(value)
    return value


def _with_cache_keys(cache: str, keys: dict[str, Any]) -> str:
    """``cache`` (semicolons allowed between its options) with the ``cache_<option>`` keys added:
    ``("dual", {"cache_look_back": 16})`` -> ``"dual:look_back=16"``. ValueError for an option set twice."""
    from dllm.registry import format_spec, parse_spec
    from dllm.settings import cache_spec

    try:
        name, options = parse_spec(cache_spec(cache), "cache policy")
    except ValueError as err:
        raise ValueError(f"model_args cache={cache!r}: {err}") from None
    extra = {k[len(CACHE_PREFIX):]: v for k, v in keys.items()}
    twice = sorted(set(extra) & set(options))
    if twice:
        raise ValueError(f"model_args: cache option(s) {twice} set twice (in cache={cache!r} and as "
                         f"{', '.join(CACHE_PREFIX + k for k in twice)}); give each once")
    return format_spec(name, {**options, **extra}) if extra else cache_spec(cache)


def split_model_args(model_args: dict[str, Any]) -> tuple[HarnessConfig, dict[str, Any]]:
    """(HarnessConfig, sampler options) from lm-eval's model_args, both validated; the config's
    ``cache`` is the whole cache spec (``cache_<option>`` keys and semicolons folded in).

    Raises ValueError for an unknown sampler or cache name (listing the valid ones), for a key that
    is neither a harness key nor an option of the sampler (listing both), and for bad values."""
    from dllm.samplers import samplers

    args = {k: _coerce(k, v) for k, v in model_args.items() if k not in IGNORED_KEYS}
    own = {k: v for k, v in args.items() if k in HARNESS_KEYS}
    cache_keys = {k: v for k, v in args.items() if k.startswith(CACHE_PREFIX) and k not in HARNESS_KEYS}
    extra = {k: v for k, v in args.items() if k not in HARNESS_KEYS and k not in cache_keys}
    if "pretrained" not in own:
        raise ValueError("model_args needs pretrained=NAME (e.g. pretrained=tiny-llada)")
    config = HarnessConfig(**own)
    config = dataclasses.replace(config, cache=_with_cache_keys(config.cache, cache_keys))
    try:
        setting = decode_setting(config, {})
        cls = samplers.get(setting.name)
    except (KeyError, ValueError) as err:
        raise ValueError(f"model_args sampler={config.sampler!r}: {err}") from None
    valid = [f.name for f in dataclasses.fields(cls.Config)]
    unknown = sorted(set(extra) - set(valid))
    if unknown:
        raise ValueError(
            f"unknown model_args key(s) {', '.join(map(repr, unknown))}. Valid keys: {', '.join(HARNESS_KEYS)}, "
            f"{CACHE_PREFIX}<option> (an option of the cache policy); and the options of sampler {setting.name!r}: "
            f"{', '.join(valid) if valid else '(none)'}"
        )
    try:
        setting = decode_setting(config, extra)
        setting.check()
    except (KeyError, TypeError, ValueError) as err:
        raise ValueError(f"model_args: {err}") from None
    return config, extra


def decode_setting(config: HarnessConfig, sampler_options: dict[str, Any]):
    """The ``DecodeSettings`` of ``config`` plus the sampler options given as keys (``split_model_args``):
    ValueError for an option the sampler spec sets too, or a k in the spec beside ``tokens_per_step``."""
    from dllm.settings import DecodeSettings

    setting = DecodeSettings.parse(config.sampler, k=config.tokens_per_step,
                                   cache=None if config.cache == "none" else config.cache,
                                   block_length=config.block_length, kind="model_args sampler")
    twice = sorted(set(sampler_options) & set(setting.sampler_options))
    if twice:
        raise ValueError(f"model_args sets {twice} twice (in sampler={config.sampler!r} and as keys); give each once")
    return DecodeSettings.of(**{**{f.name: getattr(setting, f.name) for f in dataclasses.fields(setting)},
                                "options": {**setting.sampler_options, **sampler_options},
                                "temperature": config.temperature, "cfg_scale": config.cfg_scale, "seed": config.seed})


__all__ = ["CACHE_PREFIX", "default_device", "HARNESS_KEYS", "HarnessConfig", "decode_setting", "split_model_args"]
