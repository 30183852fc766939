"""The per-method runners of ``dllm bench spec``: each decodes one prompt at batch 1 into a ``Sample``.

``hf_runner``: transformers' ``target.generate`` (plain, ``assistant_model=``, prompt lookup), the
target's and assistant's forwards counted by ``counting``'s forward pre-hooks; ``loop_runner``: our
``speculative_generate`` with a built drafter; ``make_runner``: the runner of one ``Method``.
"""

from __future__ import annotations

import time
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterator, Optional, Sequence

import torch

from dllm.eval.bench.timing import sync

METHODS: tuple[str, ...] = ("generate", "ar", "dflash", "assisted", "prompt_lookup", "ngram", "dlm")  # the default run
MORE_METHODS: tuple[str, ...] = ("failfast",)  # run when named (--methods dlm,failfast)
MODEL_FLAGS = {"dflash": "--dflash", "assisted": "--assistant", "dlm": "--dlm", "failfast": "--dlm"}  # need a model
PROMPT_LOOKUP_TOKENS = 10


@dataclass(frozen=True)
class Method:
    """One method; ``model`` (name, path or loaded model) for dflash / assisted / dlm / failfast;
    ``options``: drafter options (dlm: sampler, steps; failfast: its Config fields)."""

    name: str
    model: Any = None
    options: dict[str, Any] = field(default_factory=dict)


@dataclass
class Sample:
    """One prompt through one method."""

    generated: list[int]
    target_forwards: int
    drafter_forwards: int
    commits: Optional[list[int]]  # tokens committed per verification round (None: unknown)
    wall_s: float


Runner = Callable[[list[int], float, int, int], Sample]  # (prompt ids, temperature, max new tokens, seed)


@contextmanager
def counting(module: Optional[torch.nn.Module]) -> Iterator[list[Any]]:
    """Records, per forward call of ``module``, where its input starts (a 1-element tensor, an int, or
    None when unreadable); no host sync in the hook. ``module`` None: records nothing."""
    starts: list[Any] = []
    hook = lambda m, a, kw: starts.append(_start(kw))  # noqa: E731
    handle = None if module is None else module.register_forward_pre_hook(hook, with_kwargs=True)
    try:
        yield starts
    finally:
        if handle is not None:
            handle.remove()


def _start(kwargs: dict) -> Any:
    for key in ("position_ids", "cache_position"):
        value = kwargs.get(key)
        if isinstance(value, torch.Tensor) and value.numel():
            return value.reshape(-1)[:1].clone()
    cache = kwargs.get("past_key_values", kwargs.get("cache"))  # transformers >= 5 passes `cache`
    return int(cache.get_seq_length()) if hasattr(cache, "get_seq_length") else None


def commits_from_starts(starts: Sequence[Any], prompt_len: int, generated: int) -> Optional[list[int]]:
    """Tokens committed per forward: forward i + 1 starts at the last token forward i committed (its
    anchor; the prefill's anchor is the last prompt token). None when a start was not readable."""
    anchors = [prompt_len - 1, *(int(s) if s is not None else None for s in starts[1:])]
    if not starts or any(a is None for a in anchors):
        return None
    out = [b - a for a, b in zip(anchors, [*anchors[1:], prompt_len + generated - 1])]
    return out if all(n >= 1 for n in out) else None


def device_of(model: torch.nn.Module) -> torch.device:
    return next(model.parameters()).device


def timed_call(device: torch.device, fn: Callable[[], Any]) -> tuple[Any, float]:
    sync(device)
    t0 = time.perf_counter()
    out = fn()
    sync(device)
    return out, time.perf_counter() - t0


def hf_runner(target, *, assistant=None, **extra: Any) -> Runner:
    """``target.generate`` at batch 1 (``extra``: e.g. prompt_lookup_num_tokens)."""
    device, eos = device_of(target), _eos_ids(target)
    if assistant is not None:
        extra["assistant_model"] = assistant

    def run(prompt: list[int], temperature: float, max_new: int, seed: int) -> Sample:
        ids = torch.tensor([prompt], dtype=torch.long, device=device)
        sampling = dict(do_sample=True, temperature=temperature, top_k=0, top_p=1.0) if temperature > 0 else \
            dict(do_sample=False)
        with counting(target) as starts, counting(assistant) as drafts, torch.inference_mode():
            torch.manual_seed(seed)
            out, wall = timed_call(device, lambda: target.generate(ids, attention_mask=torch.ones_like(ids),
                                                               max_new_tokens=max_new, **sampling, **extra))
        gen = out[0, len(prompt):].tolist()
        gen = next((gen[:i + 1] for i, t in enumerate(gen) if t in eos), gen)  # nothing after the first EOS
        return Sample(gen, len(starts), len(drafts), commits_from_starts(starts, len(prompt), len(gen)), wall)

    return run


def loop_runner(target, drafter, block_size: int, tree: Optional[str] = None) -> Runner:
    """``speculative_generate`` at batch 1 with a built drafter; ``tree``: a tree builder spec (the
    drafts verified as a tree of that builder), None = the chain."""
    from dllm.drafters.loop import speculative_generate
    from dllm.drafters.plan import Plan

    from dllm.models.text.task_tokenizer import task_tokenizer

    device = device_of(target)
    tokenizer = task_tokenizer()  # the prompts are task prompts; a drafter checks its vocabulary against it
    plan = block_size if tree is None else Plan(block_size=block_size, tree=tree)

    def run(prompt: list[int], temperature: float, max_new: int, seed: int) -> Sample:
        out, wall = timed_call(device, lambda: speculative_generate(
            target, drafter, [prompt], max_new_tokens=max_new, temperature=temperature, top_p=1.0, top_k=0,
            plan=plan, seed=seed, tokenizer=tokenizer))
        return Sample(out.generated[0], out.target_forwards, out.drafter_forwards, out.acceptance[0], wall)

    return run


def make_runner(target, method: Method, block_size: int, tree: Optional[str] = None) -> Runner:
    """The runner of one method; loads its model (errors propagate: ``run_bench`` skips the method).
    ``tree``: the drafter methods verify that builder's trees (``ar`` and transformers' never)."""
    from dllm.drafters.base import make_drafter

    name, model = method.name, method.model
    if name in MODEL_FLAGS and model is None:
        raise ValueError(f"method {name!r} needs a model ({MODEL_FLAGS[name]} NAME_OR_PATH)")
    if name in ("generate", "prompt_lookup"):
        return hf_runner(target, **({} if name == "generate" else {"prompt_lookup_num_tokens": PROMPT_LOOKUP_TOKENS}))
    if name == "assisted":
        if isinstance(model, (str, Path)):
            from dllm.models.targets import load_target

            model = load_target(model, device=device_of(target))[0]
        return hf_runner(target, assistant=model)
    if name == "ar":
        return loop_runner(target, make_drafter("ngram"), 1)  # block size 1: the drafter is never asked
    drafter = make_drafter(name, **({"model": model} if model is not None else {}), **method.options)
    return loop_runner(target, drafter, block_size, tree)


def _eos_ids(target) -> set[int]:
    eos = getattr(target.generation_config, "eos_token_id", None)
    eos = getattr(target.config, "eos_token_id", None) if eos is None else eos
    return set() if eos is None else {eos} if isinstance(eos, int) else set(eos)


__all__ = ["METHODS", "MODEL_FLAGS", "MORE_METHODS", "Method", "Runner", "Sample", "commits_from_starts", "counting",
           "hf_runner", "loop_runner", "make_runner"]
