"""``dllm bench throughput``: forward and generate throughput of one model, side by side.

Prints one table: the model's plain forward over the full canvas (tokens/s), and a ``generate``
call with the chosen sampler (NFE, forwarded tokens, tokens per forward, generated tokens/s,
wall time, peak memory of the ``generate`` runs). Median over ``--repeats`` runs after one warm-up
(``dllm.eval.bench.timing``).
"""

from __future__ import annotations

import json
from pathlib import Path

import torch

from dllm.eval.bench.caches import bench_prompt
from dllm.eval.bench.timing import timed


def run_throughput(args) -> dict:
    from dllm.engine import generate
    from dllm.models import load

    model = load(args.model, dtype=args.dtype, device=args.device)
    device = next(model.parameters()).device
    prompt = bench_prompt(model, args.batch_size, args.prompt_length)
    length = args.prompt_length + args.gen_length
    canvas = torch.cat([prompt, torch.full((args.batch_size, args.gen_length), model.mask_id)], 1).to(device)

    with torch.inference_mode():
        fwd = timed(lambda: model(canvas), device, repeats=args.repeats, warmup=1).seconds
    kwargs = dict(sampler=args.sampler, gen_length=args.gen_length, block_length=args.block_length,
                  steps=args.steps, temperature=args.temperature, cfg_scale=args.cfg_scale,
                  seed=args.seed, cache=args.cache, **dict(args.option))
    run = timed(lambda: generate(model, prompt, **kwargs), device, repeats=args.repeats, warmup=1)
    out = run.result
    result = {
        "model": args.model, "family": model.family, "device": str(device),
        "dtype": str(model.dtype).replace("torch.", ""), "threads": torch.get_num_threads(),
        "parameters": sum(p.numel() for p in model.parameters()),
        "batch_size": args.batch_size, "prompt_length": args.prompt_length,
        "gen_length": args.gen_length, "sampler": args.sampler, "cache": args.cache,
        "forward_ms": round(fwd * 1e3, 3),
        "forward_tokens_per_s": round(args.batch_size * length / fwd, 1),
        **out.summary(),
        "ms_per_step": round(out.wall_time / max(out.steps, 1) * 1e3, 3),
        "peak_memory_mb": None if run.peak_mb is None else round(run.peak_mb, 1),
    }
    width = max(map(len, result))
    for k, v in result.items():
        print(f"{k:<{width}}  {v}")
    if args.json:
        Path(args.json).parent.mkdir(parents=True, exist_ok=True)
        with open(args.json, "w") as f:
            json.dump(result, f, indent=2)
    return result
