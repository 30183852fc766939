"""A validated request body -> the backend's ``JobRequest``s (one per prompt and choice).

Fields the body leaves out take the server's defaults (``backend.resolve_settings``: the ``dllm serve``
flags), not OpenAI's: ``temperature`` defaults to the server's (0, greedy, unless ``--temperature``
says otherwise), ``max_tokens`` to ``default_max_tokens``. ``top_p`` / ``top_k`` of a diffusion request are
the sampler's options of those names (the ``dream`` sampler has them); 1.0 / 0 mean "off" and are
dropped, so a client that always sends ``top_p=1`` works with every sampler.

``seed`` takes OpenAI's range (a signed or unsigned 64-bit integer) as ``torch.Generator.manual_seed``
does: a negative seed is its two's complement, ``seed % 2**64``; with ``n > 1`` choice j draws with
``(seed + j) % 2**64``, so the choices differ yet reproduce, whatever the seed.

A ``model`` other than the served one is 404 ``model_not_found`` (as OpenAI's and vLLM's); a prompt
the backend cannot encode is 400 naming ``prompt`` (chat: ``messages``), in dllm's words whatever the
tokenizer raised.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Callable, Union

from dllm.serve.backends.base import Backend, BadRequest
from dllm.serve.http.errors import ApiError, bad_request, quote
from dllm.serve.backends.jobs import JobRequest, Settings, SpeculativeSettings
from dllm.settings import DecodeSettings
from dllm.serve.http.protocol import (DIFFUSION_FIELDS, MAX_CHOICES, Body, ChatBody, chat_messages, prompts,
                                 stop_strings)


def check_model(body: Body, backend: Backend) -> None:
    """404 ``model_not_found`` unless ``model`` names the served model."""
    if body.model != backend.model_name:
        raise ApiError(404, f"unknown model {quote(body.model)}; this server serves {backend.model_name!r} "
                            f"(GET /v1/models)", param="model", code="model_not_found")


def requested_max_tokens(body: Body, default: int) -> int:
    """``max_tokens`` (or chat's ``max_completion_tokens``; both given must agree), else ``default``."""
    given = body.max_tokens
    other = getattr(body, "max_completion_tokens", None)
    if given is not None and other is not None and given != other:
        raise bad_request("max_completion_tokens", f"max_tokens={given} and max_completion_tokens={other} "
                                                   f"disagree; give one")
    value = given if given is not None else other
    return value if value is not None else default


def _sampler_fields(spec: str) -> Union[dict[str, Any], None]:
    """The options of the sampler ``spec`` names, each with its default (None when the sampler is not
    registered: the backend's check reports that)."""
    from dllm.registry import parse_spec
    from dllm.samplers import samplers

    try:
        name, _ = parse_spec(spec, "sampler")
        cls = samplers.get(name)
    except (KeyError, ValueError, TypeError):
        return None
    return {f.name: f.default for f in dataclasses.fields(cls.Config)}


NUCLEUS_OFF = {"top_p": 1.0, "top_k": 0}  # the OpenAI fields' values that mean "off"


def samplers_with(option: str) -> list[str]:
    """The registered samplers that have ``option``."""
    from dllm.samplers import samplers

    return [e.name for e in samplers if option in {f.name for f in dataclasses.fields(e.obj.Config)}]


def _spec_options(spec: str) -> dict[str, Any]:
    """The options the sampler spec ``spec`` sets itself (``"entropy:top_p=0.9"`` -> {"top_p": 0.9}); {}
    for a spec that does not parse (the backend's check reports that)."""
    from dllm.registry import parse_spec

    try:
        return parse_spec(spec, "sampler")[1]
    except (KeyError, ValueError, TypeError):
        return {}


def sampler_options(body: Body, sampler: str) -> dict[str, Any]:
    """``sampler_options`` plus ``top_p`` / ``top_k`` as the options of those names. Their "off" values
    (1.0 / 0) given by the client turn the option off for a sampler that has it (top_p = 1.0; top_k =
    the option's default, which is off), over the server's defaults; a sampler without it ignores them.
    A sampler spec that sets the option itself (``"entropy:top_p=0.9"``, the request's or the server's
    default) keeps its value: the "off" value is dropped, another value is refused naming the field."""
    options: dict[str, Any] = dict(body.sampler_options or {})
    in_spec = _spec_options(sampler)
    for name, value in (("top_p", body.top_p), ("top_k", body.top_k)):
        if value is None:
            continue
        if name in in_spec:
            if value != NUCLEUS_OFF[name] and value != in_spec[name]:
                whose = "the request's" if body.sampler is not None else "the server's default"
                raise bad_request(name, f"{name}={value} and {whose} sampler {quote(sampler)} (which sets "
                                        f"{name}={in_spec[name]}) disagree; give {name} once")
            continue
        fields = _sampler_fields(sampler)
        if value == NUCLEUS_OFF[name]:
            if fields is not None and name in fields and name not in options:
                options[name] = 1.0 if name == "top_p" else fields[name]
            continue
        if fields is not None and name not in fields:
            raise bad_request(name, f"{name}={value}: sampler {quote(sampler)} has no {name} option (samplers with "
                                    f"one: {', '.join(samplers_with(name))}); leave {name} out or pick such a sampler")
        if name in options and options[name] != value:
            raise bad_request(name, f"{name}={value} and sampler_options.{name}={options[name]} disagree; give one")
        options[name] = value
    return options


def diffusion_settings(body: Body, backend: Backend, max_tokens: int) -> DecodeSettings:
    """The request's decode settings over the server's defaults (``backend.resolve_settings``: the
    defaults' sampler options apply only when the request keeps the default sampler)."""
    sampler = body.sampler if body.sampler is not None else backend.defaults.sampler
    return backend.resolve_settings(max_tokens=max_tokens, sampler=body.sampler, cache=body.cache,
                                    block_length=body.block_length, steps=body.steps, temperature=body.temperature,
                                    seed=body.seed, options=sampler_options(body, sampler))


def speculative_settings(body: Body, backend: Backend, max_tokens: int) -> SpeculativeSettings:
    """A speculative request's settings; the diffusion fields are refused by name."""
    for name in DIFFUSION_FIELDS:
        if name in body.model_fields_set and getattr(body, name) not in (None, False):
            raise bad_request(name, f"{name!r} is a diffusion setting; this server runs an autoregressive target "
                                    f"with speculative decoding (fields: temperature, top_p, top_k, seed)")
    return backend.resolve_settings(max_tokens=max_tokens, temperature=body.temperature, top_p=body.top_p,
                                    top_k=body.top_k, seed=body.seed)


def settings(body: Body, backend: Backend, max_tokens: int) -> Settings:
    make = speculative_settings if backend.kind == "speculative" else diffusion_settings
    return make(body, backend, max_tokens)


def encoded(encode: Callable[[], tuple[int, ...]], param: str, what: str) -> tuple[int, ...]:
    """``encode()``: the backend's refusal (BadRequest) as a 400 naming ``param``; anything else the
    tokenizer raises as a 400 in dllm's words (its own text may be an internal detail)."""
    try:
        return encode()
    except BadRequest as err:
        raise bad_request(param, str(err)) from None
    except Exception as err:  # noqa: BLE001 - a tokenizer's own failure on this input
        raise bad_request(param, f"the model's tokenizer cannot encode {what} (it raised {type(err).__name__}); "
                                 f"send plain text or token ids") from None


def prompt_ids(body: Body, backend: Backend) -> list[tuple[int, ...]]:
    """The token ids of each prompt (chat: one, through the chat template); refused before any is
    encoded when the prompts x ``n`` pass MAX_CHOICES."""
    if isinstance(body, ChatBody):
        messages = chat_messages(body.messages)
        return [encoded(lambda: backend.encode_chat(messages), "messages", "these messages")]
    given = prompts(body.prompt)
    if len(given) * body.n > MAX_CHOICES:
        raise bad_request("prompt", f"{len(given)} prompts x n={body.n} = {len(given) * body.n} choices; at most "
                                    f"{MAX_CHOICES} per request (send fewer prompts per request)")
    return [encoded(lambda: backend.encode_prompt(p), "prompt" if len(given) == 1 else f"prompt[{i}]",
                    "this prompt") for i, p in enumerate(given)]


SEED_RANGE = 2 ** 64  # torch.Generator's seeds: [0, 2**64)


def choice_seed(seed: int, j: int) -> int:
    """The seed of choice ``j`` of a request seeded with ``seed`` (in [-2**63, 2**64)): ``(seed + j) % 2**64``,
    torch.Generator.manual_seed's reading of a negative seed (two's complement)."""
    return (seed + j) % SEED_RANGE


def check(backend: Backend, request: JobRequest, body: Body) -> None:
    """``backend.check``: a ``BadRequest`` whose ``param`` the backend took from the refused setting's
    field (``sampler_options.threshold`` for an option the request gave in ``sampler_options``)."""
    backend.check(request)


def job_requests(body: Body, backend: Backend, *, default_max_tokens: int) -> list[JobRequest]:
    """One ``JobRequest`` per choice (prompt-major: choice index = prompt index * n + j), each checked
    by the backend, so a request is refused whole before any of it is queued."""
    check_model(body, backend)
    limit = requested_max_tokens(body, default_max_tokens)
    chosen = settings(body, backend, limit)
    stop = stop_strings(body.stop)
    ids = prompt_ids(body, backend)
    queue = backend.stats().max_queue
    if len(ids) * body.n > queue:  # never fits the queue at once: a 429's "retry later" would never succeed
        param = "n" if len(ids) == 1 else "prompt"
        raise bad_request(param, f"{len(ids)} prompt(s) x n={body.n} = {len(ids) * body.n} choices, more than this "
                                 f"server's queue holds ({queue}); send at most {queue} choices per request")
    requests = []
    for p in ids:
        for j in range(body.n):
            # choice j draws with seed + j (module docstring), wrapped into the generator's range
            s = chosen if chosen.seed is None else dataclasses.replace(chosen, seed=choice_seed(chosen.seed, j))
            req = JobRequest(prompt_ids=tuple(p), max_tokens=limit, settings=s, stop=stop,
                             step_events=bool(body.stream and getattr(body, "dllm_events", False)),
                             stream=bool(body.stream))
            check(backend, req, body)
            requests.append(req)
    return requests


__all__ = ["SEED_RANGE", "check_model", "choice_seed", "diffusion_settings", "encoded", "sampler_options",
           "job_requests", "requested_max_tokens", "prompt_ids", "settings", "speculative_settings"]
