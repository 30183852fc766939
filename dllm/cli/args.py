"""Argument types and flag sets shared by the ``dllm`` commands' parsers (argparse only: no torch).

Ranges are argparse errors (``argument --n: must be an integer >= 1, got 0``, exit status 2), found
before a command loads anything.
"""

from __future__ import annotations

import argparse
from typing import Any, Optional

from dllm.flags import (POSITIVE, at_least, output_dir, output_file, output_png,  # noqa: F401 (re-exported)
                        read_json_object)
from dllm.registry import parse_option


def option(text: str) -> tuple[str, Any]:
    """``-o NAME=VALUE``: one option, values read as in a spec string (``dllm.registry.parse_option``)."""
    try:
        return parse_option(text, "sampler option")
    except ValueError as err:
        raise argparse.ArgumentTypeError(str(err)) from None


def option_dict(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    """The ``-o NAME=VALUE`` flags as keywords; ValueError for a name given twice (the earlier value
    would be dropped without a word)."""
    out: dict[str, Any] = {}
    for name, value in pairs:
        if name in out and out[name] != value:
            raise ValueError(f"-o {name} given twice ({name}={out[name]!r} and {name}={value!r}); give it once")
        out[name] = value
    return out


def call_cost_tokens(text: str) -> Any:
    """An argparse type: ``auto`` or an integer >= 0 (``BatcherConfig.call_cost_tokens``)."""
    if text == "auto":
        return text
    try:
        return at_least(0)(text)
    except argparse.ArgumentTypeError:
        raise argparse.ArgumentTypeError(f"must be auto or an integer >= 0, got {text!r}") from None


def no_options(p: argparse.ArgumentParser) -> None:
    """The flags of a command that takes none (``--help`` only)."""


def add_threads(p: argparse.ArgumentParser, note: str = "default: torch's choice") -> None:
    """``--threads N``: set by the registry before the command runs (``dllm.cli.registry.set_threads``)."""
    p.add_argument("--threads", type=POSITIVE, default=None, help=f"torch CPU threads ({note})")


def block_size(text: str) -> Any:
    """An argparse type: ``--block-size``, a positive int or ``auto`` (the drafter's block head)."""
    return text if text == "auto" else POSITIVE(text)


def flag_plan(size: Any, tree: Optional[str]) -> Any:
    """``--block-size`` and ``--tree`` as ``speculative_generate``'s ``plan=``: ``"auto"`` (each prompt's
    plan from the drafter's block head, which picks the tree too: ValueError with ``--tree``), else a
    ``Plan`` (None: the drafter's block size; the chain)."""
    if size == "auto":
        if tree is not None:
            raise ValueError("--block-size auto (the drafter's block head) picks each prompt's tree itself; drop "
                             "--tree, or give an int --block-size with it")
        return "auto"
    from dllm.drafters.plan import Plan

    return Plan(block_size=size, tree=tree)


def add_model_place(p: argparse.ArgumentParser, dtype: str | None = None) -> None:
    """``--dtype`` and ``--device`` of the model a command loads."""
    p.add_argument("--dtype", default=dtype,
                   help=f"float32, bfloat16, float16 or auto (default: {dtype or 'the checkpoint' + chr(39) + 's torch_dtype'})")
    p.add_argument("--device", default=None, help="cpu, cuda or cuda:N (default: cpu)")


QUANTIZATION_CHOICES = ("int8", "int4", "nf4")  # dllm.models.quantize.QUANTIZATIONS (not imported: torch-free)


def add_quantization(p: argparse.ArgumentParser) -> None:
    """``--quantization``: weight-only quantization of the loaded model (``dllm.load(quantization=)``)."""
    p.add_argument("--quantization", choices=QUANTIZATION_CHOICES, default=None,
                   help="weight-only quantization of the model's linear layers (torchao int8/int4, "
                        "bitsandbytes nf4; extra `quant`); default: none")


def add_decode_args(p: argparse.ArgumentParser, gen_length: Optional[int] = None) -> None:
    """The settings of one ``dllm.generate`` call: sampler, lengths, temperature, cache, options.
    ``gen_length``: the command's default (None: the model's, as ``dllm.generate``)."""
    p.add_argument("--sampler", default="low_confidence",
                   help="sampler spec: a registered name (see `dllm samplers`), options allowed "
                        "(threshold:threshold=0.8)")
    p.add_argument("--gen-length", type=int, default=gen_length,
                   help=f"generated positions (default: {gen_length})" if gen_length is not None else
                   "generated positions (default: the model's: for a task model and a task prompt its answer "
                   "length, as it was trained; else 128)")
    p.add_argument("--block-length", type=int, default=None, help="default: gen-length (one block)")
    p.add_argument("--steps", type=int, default=None, help="default: gen-length (one token per step)")
    p.add_argument("--temperature", type=float, default=0.0, help="0 = greedy proposals (default: 0)")
    p.add_argument("--cfg-scale", type=float, default=0.0,
                   help="classifier-free guidance scale, LLaDA's (default: 0, off)")
    p.add_argument("--seed", type=int, default=None, help="seed of the call's random draws (default: none)")
    p.add_argument("--option", "-o", action="append", type=option, default=[],
                   metavar="NAME=VALUE", help="sampler option, repeatable (e.g. -o top_p=0.95)")
    p.add_argument("--cache", default="none", metavar="SPEC",
                   help="cache policy spec: none, prefix, dual, window, with options (dual:refresh=4)")
    add_threads(p)
