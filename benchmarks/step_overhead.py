"""Host time per decode step where a forward is nearly free, as on a GPU: dllm's engine against the
project's transcription of Fast-dLLM's dual-cache driver (NVlabs/Fast-dLLM ``llada/generate.py``,
``tests/reference/decoders/fastdllm_generate.py``) on the same weights.

    python benchmarks/step_overhead.py [--rounds 7] [--dtype bfloat16] [--out benchmarks/results/step-overhead.txt]

The default model is a random LLaDA-format model of 1 layer, width 16 (2 heads, MLP 32, the tiny
vocabulary): its forward costs a few microseconds, so a step's wall time is what the loop itself
issues (Python, ATen calls, host syncs), which is what bounds a cached step on a GPU. On a GPU,
``--width 8b --layers 8 --device cuda --prompt-length 1024 --block-length 32`` compares the two loops
at LLaDA-8B's shapes (``benchmarks/gpu-step.sh``). One prompt of ``--prompt-length``
tokens, ``--gen-length`` positions in blocks of ``--block-length``, one thread. Each setting runs
``--rounds`` times in interleaved rounds; the table gives the median microseconds per forward (wall /
NFE) with the range, the ratio to the transcription's step at the same rule, the same per decode step
(``fast`` forwards its variants at every step and twice at a block's first), and, for dllm, the ATen
calls and host syncs per step counted with ``dllm.eval.bench.counters`` and the time per step spent
outside the model's forward calls (what stays on the host when the forward is a replayed CUDA graph). On
CUDA two more rows run ``threshold`` and ``fast:compact=False`` with ``cuda_graphs=True`` (their counts are
the eager ones; their "outside fwd" includes the replays). Needs a checkout (it imports
``tests/reference/decoders``).
"""

from __future__ import annotations

import argparse
import contextlib
import statistics
import sys
import time
from pathlib import Path
from typing import Callable

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the checkout: tests.reference.*

from tests.reference.decoders.fastdllm_generate import FastDLLMLLaDA, generate_with_dual_cache  # noqa: E402

import dllm  # noqa: E402
from dllm.eval.bench.counters import DispatchCounter, count_generate  # noqa: E402
from dllm.eval.bench.timing import sync  # noqa: E402
from dllm.models.tiny import tiny  # noqa: E402

# label -> (dllm sampler spec or None for the transcription, the transcription's rule it is compared with)
SETTINGS = {
    "Fast-dLLM driver, low_confidence": (None, "low_confidence"),
    "Fast-dLLM driver, threshold 0.9": (None, "threshold"),
    "dllm low_confidence:cache=dual": ("low_confidence", "low_confidence"),
    "dllm threshold:cache=dual": ("threshold", "threshold"),
    "dllm fast:cache=dual": ("fast", "threshold"),
    "dllm fast:compact=False,cache=dual": ("fast:compact=False", "threshold"),  # as on CUDA
}
GRAPHED = {  # on CUDA only: the same with generate(cuda_graphs=True), the cached forwards replayed
    "dllm threshold:cache=dual, graphs": ("threshold", "threshold"),
    "dllm fast:compact=False,cache=dual, graphs": ("fast:compact=False", "threshold"),
}


def runner(label: str, model, prompt: torch.Tensor, args) -> Callable[[], int]:
    """A zero-argument call decoding once and returning its NFE."""
    spec, rule = {**SETTINGS, **GRAPHED}[label]
    g, bl = args.gen_length, args.block_length
    if spec is None:
        driver = DriverClock(FastDLLMLLaDA(model))
        threshold = 0.9 if rule == "threshold" else None

        def run_driver() -> int:
            _, nfe = generate_with_dual_cache(driver, prompt.clone(), steps=g, gen_length=g, block_length=bl,
                                              mask_id=model.mask_id, threshold=threshold)
            return nfe
        run_driver.clock = driver  # type: ignore[attr-defined]
        return run_driver
    kwargs = dict(sampler=spec, cache="dual", gen_length=g, block_length=bl)
    if spec == "low_confidence":
        kwargs["steps"] = g
    if label in GRAPHED:
        kwargs["cuda_graphs"] = True

    def run_engine() -> int:
        return dllm.generate(model, prompt, **kwargs).nfe
    run_engine.kwargs = kwargs  # type: ignore[attr-defined]
    return run_engine


