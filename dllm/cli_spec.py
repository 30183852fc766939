"""``dllm spec``: lossless speculative decoding of an autoregressive target with a registered drafter.

Kept beside ``cli.py`` (which adds it with ``add_spec_command``) so that the command file stays
small; it imports nothing of ``cli.py``: the shared argparse helpers come in as arguments.
"""

from __future__ import annotations

import argparse
import json
import sys
from typing import Callable


def add_spec_command(sub, positive: Callable[[str], int], add_threads: Callable[[argparse.ArgumentParser], None]) -> None:
    """Add ``dllm spec`` to the ``dllm`` subparsers ``sub``."""
    sp = sub.add_parser("spec", help="lossless speculative decoding: an autoregressive target, a drafter")
    sp.add_argument("--target", required=True, help="transformers causal LM: local dir, hub id, or embedded name")
    sp.add_argument("--drafter", default="ngram", help="drafter spec (see `dllm drafters`): ngram:max_ngram=3, "
                                                       "dlm:model=tiny-llada, dflash:model=DIR")
    sp.add_argument("--prompt", required=True, nargs="+", action="extend",
                    help="one or more prompts (token ids '5 6 7' for a target without a tokenizer); words the "
                         "tokenizer does not know (a literal '...' with a word-level one) are an error")
    sp.add_argument("--max-new-tokens", type=positive, default=64,
                    help="most tokens per prompt; the prompt plus this must fit the target's positions")
    sp.add_argument("--block-size", type=lambda v: v if v == "auto" else positive(v), default=None,
                    help="the plan's block size: tokens per verification forward (default: the drafter's), or "
                         "'auto': each prompt's plan (block size, chain or tree) picked by the drafter's block "
                         "head (dflash:model=tiny-ar-dflash-wide)")
    sp.add_argument("--temperature", type=float, default=0.0)
    sp.add_argument("--top-p", type=float, default=1.0)
    sp.add_argument("--top-k", type=int, default=0)
    sp.add_argument("--seed", type=int, default=None)
    sp.add_argument("--tree", default=None, help="verify draft trees: a tree builder spec (chain, ddtree:budget=64, "
                                                 "taps:budget=32,cost_per_node=0.01); needs a drafter with distributions")
    sp.add_argument("--stop", nargs="+", action="extend", default=None, help="stop strings")
    sp.add_argument("--dtype", default=None)
    sp.add_argument("--device", default=None)
    sp.add_argument("--json", action="store_true", help="print one JSON object (texts, ids, statistics)")
    add_threads(sp)
    sp.set_defaults(func=cmd_spec)


def cmd_spec(args) -> int:
    from dllm.drafters.base import make_drafter
    from dllm.drafters.loading import load_target, resolve_target
    from dllm.drafters.loop import speculative_generate

    if args.threads is not None:
        import torch

        torch.set_num_threads(args.threads)
    found = resolve_target(args.target)  # a bad target fails here, before a drafter model loads
    drafter = make_drafter(args.drafter)
    target, tok = load_target(found, dtype=args.dtype, device=args.device)
    prompts: list = args.prompt
    if tok is None:  # no tokenizer: prompts are token ids, texts are ids
        try:
            prompts = [[int(t) for t in p.split()] for p in args.prompt]
        except ValueError:
            raise ValueError(f"target {args.target!r} ships no tokenizer; give each --prompt as token ids "
                             f"separated by spaces ('5 6 7')") from None
    out = speculative_generate(target, drafter, prompts, max_new_tokens=args.max_new_tokens,
                               temperature=args.temperature, top_p=args.top_p, top_k=args.top_k,
                               block_size=args.block_size, stop=args.stop or None, seed=args.seed, tokenizer=tok,
                               tree=args.tree)
    texts = out.texts if out.texts is not None else [" ".join(map(str, g)) for g in out.generated]
    stats = {**out.summary(), "accepted_per_round": round(max(out.tau - 1, 0.0), 4),
             "acceptance_by_position": [round(a, 4) for a in out.acceptance_by_position()]}
    if args.json:
        print(json.dumps({"target": args.target, "drafter": args.drafter, "texts": texts, "generated": out.generated,
                          "stop_reasons": out.stop_reasons, "acceptance": out.acceptance,
                          "row_block_sizes": out.row_block_sizes, "row_trees": out.row_trees, **stats}))
        return 0
    for j, text in enumerate(texts):
        print(text if len(texts) == 1 else f"[{j}] {text}")
    print(f"tau {stats['tau']} (mean accepted drafts per round {stats['accepted_per_round']}, block size "
          f"{out.block_size if out.row_block_sizes is None else out.row_block_sizes}) | target forwards "
          f"{out.target_forwards}, drafter forwards {out.drafter_forwards} | "
          f"{out.generated_tokens} tokens in {stats['wall_time_s']} s, {stats['tokens_per_second']} tokens/s",
          file=sys.stderr)
    return 0


__all__ = ["add_spec_command", "cmd_spec"]
