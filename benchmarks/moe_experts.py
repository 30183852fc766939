"""Expert explosion: distinct experts a MoE forward activates vs the tokens it routes and commits.

    python benchmarks/moe_experts.py [--prompts 20] [--out benchmarks/results/moe-experts.md]

A random LLaDA 2 MoE model with LLaDA2.0-mini's routing (256 experts in 8 groups, 4 groups kept,
top-8, one shared expert; ``dllm.models.families.llada2.tiny_llada2`` at toy width) forwards T tokens of a
block (T = tokens decided per step: 1 is autoregressive decoding, 32 a whole block); for each T the
mean distinct experts per MoE layer per forward (``dllm.models.core.layer.moe.count_experts``) is reported
beside what uniform routing would give, ``E (1 - (1 - K/E)^T)``. Per committed token the expert
weights read fall from K to distinct/T, while the weights a step reads grow with T: the "expert
explosion" of parallel decoding. A second table decodes with the exact block cache at k committed
tokens per step: every step forwards the block, so experts per step stay near the block's count while
the forwards fall by k, and the expert weights read per committed token fall with them. Random weights
route more uniformly than a trained model, so these counts are an upper end; the statistic is what
``count_experts`` gives on a real checkpoint.
"""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Optional, Sequence

import torch

from dllm.models.families.llada2 import tiny_llada2
from dllm.models.core.layer.moe import MoEConfig, count_experts

MINI_ROUTING = MoEConfig(n_experts=256, top_k=8, expert_hidden=8, n_shared=1, n_group=8, topk_group=4,
                         routed_scaling=2.5, first_dense=1)


def main(argv: Optional[Sequence[str]] = None) -> str:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--prompts", type=int, default=20)
    ap.add_argument("--out", default="benchmarks/results/moe-experts.md")
    args = ap.parse_args(argv)
    torch.set_num_threads(1)
    model = tiny_llada2(seed=0, moe=MINI_ROUTING, block_size=32)
    e, k = MINI_ROUTING.n_experts, MINI_ROUTING.top_k
    gen = torch.Generator().manual_seed(0)
    lines = ["# Experts activated per forward vs tokens routed (LLaDA2.0-mini routing, random weights)", "",
             f"`python benchmarks/moe_experts.py --prompts {args.prompts}`: for each T, {args.prompts} forwards "
             f"of T random tokens (one block); 256 experts, top-8, 8 groups of which 4 kept; mean over the 2 "
             f"MoE layers and the forwards.", "",
             "| tokens per forward T | distinct experts per layer | uniform routing | experts per token |",
             "|---:|---:|---:|---:|"]
    for t in (1, 2, 4, 8, 16, 32):
        with torch.no_grad(), count_experts(model) as counter:
            for _ in range(args.prompts):
                model(torch.randint(0, 94, (1, t), generator=gen))
        d = counter.mean_distinct()
        lines.append(f"| {t} | {d:.1f} | {e * (1 - (1 - k / e) ** t):.1f} | {d / t:.2f} |")
    lines += ["", "## During decoding: committed tokens per step", "",
              f"`dllm.generate` of 64 tokens (two blocks of 32) after a 32-token prompt, `cache=\"block\"` (each step "
              f"forwards the current block), `low_confidence` committing k tokens per step; {args.prompts} prompts. "
              f"Rows routed include each block's first forward (prompt + block). The block's masked rows hold one "
              f"token and route alike, so a forward's distinct experts grow with the tokens committed in its "
              f"block, not with its rows alone.",
              "", "| tokens per step k | forwards | rows routed per forward | distinct experts per layer | "
              "experts per committed token |", "|---:|---:|---:|---:|---:|"]
    import dllm

    for k_step in (1, 2, 4, 8, 16, 32):
        with torch.no_grad(), count_experts(model) as counter:
            for _ in range(args.prompts):
                dllm.generate(model, [torch.randint(0, 94, (32,), generator=gen).tolist()], gen_length=64,
                              block_length=32, steps=64 // k_step, sampler="low_confidence", cache="block")
        f = counter.forwards() / args.prompts
        lines.append(f"| {k_step} | {f:.1f} | {counter.mean_tokens():.1f} | {counter.mean_distinct():.1f} | "
                     f"{counter.mean_distinct() * f / 64:.2f} |")
    text = "\n".join(lines) + "\n"
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(text)
    print(text)
    return text


if __name__ == "__main__":
    main()
