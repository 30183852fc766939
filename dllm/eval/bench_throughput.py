"""``dllm bench throughput``: forward and generate throughput of one model, side by side.

Prints one table: the model's plain forward over the full canvas (tokens/s), and a ``generate``
call with the chosen sampler (NFE, forwarded tokens, tokens per forward, generated tokens/s,
wall time, peak memory). Median over ``--repeats`` runs after one warm-up.
"""

from __future__ import annotations

import json
import resource
import statistics
import time

import torch


def _peak_memory_mb(device: torch.device) -> float:
    if device.type == "cuda":
        return torch.cuda.max_memory_allocated(device) / 2**20
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # process peak RSS (Linux: KiB)


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def run_throughput(args) -> dict:
    from dllm.engine import generate
    from dllm.models import load

    if args.threads is not None:
        torch.set_num_threads(args.threads)
    model = load(args.model, dtype=args.dtype, device=args.device)
    device = next(model.parameters()).device
    vocab = model.config.vocab_size
    special = set(filter(lambda t: t is not None, (model.mask_id, model.eos_id, model.eot_id,
                                                   model.pad_id, model.bos_id)))
    ordinary = [t for t in range(vocab) if t not in special][:50]
    g = torch.Generator().manual_seed(0)
    prompt = torch.tensor(ordinary)[torch.randint(len(ordinary), (args.batch_size, args.prompt_length), generator=g)]
    length = args.prompt_length + args.gen_length
    canvas = torch.cat([prompt, torch.full((args.batch_size, args.gen_length), model.mask_id)], 1).to(device)

    fwd_times = []
    with torch.inference_mode():
        model(canvas)  # warm-up
        for _ in range(args.repeats):
            _sync(device)
            t0 = time.perf_counter()
            model(canvas)
            _sync(device)
            fwd_times.append(time.perf_counter() - t0)
    fwd = statistics.median(fwd_times)

    kwargs = dict(sampler=args.sampler, gen_length=args.gen_length, block_length=args.block_length,
                  steps=args.steps, temperature=args.temperature, cfg_scale=args.cfg_scale,
                  seed=args.seed, **dict(args.option))
    generate(model, prompt, **kwargs)  # warm-up
    outs = [generate(model, prompt, **kwargs) for _ in range(args.repeats)]
    out = sorted(outs, key=lambda o: o.wall_time)[len(outs) // 2]
    result = {
        "model": args.model, "family": model.family, "device": str(device),
        "dtype": str(model.dtype).replace("torch.", ""), "threads": torch.get_num_threads(),
        "parameters": sum(p.numel() for p in model.parameters()),
        "batch_size": args.batch_size, "prompt_length": args.prompt_length,
        "gen_length": args.gen_length, "sampler": args.sampler,
        "forward_ms": round(fwd * 1e3, 3),
        "forward_tokens_per_s": round(args.batch_size * length / fwd, 1),
        **out.summary(),
        "ms_per_step": round(out.wall_time / max(out.steps, 1) * 1e3, 3),
        "peak_memory_mb": round(_peak_memory_mb(device), 1),
    }
    width = max(map(len, result))
    for k, v in result.items():
        print(f"{k:<{width}}  {v}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(result, f, indent=2)
    return result
