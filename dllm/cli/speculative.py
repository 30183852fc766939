"""``dllm spec``: lossless speculative decoding of an autoregressive target with a registered drafter
(``spec_args(parser)`` its flags, ``run_spec(args)`` the run; its row is in ``dllm.cli.table``)."""

from __future__ import annotations

import argparse
import json
import sys

from dllm.cli.args import POSITIVE, add_threads, block_size, flag_plan


def spec_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--target", required=True, help="transformers causal LM: local dir, hub id, or embedded name")
    p.add_argument("--drafter", default="ngram", help="drafter spec (see `dllm drafters`): ngram:max_ngram=3, "
                                                      "dlm:model=tiny-llada, dflash:model=DIR")
    p.add_argument("--prompt", required=True, nargs="+", action="extend",
                   help="one or more prompts (token ids '5 6 7' for a target without a tokenizer); words the "
                        "tokenizer does not know (a literal '...' with a word-level one) are an error")
    p.add_argument("--max-new-tokens", type=POSITIVE, default=64,
                   help="most tokens per prompt; the prompt plus this must fit the target's positions")
    p.add_argument("--block-size", type=block_size, default=None,
                   help="the plan's block size: tokens per verification forward (default: the drafter's), or "
                        "'auto': each prompt's plan (block size, chain or tree) picked by the drafter's block "
                        "head (dflash:model=tiny-ar-dflash-wide)")
    p.add_argument("--temperature", type=float, default=0.0, help="0 = greedy (default: 0); > 0: exact sampling")
    p.add_argument("--top-p", type=float, default=1.0, help="nucleus filter of the sampled distribution (default: 1.0, off)")
    p.add_argument("--top-k", type=int, default=0, help="top-k filter of the sampled distribution (default: 0, off)")
    p.add_argument("--seed", type=int, default=None, help="seed of the random draws (default: none)")
    p.add_argument("--tree", default=None, help="verify draft trees: a tree builder spec (chain, ddtree:budget=64, "
                                                "taps:budget=32,cost_per_node=0.01); needs a drafter with distributions")
    p.add_argument("--stop", nargs="+", action="extend", default=None, help="stop strings")
    p.add_argument("--dtype", default=None, help="float32, bfloat16 or float16 (default: the checkpoint's)")
    p.add_argument("--device", default=None, help="cpu, cuda or cuda:N (default: cpu)")
    p.add_argument("--json", action="store_true", help="print one JSON object (texts, ids, statistics)")
    add_threads(p)


def run_spec(args: argparse.Namespace) -> int:
    from dllm.drafters.base import make_drafter
    from dllm.models.targets import load_target, resolve_target
    from dllm.drafters.loop import speculative_generate

    plan = flag_plan(args.block_size, args.tree)
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
                               temperature=args.temperature, top_p=args.top_p, top_k=args.top_k, plan=plan,
                               stop=args.stop or None, seed=args.seed, tokenizer=tok)
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
    print(f"tau {stats['tau']} tokens per verification round (mean accepted drafts per round "
          f"{stats['accepted_per_round']}, block size "
          f"{out.block_size if out.row_block_sizes is None else out.row_block_sizes}) | target forwards "
          f"{out.target_forwards}, drafter forwards {out.drafter_forwards} | "
          f"{out.generated_tokens} tokens in {stats['wall_time_s']} s, {stats['tokens_per_second']} tokens/s",
          file=sys.stderr)
    return 0


__all__ = ["run_spec", "spec_args"]
