"""The request bodies of ``/v1/completions`` and ``/v1/chat/completions``, validated before anything
reaches a backend.

Fields are OpenAI's (https://platform.openai.com/docs/api-reference/completions/create and
.../chat/create) plus dllm's own, read from the same JSON object (the ``openai`` client sends them with
``extra_body=``): ``sampler``, ``cache`` (spec strings), ``block_length``, ``steps``, ``sampler_options``
(an object of the sampler's Config fields) and ``dllm_events`` (per-step events when streaming).

OpenAI's nullable fields take null as their default (``"n": null`` is ``n = 1``; the ``openai`` client
sends ``n=None`` so).

Every refusal is an ``ApiError`` 400 whose ``param`` names the field ("max_tokens",
"messages[1].content", "sampler_options.threshold"): malformed JSON, a wrong type, a value out of
range, an unknown field (the message lists the valid ones), an OpenAI feature dllm does not implement
at a non-neutral value (``logprobs``, ``echo``, penalties ...), ``stream_options`` or ``dllm_events``
without ``stream: true``, text that is not Unicode text (a lone UTF-16 surrogate from a ``\\ud800``
escape), a diffusion field sent to a speculative server. The backend's own ``check`` (sampler, cache
and options against the registries, max_tokens against the limit, prompt + max_tokens against the
positions) runs after this, in ``dllm.serve.http.app``.
"""

from __future__ import annotations

import json
import typing
from typing import Any, Optional, Sequence, Union

from pydantic import BaseModel, ConfigDict, Field, ValidationError, ValidationInfo, field_validator

from dllm.serve.http.errors import ApiError, bad_request, clip, quote

MAX_N = 16  # choices per prompt
MAX_CHOICES = 64  # prompts x n per request (n <= MAX_N alone never reaches it: too many prompts do)
MAX_STOP = 16  # stop strings per request
ROLES = ("system", "developer", "user", "assistant", "tool")
DIFFUSION_FIELDS = ("sampler", "cache", "block_length", "steps", "sampler_options", "dllm_events")


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True, allow_inf_nan=False)

    @field_validator("n", "stream", "echo", "dllm_events", mode="before", check_fields=False)
    @classmethod
    def _null_is_default(cls, value: Any, info: ValidationInfo) -> Any:
        """OpenAI's ``n``, ``stream`` and ``echo`` are "integer or null" / "boolean or null" (the ``openai``
        client sends ``n=None`` as ``"n": null``): null means the field's default."""
        return cls.model_fields[info.field_name].default if value is None else value


class StreamOptions(_Strict):
    include_usage: bool = False  # one last chunk with ``usage`` and no choices


class _Common(_Strict):
    """The fields both endpoints take."""

    model: str
    max_tokens: Optional[int] = Field(default=None, ge=1)
    temperature: Optional[float] = Field(default=None, ge=0.0, le=2.0)
    top_p: Optional[float] = Field(default=None, gt=0.0, le=1.0)
    top_k: Optional[int] = Field(default=None, ge=0)  # vLLM's extension; 0 = off
    seed: Optional[int] = Field(default=None, ge=-(2 ** 63), lt=2 ** 64)
    stop: Any = None  # str or list of str: ``stop_strings``
    n: int = Field(default=1, ge=1, le=MAX_N)
    stream: bool = False
    stream_options: Optional[StreamOptions] = None
    user: Optional[str] = None  # accepted, unused
    presence_penalty: Optional[float] = None  # only 0
    frequency_penalty: Optional[float] = None  # only 0
    logit_bias: Optional[dict[str, float]] = None  # only empty
    # dllm's own (diffusion servers only)
    sampler: Optional[str] = None
    cache: Optional[str] = None
    block_length: Optional[int] = Field(default=None, ge=1)
    steps: Optional[int] = Field(default=None, ge=1)
    sampler_options: Any = None  # {name: number | string | bool | null}: ``check_sampler_options``
    dllm_events: bool = False


class CompletionBody(_Common):
    prompt: Any  # str, [str], [int] or [[int]]: ``prompts``
    echo: bool = False  # only false
    logprobs: Optional[int] = None  # only null (the backends compute no token log-probabilities)
    best_of: Optional[int] = None  # only null or n
    suffix: Optional[str] = None  # only null


class ChatBody(_Common):
    messages: Any  # [{"role", "content", "name"?}]: ``chat_messages``
    max_completion_tokens: Optional[int] = Field(default=None, ge=1)
    logprobs: Optional[bool] = None  # only false
    top_logprobs: Optional[int] = None  # only null


Body = Union[CompletionBody, ChatBody]


# ---- parsing ----

def _reject_constant(name: str) -> Any:
    raise ValueError(f"{name} is not a JSON number")


