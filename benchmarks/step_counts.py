"""What a cached decode step issues, per family, sampler and layer path: ATen calls and kernel-like ops
per transformer layer, ATen calls outside the layers and host syncs per step, counted on the CPU with
``dllm.eval.bench.counters`` (the counts a GPU would launch; they do not depend on the width).

    python benchmarks/step_counts.py [--out benchmarks/results/step-counts.txt]

Tiny random models in bfloat16 (what a GPU runs; the fused layer path is on by default there), one
prompt of 24 tokens, 16 generated positions in blocks of 8 (4 for SDAR); the cached steps only
(``DispatchCounter.cached_steps``): a full forward (the refresh at a block's start) is left out, and so
is the call's first step (the prompt's prefill, with the call's setup). ``path``: ``reference`` (module by module, ``set_fused(False)``),
``fused`` (the default for bfloat16 weights on a CPU: norms and RoPE as ATen ops) or ``fused+ops``
(``set_fused(True, ops=True)``: norms and RoPE as the one-launch operators, as the fused layer runs
on CUDA; on a CPU their reference implementation runs, so this row counts what a GPU launches).
``fast`` is counted as it runs on CUDA there too (``compact=False``: static variant batches; on a
CPU it compacts them, one host read per step), with the torch statistics and, in the row
``fast, stats=fused``, as CUDA runs it by default: the fused vocabulary statistics and LoPA's two
selection kernels (``dllm.kernels.triton.lopa``), each Triton launch counted as one call and one
kernel. That row runs the kernels in Triton's interpreter (``TRITON_INTERPRET=1``, set by this script)
on a float16 copy of the model (the interpreter has no bfloat16); the interpreter's own torch ops are
not counted. The syncs column lists the three most frequent sync
sites. The rows ``sdar (trained tiny-sdar ...)`` count SDAR on the trained ``tiny-sdar`` (three task
prompts), where a block takes several steps as with real models (the random one fills each block of 4 in
one step, so its once-per-block work is counted at every step). A second table counts every registered sampler on LLaDA with the dual cache, fused+ops; a
sampler that reads one layer's attention maps (``dawn``: that layer runs the reference attention) is
also counted with 32 layers, LLaDA-8B's depth, where its mean per layer is what a GPU launches.
"""

from __future__ import annotations

import argparse
import os
from pathlib import Path

os.environ.setdefault("TRITON_INTERPRET", "1")  # before triton is imported: the fused rows run interpreted

import torch

from dllm.eval.bench.counters import DispatchCounter, count_generate
from dllm.models.tiny import tiny

RUNS = (("llada", "dual", 8), ("dream", "dual", 8), ("sdar", "block", 4), ("fastdllm_v2", "block", 8),
        ("llada2", "block", 4))
SAMPLERS = ("low_confidence", "threshold", "fast")
FUSED_FAST = "fast:compact=False,stats=fused"  # as CUDA runs fast by default (the kernels: float16 here)


def _row(family: str, cache: str, label: str, path: str, counter: DispatchCounter) -> str:
    steps = counter.cached_steps(24 + 16)
    s = DispatchCounter.mean(steps)
    sites = ", ".join(f"{k} x{v}" for k, v in DispatchCounter.sync_sites(steps).most_common(3))
    return (f"| {family} | {cache} | {label} | {path} | {s['aten_per_layer']:.1f} | {s['kernels_per_layer']:.1f} | "
            f"{s['aten_outside']:.1f} | {s['syncs']:.2f} | {sites or '-'} |")


def rows() -> list[str]:
    out = []
    prompt = torch.randint(10, 40, (1, 24), generator=torch.Generator().manual_seed(0))
    for family, cache, block in RUNS:
        model = tiny(family, dtype=torch.bfloat16)
        kw = dict(cache=cache, gen_length=16, block_length=block)
        for path in ("reference", "fused", "fused+ops"):
            model.transformer.set_fused(path != "reference", ops=path == "fused+ops")
            fused = model.transformer.fused_ready() if path != "reference" else False
            label = path if path == "reference" or fused else f"{path} (n/a: reference)"
            for sampler in SAMPLERS:
                spec = "fast:compact=False" if path == "fused+ops" and sampler == "fast" else sampler  # as on CUDA
                out.append(_row(family, cache, sampler, label, count_generate(model, prompt, sampler=spec, **kw)))
        half = tiny(family, dtype=torch.float16)
        half.transformer.set_fused(True, ops=True)
        out.append(_row(family, cache, "fast, stats=fused", "fused+ops (float16)",
                        count_generate(half, prompt, sampler=FUSED_FAST, **kw)))
    return out


