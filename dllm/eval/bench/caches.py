"""Cache-policy benchmark: one ``generate`` per (policy, sampler) on the same prompt, side by side.

``run_cache_bench`` returns one dict per (policy, sampler) with

- ``policy``, ``sampler``: the cache policy's and the sampler's spec strings (``dual:refresh=4``,
  ``threshold:threshold=0.7``);
- ``wall_s``: median wall time of ``generate`` over ``repeats`` runs (after one warm-up run when
  ``warmup``), device-synchronised;
- ``nfe``, ``forwarded_tokens`` (rows x query length summed over forwards: the honest compute
  count), ``generated_tokens``, ``tokens_per_s`` (generated tokens / wall), ``tokens_per_forward``;
- ``peak_memory_mb``: the peak memory of the timed runs (``dllm.eval.bench.timing.peak_memory_mb``:
  CUDA allocations, or the process's peak resident set on CPU; None where it cannot be reset);
- ``kv_cache_mb``: size of the policy's K/V buffers (0 for ``none``);
- ``speedup``: wall time of ``none`` with the same sampler / this wall time (when ``none`` is run);
- ``match_none``: fraction of generated tokens equal to ``none``'s output with the same sampler
  (1.0 = no drift; the block-approximate caches are expected to drift a little).

``format_table(rows)`` renders the rows as a Markdown table.
"""

from __future__ import annotations

from typing import Any, Optional, Sequence

import torch

from dllm.cache import make_cache
from dllm.eval.bench.timing import timed
from dllm.registry import format_spec, parse_spec
from dllm.samplers import make_sampler


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
    samplers: Sequence[str] = ("low_confidence", "threshold"),
    policies: Sequence[Any] = ("none", "prefix", "dual", "window"),
    *,
    batch_size: int = 1,
    steps: Optional[int] = None,
    repeats: int = 1,
    warmup: bool = True,
    seed: int = 0,
    progress: bool = False,
    results: Optional[list[dict[str, Any]]] = None,
) -> list[dict[str, Any]]:
    """Decode the same random prompt with every (policy, sampler); one result dict per pair, appended
    to ``results`` as each run ends (a caller's list keeps the finished runs on Ctrl-C).

    samplers: sampler specs ("low_confidence", "threshold:threshold=0.7").
    policies: anything ``generate(cache=...)`` takes ("dual", "dual:refresh=4", a policy instance).
    steps: fixed-step samplers' total steps (default gen_len: one token per step).
    progress: a tqdm bar over the (policy, sampler) pairs, on stderr.
    """
    from tqdm.auto import tqdm

    from dllm.engine import generate

    device = next(model.parameters()).device
    prompt = bench_prompt(model, batch_size, prompt_len, seed).to(device)
    length = prompt_len + gen_len
    specs = [format_spec(*parse_spec(s, "sampler")) for s in samplers]  # normalised labels
    fixed = {spec: make_sampler(spec).fixed_steps for spec in specs}  # every spec checked before any run
    made = sorted((make_cache(p) for p in policies), key=lambda p: p.spec != "none")  # "none" first
    results = [] if results is None else results
    reference: dict[str, tuple[torch.Tensor, float]] = {}  # sampler spec -> (none's tokens, wall)
    bar = tqdm(total=len(specs) * len(made), disable=not progress, desc="bench caches", unit="run")
    for spec in specs:
        for policy in made:
            bar.set_postfix_str(f"{policy.spec} x {spec}")
            kw = dict(sampler=spec, gen_length=gen_len, block_length=block, cache=policy)
            if steps is not None and fixed[spec]:
                kw["steps"] = steps
            t = timed(lambda: generate(model, prompt, **kw), device, repeats=repeats, warmup=int(warmup))
            out, wall = t.result, t.seconds
            cfg = model.config
            kv_bytes = 0
            if policy.uses_kv:
                kv_bytes = (2 * cfg.n_layers * batch_size * cfg.n_kv_heads * length * cfg.head_dim
                            * torch.finfo(model.dtype).bits // 8)
            gen = out.generated.cpu()
            if policy.spec == "none":
                reference[spec] = (gen, wall)
            row: dict[str, Any] = {
                "policy": policy.spec,
                "sampler": spec,
                "wall_s": round(wall, 4),
                "nfe": out.nfe,
                "forwarded_tokens": out.forwarded_tokens,
                "generated_tokens": out.generated_tokens,
                "tokens_per_s": round(out.generated_tokens / wall, 2),
                "tokens_per_forward": round(out.tokens_per_forward, 3),
                "peak_memory_mb": None if t.peak_mb is None else round(t.peak_mb, 1),
                "kv_cache_mb": round(kv_bytes / 2**20, 2),
                "speedup": None,
                "match_none": None,
            }
            if spec in reference:
                ref_gen, ref_wall = reference[spec]
                row["speedup"] = round(ref_wall / wall, 2)
                row["match_none"] = round(float((gen == ref_gen).float().mean()), 4)
            results.append(row)
            bar.update(1)
    bar.close()
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