def forwards_per_step(run: Callable[[], int], model, prompt: torch.Tensor) -> float:
    """NFE over decode steps of one decode (the driver: one forward a step; ``fast``: its variant
    forwards, and two forwards at a block's first step)."""
    kwargs = getattr(run, "kwargs", None)
    if kwargs is None:
        return 1.0
    steps = [0]
    out = dllm.generate(model, prompt, callback=lambda st: steps.__setitem__(0, steps[0] + 1), **kwargs)
    return out.nfe / steps[0]


def timed_call(clock, fn, device, *args, **kwargs):
    """``fn(*args, **kwargs)``, its wall time (between device syncs) added to ``clock.seconds``; a call
    made while a CUDA graph captures (``generate(cuda_graphs=True)`` captures a shape's second forward)
    runs untimed: a device sync there would break the capture."""
    if device.type == "cuda" and torch.cuda.is_current_stream_capturing():
        return fn(*args, **kwargs)
    sync(device)
    t0 = time.perf_counter()
    out = fn(*args, **kwargs)
    sync(device)
    clock.seconds += time.perf_counter() - t0
    return out


class DriverClock:
    """The transcribed driver's forward, timed while ``on`` (its loop calls the model object)."""

    def __init__(self, inner) -> None:
        self.inner, self.on, self.seconds = inner, False, 0.0

    def __getattr__(self, name: str):  # the driver reads the model's attributes (device, ...)
        return getattr(self.inner, name)

    def __call__(self, *args, **kwargs):
        if not self.on:
            return self.inner(*args, **kwargs)
        return timed_call(self, self.inner, self.inner.device, *args, **kwargs)