TRAINED_PROMPTS = ("[BOS] reverse A B C D E F G H [SEP]", "[BOS] sort D A C B H G F E [SEP]",
                   "[BOS] copy A B C D E F G H A B C D [SEP]")


def trained_sdar_rows() -> list[str]:
    """SDAR's block cache on the trained ``tiny-sdar`` (block 4), as on CUDA: the random model fills
    each block in one step, so every counted step there is a block's first (its once-per-block work,
    counted at every step); a trained model takes 2-4 steps per block, as real ones do. Means over the
    cached steps of three task prompts, 16 generated positions each."""
    import dllm

    out = []
    for dtype, sampler in ((torch.bfloat16, "low_confidence"), (torch.bfloat16, "threshold"),
                           (torch.float16, FUSED_FAST)):
        model = dllm.load("tiny-sdar", dtype=dtype)
        model.transformer.set_fused(True, ops=True)
        steps, blocks = [], 0
        for text in TRAINED_PROMPTS:
            ids = torch.tensor([model.tokenizer.encode(text)])  # [1, P]
            counter = count_generate(model, ids, sampler=sampler, cache="block", gen_length=16, block_length=4)
            steps += counter.cached_steps(ids.shape[1] + 16)
            blocks += 4
        s = DispatchCounter.mean(steps)
        sites = ", ".join(f"{k} x{v}" for k, v in DispatchCounter.sync_sites(steps).most_common(3))
        label = "fast, stats=fused" if sampler == FUSED_FAST else sampler
        out.append(f"| sdar (trained tiny-sdar, {len(steps) / blocks:.1f} cached steps / block) | block | {label} | "
                   f"fused+ops ({str(dtype).split('.')[-1]}) | {s['aten_per_layer']:.1f} | {s['kernels_per_layer']:.1f} | "
                   f"{s['aten_outside']:.1f} | {s['syncs']:.2f} | {sites or '-'} |")
    return out


DEEP_LAYERS = 32  # LLaDA-8B's layers
MAPS = ("dawn",)  # samplers that read one layer's attention maps: that layer runs the reference attention,
#   so their mean per layer depends on the depth; also counted at LLaDA-8B's depth


def sampler_rows() -> list[str]:
    """Every registered sampler on LLaDA with the dual cache, as the fused layer runs on CUDA."""
    from dllm.samplers import samplers

    out = []
    prompt = torch.randint(10, 40, (1, 24), generator=torch.Generator().manual_seed(0))
    model = tiny("llada", dtype=torch.bfloat16)
    model.transformer.set_fused(True, ops=True)
    deep = tiny("llada", dtype=torch.bfloat16, n_layers=DEEP_LAYERS)  # LLaDA-8B's depth, the tiny width
    deep.transformer.set_fused(True, ops=True)
    half = tiny("llada", dtype=torch.float16)  # the interpreter's dtype for the kernels of fast / lopa
    half.transformer.set_fused(True, ops=True)
    for name in samplers.names():
        spec = name
        if name in ("fast", "lopa"):  # as on CUDA: static variant batches, the fused statistics and kernels
            spec = f"{name}:compact=False,stats=fused"
        first = half if name in ("fast", "lopa") else model
        for label, m in ((spec, first),) + (((f"{spec} ({DEEP_LAYERS} layers)", deep),) if name in MAPS else ()):
            steps = count_generate(m, prompt, sampler=spec, cache="dual", gen_length=16, block_length=8).cached_steps(40)
            s = DispatchCounter.mean(steps)
            out.append(f"| {label} | {s['aten_per_layer']:.1f} | {s['kernels_per_layer']:.1f} | "
                       f"{s['aten_outside']:.1f} | {s['syncs']:.2f} |")
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", default=None, help="also write the table to this file")
    args = ap.parse_args()
    torch.set_num_threads(1)
    with torch.no_grad():
        table, per_sampler = rows() + trained_sdar_rows(), sampler_rows()
    text = "\n".join([
        "# python benchmarks/step_counts.py" + (f" --out {args.out}" if args.out else ""),
        f"# torch {torch.__version__}; means over the cached steps (bfloat16, batch 1; the fused fast rows "
        "float16); a Triton launch counts as one call",
        "| family | cache | sampler | path | ATen calls / layer | kernel-like / layer | ATen outside layers / step "
        "| host syncs / step | sync sites (calls over the run) |",
        "|---|---|---|---|---|---|---|---|---|",
        *table,
        "",
        "# every registered sampler: llada, dual cache, fused+ops (as on CUDA; fast and lopa float16)",
        "| sampler | ATen calls / layer | kernel-like / layer | ATen outside layers / step | host syncs / step |",
        "|---|---|---|---|---|",
        *per_sampler])
    print(text)
    if args.out:
        Path(args.out).write_text(text + "\n")


if __name__ == "__main__":
    main()
