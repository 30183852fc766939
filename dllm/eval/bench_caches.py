"""Cache-policy benchmark: one ``generate`` per (policy, sampler) on the same prompt, side by side.

``run_cache_bench`` returns one dict per (policy, sampler) with

- ``wall_s``: median wall time of ``generate`` over ``repeats`` runs (after one warm-up run when
  ``warmup``), device-synchronised;
- ``nfe``, ``forwarded_tokens`` (rows x query length summed over forwards: the honest compute
  count), ``generated_tokens``, ``tokens_per_s`` (generated tokens / wall), ``tokens_per_forward``;
- ``peak_memory_mb``: CUDA: ``max_memory_allocated`` during the run (stats reset before it). CPU:
  the process's peak resident set during the run (``VmHWM`` after resetting it through
  ``/proc/self/clear_refs``; it includes the model and the interpreter; None where Linux does not
  allow the reset);
- ``kv_cache_mb``: size of the policy's K/V buffers (0 for ``none``);
- ``speedup``: wall time of ``none`` with the same sampler / this wall time (when ``none`` is run);
- ``match_none``: fraction of generated tokens equal to ``none``'s output with the same sampler
  (1.0 = no drift; the block-approximate caches are expected to drift a little).

``format_table(rows)`` renders the rows as a Markdown table.
"""

from __future__ import annotations

import dataclasses
import statistics
import time
from typing import Any, Optional, Sequence, Union

import torch

from dllm.cache.base import CacheSpec, make_cache
from dllm.samplers import make_sampler

SamplerSpec = Union[str, tuple[str, dict[str, Any]]]


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _reset_peak(device: torch.device) -> bool:
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)
        return True
    try:
        with open("/proc/self/clear_refs", "w") as f:  # "5" resets the peak RSS (Linux >= 4.0)
            f.write("5")
        return True
    except OSError:
        return False


def _peak_mb(device: torch.device) -> Optional[float]:
    if device.type == "cuda":
        return torch.cuda.max_memory_allocated(device) / 2**20
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) / 1024  # kB -> MiB
    except OSError:
        pass
    return None


def _label(cache: CacheSpec) -> str:
    if isinstance(cache, str):
        return cache
    policy = make_cache(cache)
    options = {k: v for k, v in dataclasses.asdict(policy.config).items() if v not in (None, 0)}
    return policy.name + (":" + ",".join(f"{k}={v}" for k, v in options.items()) if options else "")


def bench_prompt(model, batch_size: int, prompt_len: int, seed: int = 0) -> torch.Tensor:
    """[batch_size, prompt_len] ids drawn from the model's ordinary (non-special) tokens."""
    special = {t for t in (model.mask_id, model.eos_id, getattr(model, "eot_id", None), model.pad_id,
                           getattr(model, "bos_id", None)) if t is not None}
    ordinary = torch.tensor([t for t in range(min(model.config.vocab_size, 4096)) if t not in special])
    g = torch.Generator().manual_seed(seed)
    return ordinary[torch.randint(len(ordinary), (batch_size, prompt_len), generator=g)]


def run_cache_bench(
    model,
    prompt_len: int,
    gen_len: int,
    block: int,
    samplers: Sequence[SamplerSpec] = ("low_confidence", "threshold"),
    policies: Sequence[CacheSpec] = ("none", "prefix", "dual", "window"),
    *,
    batch_size: int = 1,
    steps: Optional[int] = None,
    repeats: int = 1,
    warmup: bool = True,
    seed: int = 0,
) -> list[dict[str, Any]]:
    """Decode the same random prompt with every (policy, sampler); one result dict per pair.

    samplers: names, or (name, options) pairs such as ("threshold", {"threshold": 0.7}).
    policies: anything ``generate(cache=...)`` takes ("dual", "dual:refresh=4", a policy instance).
    steps: fixed-step samplers' total steps (default gen_len: one token per step).
    """
    from dllm.engine import generate

    device = next(model.parameters()).device
    prompt = bench_prompt(model, batch_size, prompt_len, seed).to(device)
    length = prompt_len + gen_len
    results: list[dict[str, Any]] = []
    reference: dict[str, tuple[torch.Tensor, float]] = {}  # sampler label -> (none's tokens, wall)
    ordered = sorted(policies, key=lambda p: _label(p) != "none")  # run "none" first
    for sampler in samplers:
        name, options = (sampler, {}) if isinstance(sampler, str) else sampler
        sampler_label = name + "".join(f",{k}={v}" for k, v in options.items())
        for cache in ordered:
            policy = make_cache(cache)
            kw = dict(sampler=name, gen_length=gen_len, block_length=block, cache=policy, **options)
            if steps is not None and make_sampler(name, **options).fixed_steps:
                kw["steps"] = steps
            if warmup:
                generate(model, prompt, **kw)
            walls, out, peak = [], None, None
            for _ in range(max(1, repeats)):
                _sync(device)
                can_peak = _reset_peak(device)
                t0 = time.perf_counter()
                out = generate(model, prompt, **kw)
                _sync(device)
                walls.append(time.perf_counter() - t0)
                peak = _peak_mb(device) if can_peak else None
            assert out is not None
            wall = statistics.median(walls)
            cfg = model.config
            kv_bytes = 0
            if policy.uses_kv:
                kv_bytes = (2 * cfg.n_layers * batch_size * cfg.n_kv_heads * length * cfg.head_dim
                            * torch.finfo(model.dtype).bits // 8)
            label = _label(cache)
            gen = out.generated.cpu()
            if label == "none":
                reference[sampler_label] = (gen, wall)
            row: dict[str, Any] = {
                "policy": label,
                "sampler": sampler_label,
                "wall_s": round(wall, 4),
                "nfe": out.nfe,
                "forwarded_tokens": out.forwarded_tokens,
                "generated_tokens": out.generated_tokens,
                "tokens_per_s": round(out.generated_tokens / wall, 2),
                "tokens_per_forward": round(out.tokens_per_forward, 3),
                "peak_memory_mb": None if peak is None else round(peak, 1),
                "kv_cache_mb": round(kv_bytes / 2**20, 2),
                "speedup": None,
                "match_none": None,
            }
            if sampler_label in reference:
                ref_gen, ref_wall = reference[sampler_label]
                row["speedup"] = round(ref_wall / wall, 2)
                row["match_none"] = round(float((gen == ref_gen).float().mean()), 4)
            results.append(row)
    return results


COLUMNS = ("policy", "sampler", "wall_s", "speedup", "nfe", "forwarded_tokens", "tokens_per_s",
           "tokens_per_forward", "peak_memory_mb", "kv_cache_mb", "match_none")


def format_table(rows: Sequence[dict[str, Any]], columns: Sequence[str] = COLUMNS) -> str:
    """Markdown table of ``run_cache_bench`` rows."""
    head = "| " + " | ".join(columns) + " |"
    rule = "|" + "|".join("---" for _ in columns) + "|"
    body = ["| " + " | ".join("" if r.get(c) is None else str(r.get(c)) for c in columns) + " |" for r in rows]
    return "\n".join([head, rule, *body])


__all__ = ["run_cache_bench", "format_table", "bench_prompt"]