def parse_json(raw: bytes) -> dict[str, Any]:
    """The body as a JSON object; 400 for bytes that are not UTF-8 JSON (NaN/Infinity included)."""
    try:
        data = json.loads(raw.decode("utf-8"), parse_constant=_reject_constant)
    except UnicodeDecodeError as err:
        raise bad_request(None, f"the request body is not UTF-8 ({err.reason} at byte {err.start})",
                          code="invalid_json") from None
    except ValueError as err:
        raise bad_request(None, f"the request body is not valid JSON: {err}", code="invalid_json") from None
    except RecursionError:
        raise bad_request(None, "the request body nests too deeply to be a request", code="invalid_json") from None
    if not isinstance(data, dict):
        raise bad_request(None, f"the request body must be a JSON object, got {type(data).__name__}",
                          code="invalid_json")
    return data


def param_path(loc: Sequence[Union[str, int]]) -> str:
    """A pydantic location as OpenAI names a field: ("messages", 0, "content") -> "messages[0].content"."""
    out = ""
    for part in loc:
        out += f"[{part}]" if isinstance(part, int) else (f".{part}" if out else str(part))
    return out


def _short(value: Any, limit: int = 80) -> str:
    return quote(value, limit)


def _nested_model(model: type[BaseModel], loc: Sequence[Union[str, int]]) -> Optional[type[BaseModel]]:
    """The model class at ``loc`` inside ``model`` (through Optional fields), None if it is not one."""
    for part in loc:
        field = model.model_fields.get(part) if isinstance(part, str) else None
        if field is None:
            return None
        kinds = [t for t in (field.annotation, *typing.get_args(field.annotation))
                 if isinstance(t, type) and issubclass(t, BaseModel)]
        if not kinds:
            return None
        model = kinds[0]
    return model


def from_validation_error(err: ValidationError, model: type[BaseModel]) -> ApiError:
    """The first pydantic error as a 400 naming its field, what was given and what is valid."""
    first = err.errors()[0]
    loc = first["loc"]
    param = clip(param_path(loc))  # an unknown field's name, a logit_bias key: the client's input
    if first["type"] == "extra_forbidden":
        where = _nested_model(model, loc[:-1])
        valid = f"; valid fields: {', '.join(where.model_fields)}" if where is not None else ""
        return bad_request(param, f"unknown field {quote(param)}{valid}", code="unknown_field")
    if first["type"] == "missing":
        return bad_request(param, f"{param!r} is required", code="missing_field")
    if first["type"] in ("model_type", "dict_type"):
        return bad_request(param, f"{param} must be a JSON object, got {_short(first.get('input'))}")
    return bad_request(param, f"{param}: {first['msg'].lower()}, got {_short(first.get('input'))}")


def parse_body(raw: bytes, model: type[BaseModel]) -> Any:
    """``raw`` parsed and validated as ``model`` (``CompletionBody`` or ``ChatBody``)."""
    data = parse_json(raw)
    try:
        body = model.model_validate(data)
    except ValidationError as err:
        raise from_validation_error(err, model) from None
    _check_unsupported(body)
    check_stream_fields(body)
    check_sampler_options(body.sampler_options)
    return body


def check_stream_fields(body: Any) -> None:
    """``stream_options`` and ``dllm_events`` shape a streamed reply: refused without ``stream: true``
    (as OpenAI refuses ``stream_options``)."""
    if body.stream:
        return
    if body.stream_options is not None:
        raise bad_request("stream_options", "stream_options is only allowed with stream=true; leave it out or "
                                            "set stream to true")
    if body.dllm_events:
        raise bad_request("dllm_events", "dllm_events=true needs stream=true (the events are SSE events)")


