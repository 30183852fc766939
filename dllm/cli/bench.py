"""The flags of ``dllm bench throughput|caches|kernels`` and the runs of the last two (the other
benchmarks own their flags: ``main(argv)`` of their modules, rows of ``dllm.cli.table``)."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from dllm.cli.args import POSITIVE, add_decode_args, add_model_place, add_threads, output_file


def _write_json(path, rows) -> None:
    if path:
        Path(path).parent.mkdir(parents=True, exist_ok=True)
        with open(path, "w") as f:
            json.dump(rows, f, indent=2, default=str)


def throughput_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--model", default="tiny-random-llada", help="model to time (default: tiny-random-llada)")
    p.add_argument("--prompt-length", type=POSITIVE, default=64, help="random prompt tokens per row (default: 64)")
    p.add_argument("--batch-size", type=POSITIVE, default=1, help="rows per call (default: 1)")
    p.add_argument("--repeats", type=POSITIVE, default=3, help="timed calls; the median is reported (default: 3)")
    add_model_place(p)
    p.add_argument("--json", type=output_file, default=None, metavar="PATH",
                   help="also write the results to this JSON file")
    add_decode_args(p, gen_length=64)


def caches_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--model", default="tiny-random-llada",
                   help="a model; tiny-random-{llada,dream} with --layers builds a fresh random one")
    p.add_argument("--layers", type=POSITIVE, default=8, help="layers of a fresh tiny-random model (default: 8)")
    p.add_argument("--prompt-length", type=POSITIVE, default=1024, help="prompt tokens (default: 1024)")
    p.add_argument("--gen-length", type=int, default=256, help="generated positions (default: 256)")
    p.add_argument("--block-length", type=int, default=32, help="block length (default: 32)")
    p.add_argument("--samplers", nargs="*", default=["low_confidence", "threshold"], help="sampler specs")
    p.add_argument("--caches", nargs="*", default=["none", "prefix", "dual", "window"],
                   help="cache policy specs (dual:look_back=16)")
    p.add_argument("--repeats", type=POSITIVE, default=1,
                   help="timed runs per cell, back to back after one untimed run; the median is reported (default: 1)")
    p.add_argument("--no-progress", action="store_true", help="no progress bar on stderr")
    add_threads(p)
    add_model_place(p)
    p.add_argument("--json", type=output_file, default=None, metavar="PATH", help="also write the rows to this JSON file")


def run_caches(args) -> int:
    """``dllm bench caches``; Ctrl-C (or SIGTERM) prints and writes the finished runs."""
    from dllm.eval.bench.caches import format_table, run_cache_bench
    from dllm.eval.interrupt import finished, until_interrupted
    from dllm.models import load, tiny
    from dllm.models.loading import resolve_device, resolve_dtype

    if args.model.startswith("tiny-random-") and args.layers:
        family = args.model.removeprefix("tiny-random-")
        device, dtype = resolve_device(args.device), resolve_dtype(args.dtype, {}, None)  # ValueError naming the
        #   valid ones; no --dtype: float32
        model = tiny(family, seed=0, n_layers=args.layers, max_positions=args.prompt_length + args.gen_length,
                     dtype=dtype)
        model = model if device is None else model.to(device)
        label = f"tiny random {family}, {args.layers} layers"
    else:
        model = load(args.model, dtype=args.dtype, device=args.device)
        label = args.model
    rows: list = []

    def report() -> None:
        print(f"{label}: prompt {args.prompt_length}, gen {args.gen_length}, block {args.block_length}")
        print(format_table(rows))
        _write_json(args.json, rows)

    def body() -> int:
        run_cache_bench(model, args.prompt_length, args.gen_length, args.block_length, samplers=args.samplers,
                        policies=args.caches, repeats=args.repeats, progress=not args.no_progress, results=rows)
        report()
        return 0

    def finish() -> str:
        report()
        return finished(len(rows), "run", args.json)

    return until_interrupted(body, finish)


def kernels_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--device", default=None, help="cpu or cuda (default: cuda when available)")
    p.add_argument("--repeats", type=POSITIVE, default=5, help="timed calls per row (default 5)")
    p.add_argument("--tiny", action="store_true", help="the smallest shapes only (a CPU smoke run in seconds)")
    p.add_argument("--tiles", action="store_true",
                   help="also time the Triton attention kernel at other tile shapes and warps (rows triton[MxNwW]; "
                        "dllm.eval.bench.kernel_tiles.TILES)")
    p.add_argument("--json", type=output_file, default=None, metavar="PATH", help="also write the rows here")
    p.add_argument("--no-progress", action="store_true", help="no progress bar")


def checked_device(text: str | None) -> str | None:
    """``--device``: None (the bench's choice) or a device this machine has (``resolve_device``);
    ValueError naming it and the devices that exist else."""
    if text is not None:
        from dllm.models.loading import resolve_device

        resolve_device(text)
    return text


def run_kernels(args) -> int:
    """The default shapes one at a time (the same rows as one ``run_kernel_bench`` call), a bar on
    stderr; Ctrl-C prints and writes the finished shapes' rows."""
    import torch
    from tqdm import tqdm

    from dllm.eval.bench.kernel_report import format_report, format_table
    from dllm.eval.bench.kernels import default_shapes, run_kernel_bench, tiny_shapes
    from dllm.eval.interrupt import terminate_as_interrupt

    device = checked_device(args.device)
    shapes = (tiny_shapes() if getattr(args, "tiny", False)
              else default_shapes(torch.device(device or ("cuda" if torch.cuda.is_available() else "cpu"))))
    backends = ("triton", "sdpa", "auto", "reference")
    if getattr(args, "tiles", False):
        from dllm.eval.bench.kernel_tiles import tile_names

        backends += tuple(tile_names())
    rows: list[dict] = []
    try:
        with terminate_as_interrupt():  # a timeout's SIGTERM keeps the finished rows too
            for shape in tqdm(shapes, disable=args.no_progress, desc="bench kernels", unit="shape"):
                rows += run_kernel_bench([shape], backends=backends, device=device, repeats=args.repeats)
    except KeyboardInterrupt:
        if not rows:
            raise
        print(format_table(rows))
        _write_json(args.json, rows)
        where = f"are in {args.json} and printed above" if args.json else "are printed above"
        done = len({r["shape"] for r in rows})
        raise KeyboardInterrupt(f"finished rows ({done} of {len(shapes)} shapes) {where}") from None
    print(format_report(rows))
    _write_json(args.json, rows)
    return 0
