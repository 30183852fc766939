"""Host syncs per decode step issued from sampler code (``dllm/samplers/``), for every registered sampler.

Counts every read of a device value by the host (``dllm.eval.bench.counters``) over a grid of
settings -- tiny llada and dream models, batch 1 and a ragged batch of 2 (left padded), caches
``none`` and ``dual``, temperature 0 and 1 (seeded; greedy-only samplers at 0 only) -- and prints,
per sampler and temperature, the most syncs in sampler code in one step and the mean per step
(over every step of every setting), with their sites.

    python benchmarks/host_syncs.py            # markdown table (docs/results/host-syncs.md)
    python benchmarks/host_syncs.py --sites    # also every sync site of sampler code
"""

from __future__ import annotations

import argparse
from collections import Counter
from typing import Any, Iterator

import torch

import dllm
from dllm.eval.bench.counters import count_generate
from dllm.models.tiny import tiny
from dllm.samplers import samplers

SAMPLER_DIR = "dllm/samplers/"
FAMILIES = ("llada", "dream")
CACHES = ("none", "dual")
TEMPERATURES = (0.0, 1.0)
GEN_LENGTH, BLOCK_LENGTH = 16, 8


def prompts_of(batch: int) -> list[list[int]]:
    """Batch 1: one prompt of 6 tokens; batch 2: 6 and 3 tokens (ragged: left padded)."""
    g = torch.Generator().manual_seed(0)
    lengths = (6,) if batch == 1 else (6, 3)
    return [torch.randint(10, 40, (n,), generator=g).tolist() for n in lengths]


def sampler_names() -> list[str]:
    """Every registered sampler (aliases left out)."""
    return sorted(n for n, _ in dllm.list_samplers())


def in_sampler_code(site: str) -> bool:
    """Whether a ``kind @ path:line`` sync site lies in ``dllm/samplers/``."""
    return f"@ {SAMPLER_DIR}" in site


def settings(name: str) -> Iterator[dict[str, Any]]:
    """The generate() settings a sampler is counted under (greedy-only samplers at T = 0 only)."""
    greedy = samplers.get(name).greedy_only
    for family in FAMILIES:
        for cache in CACHES:
            for batch in (1, 2):
                for temperature in TEMPERATURES:
                    if greedy and temperature > 0:
                        continue
                    yield dict(family=family, cache=cache, batch=batch, temperature=temperature)


_MODELS: dict[str, Any] = {}


def model_of(family: str) -> Any:
    if family not in _MODELS:
        _MODELS[family] = tiny(family, d_model=64, n_heads=4, n_kv_heads=2, mlp_hidden=128)
    return _MODELS[family]


def sampler_syncs(name: str, family: str, cache: str, batch: int, temperature: float) -> list[list[str]]:
    """The sampler-code sync sites of every step of one run (one list per step)."""
    counter = count_generate(model_of(family), prompts_of(batch), sampler=name, gen_length=GEN_LENGTH,
                             block_length=BLOCK_LENGTH, cache=cache, temperature=temperature, seed=0)
    return [[s for s in step.syncs if in_sampler_code(s)] for step in counter.steps]


def measure(name: str) -> dict[str, Any]:
    """Over every setting: per temperature the most sampler-code syncs in one step and the mean per
    step (None where the sampler is greedy only), and every site with its count."""
    steps: dict[float, list[list[str]]] = {t: [] for t in TEMPERATURES}
    for s in settings(name):
        steps[s["temperature"]] += sampler_syncs(name, **s)
    out: dict[str, Any] = {"sites": Counter(x for per in steps.values() for step in per for x in step)}
    for t, per in steps.items():
        out[t] = None if not per else (max(len(x) for x in per), sum(len(x) for x in per) / len(per))
    return out


def short_sites(sites: Counter) -> str:
    """``kind @ dllm/samplers/file:line`` -> ``file:line (kind)``, most frequent first."""
    out = []
    for site, _ in sites.most_common():
        kind, where = site.split(" @ ")
        out.append(f"{where.replace(SAMPLER_DIR, '')} ({kind})")
    return ", ".join(out) or "-"


def cell(value: Any) -> str:
    """``max / mean`` of one temperature, or ``greedy only``."""
    return "greedy only" if value is None else f"{value[0]} / {value[1]:.2f}"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sites", action="store_true", help="also print every sampler-code sync site")
    parser.add_argument("samplers", nargs="*", help="samplers to count (default: all)")
    args = parser.parse_args()
    torch.manual_seed(0)
    print("| sampler | T = 0: max / mean syncs per step | T = 1: max / mean | sites in dllm/samplers/ |")
    print("|---|---|---|---|")
    for name in args.samplers or sampler_names():
        m = measure(name)
        print(f"| {name} | {cell(m[0.0])} | {cell(m[1.0])} | {short_sites(m['sites'])} |")
        if args.sites:
            for site, n in m["sites"].most_common():
                print(f"    {n:5d}  {site}")


if __name__ == "__main__":
    main()
