"""Where a decode step's time goes, at LLaDA-8B width: per layer, head, statistics, engine.

    dllm bench breakdown --layers 2 --dtypes float32,bfloat16 --caches none,dual

A random LLaDA-format model with LLaDA-8B's shapes (hidden 4096, 32 heads, MLP 12,288, vocabulary
126,464) but only ``--layers`` layers decodes one block of ``--block-length`` after a prompt of
``--prompt-length`` with ``dllm.generate``; the first ``--steps`` steps are timed (the prefill of a
cached run is not). Forward hooks time every transformer layer, the final norm + LM head, and the
embedding; a wrapper times the sampler's ``step`` (minus any forward it makes itself): that is
"statistics". "engine" is the rest of the step (the block loop, the cache policy, the writes).

Projection to the real model: ``step(32) = 32 x mean layer + embedding + head + statistics +
engine`` (layers are identical in shape, so their time scales with their count).

The reference drivers' projection: the same layers (LLaDA's and Fast-dLLM's drivers forward the same
query rows as our cache policies do), then what they do after the last layer, timed on this step's
last hidden states: the final norm and LM head over EVERY forwarded row (ours: the block's rows for
a ``reads_block_only`` sampler such as ``threshold``) and Fast-dLLM ``get_transfer_index`` at T = 0
(arg-max and a float64 softmax over ``[B, Q, V]``). Their Python loop is not counted, so the
reference column is a lower bound on its step time.

``--cuda-graphs`` times every case again with ``generate(cuda_graphs=True)`` (``dllm.engine.graphs``: each
cached forward replayed as a CUDA graph; on a CPU the same static step runs eagerly); a replay runs
no module, so those rows split nothing but the step time. Their JSON rows also say how the call's
shapes ran (``graph_first_runs``, ``graph_captures``, ``graph_replays``) and the CUDA memory the
captures reserved (``graph_mb``: the growth of the graphs' private pool).

``--layer-paths`` times every case on each listed layer path (``LAYER_PATHS``): ``fused`` runs the norms
and RoPE as ATen ops, ``ops`` as the one-launch ``dllm::`` operators (fewer launches per layer, more host
time per call: on CUDA which one a step prefers is a measurement), ``reference`` module by module.

``--compile [BACKEND]`` times every case a second time with the layers compiled
(``dllm.models.compile_model``; default backend inductor) on the same model: the "compile" column.

Peak memory is the process's peak over the timed steps (CPU: peak RSS, model included; CUDA:
``max_memory_allocated``).

Every case runs ``--warmup`` untimed steps first (default 3: a new shape's first step plans its
cuBLAS/cuDNN kernels), so its timed steps are steady-state. Beside the times each row gives what
the step issues, counted on a narrow model of the same family, layers, dtype and lengths
(``dllm.eval.bench.counters``; the counts do not depend on the width): ATen calls and kernel-like ops
per layer, ATen calls outside the layers and host syncs per step. On CUDA the timed steps are also
run once under ``torch.profiler``: the share of the wall time the GPU is busy and kernel launches per
step (``dllm.eval.bench.gpu_profile``).
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any, Optional, Sequence

import torch

from dllm.flags import output_file
from dllm.engine.graphs import GRAPHS_KEY
from dllm.eval.bench.gpu_profile import decode_block
from dllm.eval.bench.timing import StepClock, StepsDone, peak_memory_mb, reset_peak_memory, timed
from dllm.eval.interrupt import finished, until_interrupted

LLADA_8B = dict(d_model=4096, n_heads=32, n_kv_heads=32, mlp_hidden=12288, vocab_size=126_464)
SDAR_8B = dict(d_model=4096, n_heads=32, n_kv_heads=8, mlp_hidden=12288, vocab_size=151_936, attn_head_dim=128)
FAMILIES = ("llada", "sdar")  # SDAR: block-causal, its block cache and block length 4
WIDTHS = ("8b", "tiny")
COMPONENTS = ("layer", "embedding", "head", "statistics", "engine")
# --layer-paths: name -> Transformer.set_fused(fused, ops=ops). default: the dtype's and device's choice
# (fused for bfloat16/float16, with the one-launch operators on CUDA); fused: norms and RoPE as ATen ops;
# ops: as the one-launch operators dllm::rms_norm / rope_rows (custom ops: one launch each on CUDA, more
# host time per call than an ATen op); reference: module by module
LAYER_PATHS = {"default": (None, None), "fused": (True, False), "ops": (True, True), "reference": (False, None)}


def reference_statistics_seconds(logits: torch.Tensor, repeats: int = 1) -> float:
    """Fast-dLLM ``get_transfer_index`` at T = 0 on ``logits`` [B, Q, V]: arg-max and the float64
    softmax probability of it over every row (NVlabs/Fast-dLLM ``llada/generate.py``); median of
    ``repeats`` timed calls."""

    def stats() -> None:
        x0 = torch.argmax(logits, dim=-1)  # [B, Q]
        p = torch.softmax(logits.to(torch.float64), dim=-1)  # [B, Q, V] float64
        torch.gather(p, -1, x0.unsqueeze(-1))

    return timed(stats, logits.device, repeats=repeats).seconds


def shapes_of(family: str, width: str) -> dict[str, Any]:
    """TransformerConfig fields of the benchmarked model: ``width`` "8b" (LLaDA-8B's shapes, or SDAR-8B's
    for ``family`` "sdar") or "tiny" (a narrow model for smoke runs)."""
    if family not in FAMILIES or width not in WIDTHS:
        raise ValueError(f"family must be one of {FAMILIES} and width one of {WIDTHS}, got {family!r}, {width!r}")
    if width == "tiny":
        return dict(d_model=64, n_heads=4, n_kv_heads=4 if family == "llada" else 2, mlp_hidden=128, vocab_size=512)
    return dict(LLADA_8B) if family == "llada" else dict(SDAR_8B)


def build_model(layers: int, dtype: torch.dtype, device: str, seed: int = 0, *, family: str = "llada",
                width: str = "8b"):
    from dllm.models.tiny import tiny

    model = tiny(family, tokenizer=False, n_layers=layers, max_positions=8192, seed=seed, **shapes_of(family, width),
                 device=device)  # made and drawn on the device: an 8B-width layer is ~0.9 GB of float32 to draw
    return model.to(dtype=dtype).eval()


def count_case(model, *, cache: str, sampler: str, prompt_length: int, block_length: int,
               batch: int = 1, layer_path: str = "default") -> dict[str, float]:
    """ATen calls and kernel-like ops per layer, ATen calls outside the layers and host syncs per
    step of one block, counted on a narrow copy of ``model``'s family, layers and dtype (what is
    issued does not depend on the width) on ``layer_path`` (``LAYER_PATHS``; "default" counts the CPU's
    choice), over the steps after the first forward."""
    from dllm.eval.bench.counters import DispatchCounter, count_generate
    from dllm.models.tiny import tiny

    cfg = model.config
    narrow = tiny(model.family, tokenizer=False, n_layers=cfg.n_layers, **shapes_of(model.family, "tiny"),
                  max_positions=max(cfg.max_positions, 2 * prompt_length + 64), dtype=model.dtype)
    fused, ops = LAYER_PATHS[layer_path]
    narrow.transformer.set_fused(fused, ops=ops)
    prompt = torch.randint(10, 500, (batch, prompt_length), generator=torch.Generator().manual_seed(0))
    counter = count_generate(narrow, prompt, sampler=sampler, gen_length=block_length, block_length=block_length,
                             cache=cache)
    stats = DispatchCounter.mean(counter.steps[1:] or counter.steps)
    return {k: stats[k] for k in ("aten_per_layer", "kernels_per_layer", "aten_outside", "syncs")}


def run_case(model, *, cache: str, sampler: str, prompt_length: int, block_length: int, steps: int,
             device: torch.device, warmup: int = 3, batch: int = 1, cuda_graphs: bool = False,
             layer_path: str = "default") -> dict[str, Any]:
    """One case on ``model`` with its layers on ``layer_path`` (``LAYER_PATHS``; the model is left so)."""
    from dllm.samplers import make_sampler

    if layer_path not in LAYER_PATHS:
        raise ValueError(f"layer_path must be one of {sorted(LAYER_PATHS)}, got {layer_path!r}")
    fused, ops = LAYER_PATHS[layer_path]
    model.transformer.set_fused(fused, ops=ops)

    gen = torch.Generator().manual_seed(0)
    high = min(1000, model.config.vocab_size)  # ids past the special tokens, within the vocabulary
    prompt = torch.randint(10, high, (batch, prompt_length), generator=gen).to(device)
    smp = make_sampler(sampler)
    clock = StepClock(model, smp, device, steps, components=not cuda_graphs)
    captured: dict[str, torch.Tensor] = {}
    last = model.transformer.layers[-1]  # its output: the step's hidden states of every query row
    grab = last.register_forward_hook(lambda m, a, out: captured.__setitem__(
        "hidden", (out[0] if isinstance(out, tuple) else out).detach()))

    # the prefill (cached runs) and the first `warmup` steps are outside the clock: it starts at the
    # warmup-th callback, then times `steps` steps
    seen = [0]
    graphs: dict[str, Any] = {}  # the call's StepGraphs, when cuda_graphs is on

    def callback(state):
        seen[0] += 1
        graphs.setdefault("g", state.extras.get(GRAPHS_KEY))
        if clock.started is None:
            if seen[0] >= max(1, warmup):
                reset_peak_memory(device)
                clock.begin()
        else:
            clock.end_step(state)

    try:
        decode_block(model, prompt, sampler=smp, cache=cache, block_length=block_length, callback=callback,
                     cuda_graphs=cuda_graphs, stop=StepsDone)
    finally:
        clock.close()
        grab.remove()
    peak = peak_memory_mb(device)
    n_layers = len(model.transformer.layers)
    parts = clock.per_step(n_layers)
    ref_head, ref_logits = reference_head_seconds(model, captured["hidden"], device)
    ref_stats = reference_statistics_seconds(ref_logits)
    query_rows = ref_logits.shape[1]
    del ref_logits
    forward = parts["layer"] * n_layers + parts["embedding"] + parts["head"]
    base = 32 * parts["layer"] + parts["embedding"]
    counts = count_case(model, cache=cache, sampler=sampler, prompt_length=prompt_length, block_length=block_length,
                        batch=batch, layer_path=layer_path)
    gpu = {}
    if device.type == "cuda":
        from dllm.eval.bench.gpu_profile import profile_generate

        gpu = profile_generate(model, prompt, sampler=sampler, cache=cache, block_length=block_length,
                               warmup=warmup, steps=steps, cuda_graphs=cuda_graphs)
    g = graphs.get("g")
    held = {} if g is None else {"graph_first_runs": g.first_runs, "graph_captures": g.captures,
                                 "graph_replays": g.replays, "graph_mb": g.captured_bytes / 2**20}
    return {
        **counts, **gpu, **held,
        "cache": cache, "layer_path": layer_path, "sampler": sampler, "steps_timed": len(clock.step_times),
        "warmup_steps": max(1, warmup),
        "batch": batch, "family": model.family,
        "query_rows": query_rows, "logits_rows": clock.logits_rows[-1] if clock.logits_rows else 0,
        **{f"{k}_s": v for k, v in parts.items()},
        "forward_s": forward, "engine_share": parts["engine"] / parts["step"] if parts["step"] else 0.0,
        "reference_head_s": ref_head, "reference_statistics_s": ref_stats, "peak_mb": peak,
        "projected_step_32_s": base + parts["head"] + parts["statistics"] + parts["engine"],
        "reference_projected_step_32_s": base + ref_head + ref_stats,
    }


def reference_head_seconds(model, hidden: torch.Tensor, device: torch.device) -> tuple[float, torch.Tensor]:
    """The final norm and LM head over every row of ``hidden`` [B, Q, D], as the reference drivers
    run them (``model(x).logits``); returns (seconds, logits [B, Q, V])."""
    tr = model.transformer

    def head() -> torch.Tensor:
        h = tr.norm(hidden)
        return tr.lm_head(h) if tr.lm_head is not None else torch.nn.functional.linear(h, tr.embed.weight)

    with torch.inference_mode():
        run = timed(head, device)
    return run.seconds, run.result


def _opt(r: dict[str, Any], key: str, fmt: str) -> str:
    return "-" if r.get(key) is None else format(r[key], fmt)


def format_rows(rows: Sequence[dict[str, Any]]) -> str:
    head = (f"{'dtype':<9}{'compile':<9}{'path':<10}{'cache':<6}{'rows':>9} {'layer ms':>9}{'head ms':>9}{'ref head':>9}{'stats ms':>9}"
            f"{'ref stats':>10}{'engine ms':>10}{'engine %':>9}{'step ms':>9}{'x32 ms':>9}{'ref x32':>9}{'peak MiB':>9}"
            f"{'aten/L':>8}{'kern/L':>8}{'aten out':>9}{'syncs':>7}{'gpu busy':>9}{'launch':>8}")
    lines = [head, "-" * len(head)]
    for r in rows:
        peak = "-" if r["peak_mb"] is None else f"{r['peak_mb']:.0f}"
        busy = "-" if r.get("gpu_busy") is None else f"{100 * r['gpu_busy']:.0f}%"
        lines.append(
            f"{r['dtype']:<9}{r.get('compile', 'eager'):<9}{r.get('layer_path', 'default'):<10}{r['cache']:<6}{str(r['logits_rows']) + '/' + str(r['query_rows']):>9} "
            f"{1e3 * r['layer_s']:>9.1f}{1e3 * r['head_s']:>9.1f}{1e3 * r['reference_head_s']:>9.1f}"
            f"{1e3 * r['statistics_s']:>9.2f}{1e3 * r['reference_statistics_s']:>10.2f}{1e3 * r['engine_s']:>10.2f}"
            f"{100 * r['engine_share']:>8.1f}%{1e3 * r['step_s']:>9.1f}{1e3 * r['projected_step_32_s']:>9.0f}"
            f"{1e3 * r['reference_projected_step_32_s']:>9.0f}{peak:>9}"
            f"{_opt(r, 'aten_per_layer', '.0f'):>8}{_opt(r, 'kernels_per_layer', '.0f'):>8}"
            f"{_opt(r, 'aten_outside', '.0f'):>9}{_opt(r, 'syncs', '.1f'):>7}{busy:>9}{_opt(r, 'launches_per_step', '.0f'):>8}")
    return "\n".join(lines)


def main(argv: Optional[Sequence[str]] = None) -> int:
    p = argparse.ArgumentParser(prog="dllm bench breakdown", description=__doc__.split("\n")[0])
    p.add_argument("--layers", type=int, default=2, help="transformer layers of the LLaDA-8B-width model (default 2)")
    p.add_argument("--family", default="llada", choices=FAMILIES, help="llada (default) or sdar (block cache, block 4)")
    p.add_argument("--width", default="8b", choices=WIDTHS, help="8b: the real model's shapes (default); tiny: a smoke run")
    p.add_argument("--batch", type=int, default=1, help="rows decoded together (default 1)")
    p.add_argument("--dtypes", default="float32,bfloat16", help="comma-separated dtypes (default float32,bfloat16)")
    p.add_argument("--caches", default="none,dual", help="comma-separated cache policies (default none,dual)")
    p.add_argument("--sampler", default="threshold", help="sampler spec (default threshold)")
    p.add_argument("--prompt-length", type=int, default=1024, help="prompt tokens (default 1024)")
    p.add_argument("--block-length", type=int, default=32, help="the decoded block (default 32)")
    p.add_argument("--steps", type=int, default=2, help="timed steps per case (default 2)")
    p.add_argument("--warmup", type=int, default=3, help="untimed steps before them (default 3; >= 1)")
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu",
                   help="cuda when available, else cpu (the default)")
    p.add_argument("--threads", type=int, default=0, help="CPU threads (default 0: torch's choice)")
    p.add_argument("--compile", nargs="?", const="inductor", default=None, metavar="BACKEND",
                   help="also time every case with the layers torch.compile'd (default backend: inductor)")
    p.add_argument("--cuda-graphs", action="store_true",
                   help="also time every case with generate(cuda_graphs=True): the cached forwards replayed as "
                        "CUDA graphs (on a CPU: the same static step run eagerly); only the step time is split")
    p.add_argument("--layer-paths", default="default",
                   help="comma-separated layer paths, each timed: default (the dtype's and device's choice), "
                        "fused (norms and RoPE as ATen ops), ops (as the one-launch dllm:: operators), "
                        "reference (module by module); default: default")
    p.add_argument("--json", type=output_file, default=None, help="also write the rows to this JSON file")
    args = p.parse_args(argv)
    for name, low in (("--layers", 1), ("--prompt-length", 1), ("--block-length", 1), ("--steps", 1), ("--warmup", 1),
                      ("--batch", 1)):
        value = getattr(args, name[2:].replace("-", "_"))
        if value < low:
            p.error(f"{name} must be >= {low}, got {value}")
    dtypes = [d.strip() for d in args.dtypes.split(",") if d.strip()]
    bad = [d for d in dtypes if d not in ("float32", "bfloat16", "float16")]
    if bad:
        p.error(f"--dtypes: {bad} not valid; choose from float32, bfloat16, float16")
    caches = [c.strip() for c in args.caches.split(",") if c.strip()]
    paths = [c.strip() for c in args.layer_paths.split(",") if c.strip()]
    bad = [c for c in paths if c not in LAYER_PATHS]
    if bad or not paths:
        p.error(f"--layer-paths: {bad or paths} not valid; choose from {', '.join(LAYER_PATHS)}")
    if args.threads > 0:
        torch.set_num_threads(args.threads)
    from dllm.models.loading import resolve_device

    try:
        device = resolve_device(args.device)  # cuda without a GPU: the error names the available devices
    except ValueError as err:
        p.error(f"--device: {err}")
    modes = ["eager"] + (["graphs"] if args.cuda_graphs else []) + ([args.compile] if args.compile else [])
    if args.compile:
        from dllm.models.core.compile import check_backend
        check_backend(args.compile, device)
    rows: list[dict[str, Any]] = []

    def run() -> int:
        for dtype in dtypes:
            model = build_model(args.layers, getattr(torch, dtype), args.device, family=args.family, width=args.width)
            for mode in modes:
                if mode not in ("eager", "graphs"):
                    from dllm.models.core.compile import compile_model
                    compile_model(model, mode)
                graphs = (True if device.type == "cuda" else "static") if mode == "graphs" else False
                for path in paths:
                    for cache in caches:
                        r = run_case(model, cache=cache, sampler=args.sampler, prompt_length=args.prompt_length,
                                     block_length=args.block_length, steps=args.steps, device=device,
                                     warmup=args.warmup, batch=args.batch, cuda_graphs=graphs, layer_path=path)
                        rows.append({"dtype": dtype, "compile": mode, **r})
                        print(format_rows(rows[-1:]).splitlines()[-1], flush=True)
            del model
        write()
        return 0

    def write() -> None:
        result = {"device": str(device), "threads": torch.get_num_threads(), "layers": args.layers,
                  "family": args.family, "batch": args.batch, "shapes": shapes_of(args.family, args.width), "prompt_length": args.prompt_length, "block_length": args.block_length,
                  "sampler": args.sampler, "rows": rows}
        print(format_rows(rows))
        if args.json:
            Path(args.json).parent.mkdir(parents=True, exist_ok=True)
            with open(args.json, "w") as f:
                json.dump(result, f, indent=2)

    def keep() -> str:
        if rows:
            write()
        return finished(len(rows), "row", args.json if rows and args.json else None)

    return until_interrupted(run, keep)


if __name__ == "__main__":
    raise SystemExit(main())