class ForwardClock:
    """Wall time spent inside ``model``'s forwards while active (instance attributes shadow the
    class's ``forward`` and ``cached_logits``, so only this model's calls are timed): a step's time
    outside them is what a replayed CUDA graph of the forward leaves on the host."""

    def __init__(self, model) -> None:
        self.model, self.seconds, self.on = model, 0.0, True

    NAMES = ("forward", "cached_logits")  # the engine's cached steps call cached_logits, not the module

    def __enter__(self) -> "ForwardClock":
        for name in self.NAMES:
            inner = getattr(type(self.model), name).__get__(self.model)

            def timed(*args, _inner=inner, **kwargs):
                return timed_call(self, _inner, self.model.device, *args, **kwargs)
            setattr(self.model, name, timed)
        return self

    def __exit__(self, *exc) -> None:
        for name in self.NAMES:
            delattr(self.model, name)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rounds", type=int, default=7, help="interleaved rounds per setting (default 7)")
    ap.add_argument("--repeat", type=int, default=5, help="decodes per round (default 5)")
    ap.add_argument("--dtype", default="bfloat16", choices=["float32", "bfloat16"], help="model dtype (default bfloat16)")
    ap.add_argument("--prompt-length", type=int, default=64, help="prompt tokens (default 64)")
    ap.add_argument("--gen-length", type=int, default=32, help="generated positions (default 32)")
    ap.add_argument("--block-length", type=int, default=8, help="block length (default 8)")
    ap.add_argument("--width", default="16", choices=["16", "8b"], help="16 (default: forwards nearly free) or 8b "
                    "(LLaDA-8B's shapes, random weights)")
    ap.add_argument("--layers", type=int, default=1, help="transformer layers (default 1)")
    ap.add_argument("--device", default="cpu", help="cpu (default) or cuda")
    ap.add_argument("--threads", type=int, default=1, help="CPU threads (default 1)")
    ap.add_argument("--layer-path", default="default", choices=["default", "fused", "reference"],
                    help="dllm's layer path: the dtype's default (fused for bfloat16/float16, module by module "
                         "for float32), or forced (Transformer.set_fused)")
    ap.add_argument("--out", default=None, help="also write the table to this file")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    dtype = getattr(torch, args.dtype)
    if args.width == "8b":
        from dllm.eval.bench.breakdown import build_model

        model = build_model(args.layers, dtype, args.device)
    else:
        model = tiny("llada", dtype=dtype, n_layers=args.layers, d_model=16, n_heads=2, n_kv_heads=2, mlp_hidden=32,
                     seed=0, max_positions=max(512, args.prompt_length + args.gen_length)).to(args.device)
    prompt = torch.randint(10, 40, (1, args.prompt_length), generator=torch.Generator().manual_seed(0)).to(args.device)
    path = {"default": None, "fused": True, "reference": False}[args.layer_path]
    model.transformer.set_fused(path)
    settings = {**SETTINGS, **(GRAPHED if str(args.device).startswith("cuda") else {})}
    runs = {label: runner(label, model, prompt, args) for label in settings}
    per_step: dict[str, list[float]] = {label: [] for label in settings}
    outside: dict[str, list[float]] = {label: [] for label in settings}  # us per step outside forwards
    with torch.inference_mode():
        for run in runs.values():  # warm-up
            run()
        per_fwd = {label: forwards_per_step(run, model, prompt) for label, run in runs.items()}
        for r in range(args.rounds):
            for label, run in runs.items():
                sync(model.device)
                t0 = time.perf_counter()
                nfe = sum(run() for _ in range(args.repeat))
                sync(model.device)
                per_step[label].append((time.perf_counter() - t0) / nfe * 1e6)
                # the split, in runs of its own (the clock costs time)
                driver = getattr(run, "clock", None)
                with contextlib.nullcontext(driver) if driver is not None else ForwardClock(model) as clock:
                    clock.on, clock.seconds = True, 0.0
                    t0 = time.perf_counter()
                    nfe = sum(run() for _ in range(args.repeat))
                    sync(model.device)
                    wall = time.perf_counter() - t0
                    clock.on = False
                outside[label].append((wall - clock.seconds) / nfe * 1e6)
            print(f"round {r + 1}/{args.rounds}", file=sys.stderr)
    med = {label: statistics.median(v) for label, v in per_step.items()}
    lines = [f"# python benchmarks/step_overhead.py --rounds {args.rounds} --repeat {args.repeat} --dtype {args.dtype} "
             f"--prompt-length {args.prompt_length} --gen-length {args.gen_length} --block-length {args.block_length} "
             f"--width {args.width} --layers {args.layers} --device {args.device} --threads {args.threads} "
             f"--layer-path {args.layer_path}",
             f"# torch {torch.__version__}; us per forward = wall / NFE, median [min-max] of the rounds; "
             f"aten/step and syncs/step counted on the CPU model of the same layers",
             "# outside fwd: us per forward (wall / NFE) outside the model's forward calls (timed in runs of their own, "
             "each forward wrapped by a clock), median of the rounds; x driver: dllm's over the driver's whole "
             "step, and x drv out: over the driver's own outside fwd (same rule; the driver forwards once a step, "
             "so its columns are per step too, dllm's per forward: x fwd/step for dllm's per step)",
             "# us/step: wall / decode steps (us/fwd x fwd/step; the driver forwards once a step) and x driver: over "
             "the driver's step",
             f"{'setting':36s} {'us/fwd':>9s} {'range':>15s} {'x driver':>9s} {'aten/step':>10s} {'syncs/step':>11s}"
             f" {'outside fwd':>12s} {'x driver':>9s} {'x drv out':>11s} {'fwd/step':>9s} {'us/step':>8s} {'x driver':>9s}"]
    for label, (spec, rule) in settings.items():
        base = med[f"Fast-dLLM driver, {'threshold 0.9' if rule == 'threshold' else 'low_confidence'}"]
        aten = syncs = "-"
        if spec is not None:
            kwargs = dict(sampler=spec, cache="dual", gen_length=args.gen_length, block_length=args.block_length)
            if spec == "low_confidence":
                kwargs["steps"] = args.gen_length
            counted = tiny("llada", dtype=dtype, n_layers=args.layers, d_model=16, n_heads=2, n_kv_heads=2,
                           mlp_hidden=32, seed=0, max_positions=max(512, args.prompt_length + args.gen_length))
            counted.transformer.set_fused(path)
            stats = DispatchCounter.mean(count_generate(counted, prompt.cpu(), **kwargs).steps)
            n_layers = model.config.n_layers
            aten = f"{stats['aten_outside'] + stats['aten_per_layer'] * n_layers:.0f}"
            syncs = f"{stats['syncs']:.2f}"
        lo, hi = min(per_step[label]), max(per_step[label])
        out_med = statistics.median(outside[label])
        rest = f"{out_med:12.0f} {'-':>9s} {'-':>11s}"
        if spec is not None:
            drv = statistics.median(outside[f"Fast-dLLM driver, {'threshold 0.9' if rule == 'threshold' else 'low_confidence'}"])
            rest = f"{out_med:12.0f} {out_med / base:9.2f} {out_med / drv:11.2f}"
        step_us = med[label] * per_fwd[label]
        lines.append(f"{label:36s} {med[label]:9.0f} {f'[{lo:.0f}-{hi:.0f}]':>15s} {med[label] / base:9.2f} "
                     f"{aten:>10s} {syncs:>11s} {rest} {per_fwd[label]:9.2f} {step_us:8.0f} {step_us / base:9.2f}")
    text = "\n".join(lines)
    print(text)
    if args.out:
        Path(args.out).write_text(text + "\n")


if __name__ == "__main__":
    main()
