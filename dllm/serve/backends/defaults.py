"""Refusals of a server's default settings (``dllm serve --steps 16 --block-length 8``) that meet a
request's fields: a 400 that names the request field which meets the default and the ``dllm serve``
option the value came from, not a field the request never sent (``DiffusionBackend.resolve_settings``).
Also the map from a ``SettingError``'s field to the request field (``request_param``)."""

from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING, Optional

from dllm.options import SettingError
from dllm.serve.backends.base import BadRequest
from dllm.settings import DecodeSettings

if TYPE_CHECKING:
    from dllm.serve.backends.diffusion import DiffusionBackend


# a SettingError's field -> the request field it came from (the rest: a sampler option's own name)
_PARAMS = {"gen_length": "max_tokens", "sampler": "sampler", "sampler_options": "sampler_options", "cache": "cache",
           "block_length": "block_length", "steps": "steps", "temperature": "temperature", "seed": "seed",
           "prompt": "prompt", "k": "sampler_options"}


def request_param(field: Optional[str], s: DecodeSettings) -> Optional[str]:
    """The request field a refused setting came from: a sampler option given apart from the spec is
    ``sampler_options.NAME``, one inside the sampler spec is ``sampler``."""
    if field in _PARAMS:
        return _PARAMS[field]
    return f"sampler_options.{field}" if field in dict(s.options) else "sampler"


_OPTION = "sampler_options."  # the request field of a sampler option given apart from the spec: _OPTION + its name


def _sent(param: str, given: dict) -> bool:
    """Whether the request sent the field ``param`` (``given``: the fields it sent; ``max_tokens`` and the
    prompt always count as sent)."""
    if param.startswith(_OPTION):
        return param[len(_OPTION):] in (given.get("sampler_options") or {})
    return param in given or param in ("max_tokens", "prompt")


def _value(param: str, s: DecodeSettings):
    """The value of the request field ``param`` in the settings ``s``."""
    return dict(s.options)[param[len(_OPTION):]] if param.startswith(_OPTION) else getattr(s, param)


def fitting_lengths(block_length: int, steps: int, limit: int) -> str:
    """The ``max_tokens`` (up to ``limit``) that a server's default ``steps`` and ``block_length`` fit: one
    block (``resolve_settings`` keeps its steps <= its tokens), or n blocks with n dividing ``steps`` and
    at most ``block_length`` steps a block (``dllm.schedule.plan_blocks``)."""
    fit = [n for n in range(1, min(steps, -(-limit // block_length)) + 1)
           if n == 1 or steps % n == 0 and steps // n <= block_length]
    return ", ".join(f"{(n - 1) * block_length + 1}-{min(n * block_length, limit)}" for n in fit)


def refuse_defaults(backend: "DiffusionBackend", s: DecodeSettings, max_tokens: int, given: dict) -> None:
    """BadRequest when ``generate`` refuses the settings ``s`` over a value the request did not send (a
    server default: ``--steps 16`` with ``max_tokens=24`` in blocks of 8). ``param`` is the request
    field that meets it (the first whose server default would pass, else ``block_length`` or
    ``max_tokens``); the message names the server option and what the request can send instead. A
    refusal of the request's own fields alone is left to ``check`` (with the real prompt)."""
    err = refusal(backend, s, max_tokens)
    if err is None or err.field is None:
        return
    field = request_param(err.field, s)
    blocks = err.field == "steps" and "block_length" not in given and (s.block_length or max_tokens) < max_tokens
    defaults = ([] if _sent(field, given) else [field]) + (["block_length"] if blocks else [])
    if not defaults:
        return
    own = ", ".join(f"{f}={_value(f, s)!r}" for f in defaults)
    whose = "is the server's default" if len(defaults) == 1 else "are the server's defaults"
    flags = " ".join(server_flag(backend.defaults, f) for f in defaults)
    said = f"{own} {whose} (dllm serve {flags}), not this request's"
    if field not in defaults:  # the request's own steps over the server's block length
        raise BadRequest(field, f"{err}; {said}: send block_length with the request too")
    param = next((f for f in given if f != "seed" and refusal(backend, backend._over_defaults(
        max_tokens, {k: v for k, v in given.items() if k != f}), max_tokens) is None),
                 "block_length" if "block_length" in given else "max_tokens")  # both meet the block length
    hint = f"send {field} with the request, or change its {param}"
    if param == "max_tokens" and blocks:
        fit = fitting_lengths(s.block_length, s.steps, backend.max_tokens_limit)
        hint = (f"its max_tokens={max_tokens} makes {-(-max_tokens // s.block_length)} blocks of "
                f"{s.block_length}; send steps with the request, or a max_tokens these defaults fit: {fit}")
    raise BadRequest(param, f"{err}; {said}: {hint}")


def refusal(backend: "DiffusionBackend", s: DecodeSettings, max_tokens: int) -> Optional[SettingError]:
    """The ``SettingError`` of ``s`` for ``max_tokens`` on a one-token prompt, None when it passes. A
    block-causal model's plan depends on where the prompt ends in its block: its steps are left to
    ``check``."""
    try:
        dataclasses.replace(s, seed=None).resolve(backend.model, [[0]], max_tokens)  # a seed meets nothing
    except SettingError as err:
        return None if err.field == "steps" and backend.block_size is not None else err
    return None


def server_flag(defaults: DecodeSettings, param: str) -> str:
    """The ``dllm serve`` option that sets the default of the request field ``param``."""
    options = dict(defaults.options)
    if param.startswith("sampler_options"):  # one option, or all of them
        return " ".join(f"-o {k}={v}" for k, v in options.items() if param in ("sampler_options", _OPTION + k))
    return f"--{param.replace('_', '-')} {getattr(defaults, param)}"