def check_text(text: str, param: str) -> str:
    """``text`` if it is Unicode text a tokenizer can take; 400 naming ``param`` when it holds a lone
    UTF-16 surrogate (JSON's ``"\\ud800"`` escape without its pair), which is no character at all."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as err:
        raise bad_request(param, f"{param} is not valid text: a lone UTF-16 surrogate "
                                 f"({ascii(text[err.start])[1:-1]}, without its pair) at character {err.start}; "
                                 f"send the character itself or its escaped surrogate pair") from None
    return text


def check_sampler_options(options: Any) -> None:
    """``sampler_options``: null or an object of scalar values (the sampler's Config checks names and
    ranges: the backend's check)."""
    if options is None:
        return
    if not isinstance(options, dict):
        raise bad_request("sampler_options", f"sampler_options must be an object of the sampler's options "
                                             f"({{\"threshold\": 0.8}}), got {_short(options)}")
    for name, value in options.items():
        if not (value is None or isinstance(value, (bool, int, float, str))):
            at = f"sampler_options.{clip(name)}"
            raise bad_request(at, f"{at} must be a number, string, boolean or null, got {_short(value)}")


NO_LOGPROBS = "the backends compute no token log-probabilities"
NEUTRAL = {"presence_penalty": ((None, 0, 0.0), ""), "frequency_penalty": ((None, 0, 0.0), ""),
           "logit_bias": ((None, {}), ""), "echo": ((False,), ""), "suffix": ((None,), ""),
           "top_logprobs": ((None,), NO_LOGPROBS)}  # field: (the values accepted, why no other)


def _is_one_of(value: Any, accepted: Sequence[Any]) -> bool:
    """``value`` equals one of ``accepted`` with the same type (``0`` is not ``false`` here)."""
    return any(type(value) is type(v) and value == v for v in accepted)


def _check_unsupported(body: Body) -> None:
    """OpenAI fields dllm accepts only at their neutral value. ``logprobs``: null (chat: or false);
    completions' ``logprobs: 0`` asks for the sampled tokens' log-probabilities, which dllm does not
    compute, so it is refused like any other number."""
    logprobs = (None, False) if isinstance(body, ChatBody) else (None,)
    for name, (ok, why) in {**NEUTRAL, "logprobs": (logprobs, NO_LOGPROBS)}.items():
        value = getattr(body, name, None)
        if name in type(body).model_fields and not _is_one_of(value, ok):
            because = f": {why}" if why else ""
            raise bad_request(name, f"{name}={_short(value)} is not supported by dllm serve{because} "
                                    f"(accepted: {' or '.join(json.dumps(v) for v in ok)})", code="unsupported")
    best_of = getattr(body, "best_of", None)
    if best_of is not None and best_of != body.n:
        raise bad_request("best_of", f"best_of={best_of} is not supported by dllm serve (accepted: null or n={body.n})",
                          code="unsupported")


# ---- the fields typed by hand (unions whose pydantic errors would not name the field clearly) ----

def stop_strings(stop: Any) -> tuple[str, ...]:
    """``stop``: null, a string, or a list of up to MAX_STOP non-empty strings."""
    if stop is None:
        return ()
    items = [stop] if isinstance(stop, str) else stop
    if not isinstance(items, list) or not all(isinstance(s, str) for s in items):
        raise bad_request("stop", f"stop must be a string or a list of strings, got {_short(stop)}")
    if len(items) > MAX_STOP:
        raise bad_request("stop", f"stop takes at most {MAX_STOP} strings, got {len(items)}")
    if any(s == "" for s in items):
        raise bad_request("stop", "stop strings must not be empty")
    return tuple(items)


def _is_int(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def prompts(prompt: Any) -> list[Union[str, list[int]]]:
    """``prompt``: a string, a list of strings, a list of token ids, or a list of token-id lists."""
    what = "a string, a list of strings, a list of token ids or a list of token-id lists"
    if isinstance(prompt, str):
        return [check_text(prompt, "prompt")]
    if not isinstance(prompt, list) or not prompt:
        raise bad_request("prompt", f"prompt must be {what}, got {_short(prompt)}")
    if all(isinstance(p, str) for p in prompt):
        return [check_text(p, f"prompt[{i}]") for i, p in enumerate(prompt)]
    if all(_is_int(t) for t in prompt):
        return [list(prompt)]
    if all(isinstance(p, list) and p and all(_is_int(t) for t in p) for p in prompt):
        return [list(p) for p in prompt]
    raise bad_request("prompt", f"prompt must be {what} (no mixing, no empty lists), got {_short(prompt)}")


def chat_messages(messages: Any) -> list[dict[str, str]]:
    """``messages``: a non-empty list of {"role", "content", "name"?}; content a string or a list of
    text parts ({"type": "text", "text": ...}, joined). Returns [{"role", "content"}]."""
    if not isinstance(messages, list) or not messages:
        raise bad_request("messages", f"messages must be a non-empty list of objects, got {_short(messages)}")
    out = []
    for i, m in enumerate(messages):
        at = f"messages[{i}]"
        if not isinstance(m, dict):
            raise bad_request(at, f"{at} must be an object with 'role' and 'content', got {_short(m)}")
        unknown = sorted(set(m) - {"role", "content", "name"})
        if unknown:
            raise bad_request(f"{at}.{clip(unknown[0])}", f"unknown field {quote(unknown[0])} in {at}; valid: role, "
                                                          f"content, name (dllm serve has no tools or images)",
                              code="unknown_field")
        role = m.get("role")
        if role not in ROLES:
            raise bad_request(f"{at}.role", f"{at}.role must be one of {', '.join(ROLES)}, got {_short(role)}")
        if "name" in m and not isinstance(m["name"], str):
            raise bad_request(f"{at}.name", f"{at}.name must be a string, got {_short(m['name'])}")
        out.append({"role": role, "content": _content(m.get("content"), f"{at}.content")})
    return out


def _content(content: Any, at: str) -> str:
    if isinstance(content, str):
        return check_text(content, at)
    if isinstance(content, list) and content:
        texts = []
        for j, part in enumerate(content):
            if not (isinstance(part, dict) and part.get("type") == "text" and isinstance(part.get("text"), str)
                    and set(part) <= {"type", "text"}):
                raise bad_request(f"{at}[{j}]", f"{at}[{j}] must be {{'type': 'text', 'text': str}} (dllm serve "
                                                f"takes text only), got {_short(part)}")
            texts.append(check_text(part["text"], f"{at}[{j}].text"))
        return "".join(texts)
    raise bad_request(at, f"{at} must be a string or a non-empty list of text parts, got {_short(content)}")


__all__ = ["Body", "ChatBody", "CompletionBody", "DIFFUSION_FIELDS", "MAX_CHOICES", "MAX_N", "StreamOptions",
           "chat_messages", "check_sampler_options", "check_stream_fields", "check_text", "from_validation_error",
           "param_path", "parse_body", "parse_json", "prompts", "stop_strings"]
