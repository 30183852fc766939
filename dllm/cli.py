"""The ``dllm`` command: ``generate``, ``samplers``, ``info``, ``tasks``, ``eval-tasks``, ``compare``,
``stress``, ``bench``, and speculative decoding of autoregressive targets: ``spec``, ``drafters``.

Bad input is an error message and exit status 2, checked before any decoding: ranges by argparse
(``argument --n: must be an integer >= 1, got 0``), everything else by the command before it loads
a model (``dllm compare: error: ...``).
"""

from __future__ import annotations

import argparse
import importlib
import json
import sys
from typing import Any, Callable, Optional, Sequence

from dllm.cli_spec import add_spec_command
from dllm.registry import parse_option


def _option(text: str) -> tuple[str, Any]:
    """``-o NAME=VALUE``: one option, values read as in a spec string (``dllm.registry.parse_option``)."""
    try:
        return parse_option(text, "sampler option")
    except ValueError as err:
        raise argparse.ArgumentTypeError(str(err)) from None


def _at_least(low: int) -> Callable[[str], int]:
    """An argparse type: an integer >= ``low``."""

    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"must be an integer >= {low}, got {text!r}") from None
        if value < low:
            raise argparse.ArgumentTypeError(f"must be an integer >= {low}, got {value}")
        return value

    return parse


POSITIVE = _at_least(1)


def _add_threads(p: argparse.ArgumentParser, note: str = "default: torch's choice") -> None:
    p.add_argument("--threads", type=POSITIVE, default=None, help=f"torch CPU threads ({note})")


def _add_decode_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--sampler", default="low_confidence",
                   help="sampler spec: a registered name (see `dllm samplers`), options allowed "
                        "(threshold:threshold=0.8)")
    p.add_argument("--gen-length", type=int, default=64)
    p.add_argument("--block-length", type=int, default=None, help="default: gen-length (one block)")
    p.add_argument("--steps", type=int, default=None, help="default: gen-length (one token per step)")
    p.add_argument("--temperature", type=float, default=0.0)
    p.add_argument("--cfg-scale", type=float, default=0.0)
    p.add_argument("--seed", type=int, default=None)
    p.add_argument("--option", "-o", action="append", type=_option, default=[],
                   metavar="NAME=VALUE", help="sampler option, repeatable (e.g. -o top_p=0.95)")
    p.add_argument("--cache", default="none", metavar="SPEC",
                   help="cache policy spec: none, prefix, dual, window, with options (dual:refresh=4)")
    _add_threads(p)


def _load(args) -> Any:
    from dllm.models import load

    return load(args.model, dtype=getattr(args, "dtype", None), device=getattr(args, "device", None))


class CanvasView:
    """Redraws the generated canvas in the terminal as positions get committed."""

    MASK = "\u2591"

    def __init__(self, model, stream=None) -> None:
        self.model = model
        self.stream = stream or sys.stdout
        self.tty = self.stream.isatty()
        self.lines = 0

    def render(self, state) -> str:
        tok = self.model.tokenizer
        ids = state.generated[0].tolist()
        pieces = []
        for t in ids:
            if t == state.mask_id:
                pieces.append(self.MASK)
            elif tok is not None:
                pieces.append(tok.convert_ids_to_tokens(t) or f"<{t}>")  # rows past the tokenizer
            else:
                pieces.append(str(t))
        return f"[step {state.step:3d} | nfe {state.nfe:3d}] " + " ".join(pieces)

    def __call__(self, state) -> None:
        text = self.render(state)
        if self.tty and self.lines:
            self.stream.write(f"\x1b[{self.lines}A\x1b[J")
        self.stream.write(text + "\n")
        self.stream.flush()
        self.lines = text.count("\n") + 1 + len(text) // 120 if self.tty else 0


def cmd_generate(args) -> int:
    from dllm.engine import generate

    if args.order_png:  # checked before loading a model
        import importlib.util

        from dllm.eval.order_plot import check_png_path, plot_order
        check_png_path(args.order_png)
        if importlib.util.find_spec("matplotlib") is None:
            raise ValueError("--order-png needs matplotlib: pip install dllm[eval]")
    _set_threads(args)
    model = _load(args)
    if args.compile:
        from dllm.models.compile import compile_model
        compile_model(model, args.compile)
    view = CanvasView(model) if args.show else None
    out = generate(
        model, args.prompt, sampler=args.sampler, gen_length=args.gen_length,
        block_length=args.block_length, steps=args.steps, temperature=args.temperature,
        cfg_scale=args.cfg_scale, seed=args.seed, chat=args.chat, stop_at_eos=args.stop_at_eos,
        cache=args.cache, callback=view, return_trace=bool(args.order_png), **dict(args.option),
    )
    text = out.texts[0] if out.texts else " ".join(map(str, out.generated[0].tolist()))
    print(text)
    if args.order_png:
        path = plot_order(out, args.order_png, tokenizer=model.tokenizer, title=f"{args.model}: {args.sampler}")
        print(f"decoding order: {path}", file=sys.stderr)
    print(json.dumps(out.summary()), file=sys.stderr)
    return 0


def _print_rows(rows: list[tuple[str, str]]) -> int:
    width = max(len(n) for n, _ in rows)
    for name, desc in rows:
        print(f"{name:<{width}}  {desc}")
    return 0


def cmd_samplers(args) -> int:
    from dllm.samplers import list_samplers

    return _print_rows(list_samplers())


def cmd_drafters(args) -> int:
    from dllm.drafters.base import list_drafters

    return _print_rows(list_drafters())


def cmd_info(args) -> int:
    model = _load(args)
    c = model.config
    n_params = sum(p.numel() for p in model.parameters())
    info = {
        "family": model.family, "parameters": n_params, "dtype": str(model.dtype).replace("torch.", ""),
        "vocab_size": c.vocab_size, "d_model": c.d_model, "n_layers": c.n_layers, "n_heads": c.n_heads,
        "n_kv_heads": c.n_kv_heads, "mlp_hidden": c.mlp_hidden, "max_positions": model.max_positions,
        "rope_theta": c.rope_theta, "mask_id": model.mask_id, "eos_id": model.eos_id,
        "eot_id": model.eot_id, "pad_id": model.pad_id, "bos_id": model.bos_id,
        "tokenizer": type(model.tokenizer).__name__ if model.tokenizer is not None else None,
        "attn_backend": model.attn_backend,
    }
    width = max(map(len, info))
    for k, v in info.items():
        print(f"{k:<{width}}  {v}")
    return 0


def cmd_bench(args) -> int:
    from dllm.eval.bench.throughput import run_throughput

    _set_threads(args)
    run_throughput(args)
    return 0


def cmd_tasks(args) -> int:
    from dllm.eval.task_eval import list_task_rows

    rows = list_task_rows()
    width = max(len(r[0]) for r in rows)
    for name, sizes, desc in rows:
        print(f"{name:<{width}}  {sizes:>6}  {desc}")
    return 0


def _set_threads(args) -> None:
    """``--threads N``: torch CPU threads (None: torch's choice)."""
    if getattr(args, "threads", None) is not None:
        import torch

        torch.set_num_threads(args.threads)


def cmd_eval_tasks(args) -> int:
    from dllm.eval.task_eval import run_eval_tasks

    _set_threads(args)
    run_eval_tasks(args)
    return 0


def cmd_compare(args) -> int:
    from dllm.eval.compare import run_compare

    _set_threads(args)
    run_compare(args)
    return 0


def cmd_stress(args) -> int:
    from dllm.eval.stress.sweep import run_stress_cli

    _set_threads(args)
    return run_stress_cli(args)


def cmd_bench_caches(args) -> int:
    from dllm.eval.bench.caches import format_table, run_cache_bench
    from dllm.models import load, tiny

    _set_threads(args)
    if args.model.startswith("tiny-random-") and args.layers:
        family = args.model.removeprefix("tiny-random-")
        model = tiny(family, seed=0, n_layers=args.layers, max_positions=args.prompt_length + args.gen_length)
        if args.device:
            model = model.to(args.device)
        label = f"tiny random {family}, {args.layers} layers"
    else:
        model = load(args.model, dtype=args.dtype, device=args.device)
        label = args.model
    rows = run_cache_bench(model, args.prompt_length, args.gen_length, args.block_length,
                           samplers=args.samplers, policies=args.caches, repeats=args.repeats,
                           progress=not args.no_progress)
    print(f"{label}: prompt {args.prompt_length}, gen {args.gen_length}, block {args.block_length}")
    print(format_table(rows))
    if args.json:
        with open(args.json, "w") as f:
            json.dump(rows, f, indent=2, default=str)
    return 0


def cmd_bench_kernels(args) -> int:
    from dllm.eval.bench.kernels import format_table, run_kernel_bench

    rows = run_kernel_bench(device=args.device, repeats=args.repeats)
    print(format_table(rows))
    if args.json:
        with open(args.json, "w") as f:
            json.dump(rows, f, indent=2, default=str)
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="dllm", description="Fast decoding for diffusion language models")
    sub = parser.add_subparsers(dest="command", required=True)

    g = sub.add_parser("generate", help="decode a prompt with a sampler")
    g.add_argument("--model", required=True, help="local dir, hub id, or embedded model name")
    g.add_argument("--prompt", required=True)
    g.add_argument("--chat", action="store_true", help="apply the model's chat template")
    g.add_argument("--show", action="store_true", help="redraw the canvas as tokens get committed")
    g.add_argument("--stop-at-eos", action="store_true")
    g.add_argument("--dtype", default=None)
    g.add_argument("--device", default=None)
    g.add_argument("--order-png", default=None, metavar="PATH",
                   help="also write a heatmap of the step at which each position was committed (.png)")
    g.add_argument("--compile", nargs="?", const="inductor", default=None, metavar="BACKEND",
                   help="torch.compile the transformer layers (default backend: inductor)")
    _add_decode_args(g)
    g.set_defaults(func=cmd_generate)

    s = sub.add_parser("samplers", help="list the registered samplers")
    s.set_defaults(func=cmd_samplers)

    add_spec_command(sub, POSITIVE, _add_threads)

    dr = sub.add_parser("drafters", help="list the registered drafters")
    dr.set_defaults(func=cmd_drafters)

    i = sub.add_parser("info", help="family, sizes and special ids of a model")
    i.add_argument("model")
    i.set_defaults(func=cmd_info)

    tk = sub.add_parser("tasks", help="list the stress tasks")
    tk.set_defaults(func=cmd_tasks)

    ev = sub.add_parser("eval-tasks", help="exact match on the stress-task test split at k tokens per step")
    ev.add_argument("--model", required=True)
    ev.add_argument("--tasks", nargs="*", default=None, help="default: every task")
    ev.add_argument("--k", type=int, nargs="*", default=None,
                    help="tokens per step, fixed-step samplers only (default: 1)")
    ev.add_argument("--per-size", type=POSITIVE, default=4, help="test examples per task size")
    ev.add_argument("--skip", type=int, default=0,
                    help="start at test instance SKIP of each size (a sample disjoint from --per-size SKIP's)")
    ev.add_argument("--sampler", default="low_confidence",
                    help="sampler spec; an adaptive one gets a single column and no --k")
    ev.add_argument("--dtype", default="float32")
    ev.add_argument("--device", default=None)
    ev.add_argument("--json", default=None)
    _add_threads(ev, "1 on a busy machine")
    ev.set_defaults(func=cmd_eval_tasks)

    c = sub.add_parser("compare", help="samplers side by side on the stress tasks")
    c.add_argument("--model", default="tiny-llada", help="model path/name (default: the embedded tiny-llada), or 'oracle' (exact posteriors)")
    c.add_argument("--samplers", nargs="*", default=None,
                   help="sampler specs: name or name:key=value,... (k=N: N tokens per step)")
    c.add_argument("--tasks", nargs="*", default=None, help="default: every task")
    c.add_argument("--n", type=POSITIVE, default=4, help="test examples per task")
    c.add_argument("--block-length", type=POSITIVE, default=None, help="default: the answer length")
    c.add_argument("--repeats", type=POSITIVE, default=1,
                   help="timed runs per sampler, interleaved; the median wall time is reported")
    c.add_argument("--out", default="runs/compare", help="a directory: compare.json and compare.png")
    c.add_argument("--dtype", default="float32")
    c.add_argument("--device", default=None)
    c.add_argument("--no-progress", action="store_true")
    _add_threads(c, "1 on a busy machine")
    c.set_defaults(func=cmd_compare)

    st = sub.add_parser("stress", help="ParallelBench-style sweep: samplers x parallelism x tasks, accuracy vs "
                                       "tokens per step (resumable)")
    st.add_argument("--model", default="tiny-llada",
                    help="model path/name, 'oracle' (exact posteriors) or 'oracle:noise_std=0.05' (with logit noise)")
    st.add_argument("--grid", action="append", default=None, metavar="SPEC",
                    help="repeatable; one sampler family: SAMPLER[:OPTION=V1,V2,...,OPTION=V,...], k = tokens "
                         "per step (low_confidence:k=1,2,4,8 threshold:threshold=0.5,0.7,0.9); default: sweeps "
                         "of low_confidence, random, threshold, factor, and fast (dllm.eval.stress.grid)")
    st.add_argument("--block-lengths", default="0", metavar="B1,B2,...",
                    help="semi-autoregressive block lengths crossed with every setting (0 = one block)")
    st.add_argument("--tasks", nargs="*", default=None, help="default: the PB-mini suite")
    st.add_argument("--per-size", type=POSITIVE, default=4, help="test examples per task size")
    st.add_argument("--out", default="runs/stress", help="a directory: stress.json, stress.txt, PNGs")
    st.add_argument("--resume", action="store_true", help="continue OUT/stress.json (same model, tasks, grid)")
    st.add_argument("--dtype", default="float32")
    st.add_argument("--device", default=None)
    st.add_argument("--no-progress", action="store_true")
    _add_threads(st, "1 on a busy machine")
    st.set_defaults(func=cmd_stress)

    b = sub.add_parser("bench", help="benchmarks")
    bsub = b.add_subparsers(dest="bench", required=True)
    t = bsub.add_parser("throughput", help="forward and generate throughput of a model")
    t.add_argument("--model", default="tiny-random-llada")
    t.add_argument("--prompt-length", type=POSITIVE, default=64)
    t.add_argument("--batch-size", type=POSITIVE, default=1)
    t.add_argument("--repeats", type=POSITIVE, default=3)
    t.add_argument("--dtype", default=None)
    t.add_argument("--device", default=None)
    t.add_argument("--json", default=None, help="also write the results to this JSON file")
    _add_decode_args(t)
    t.set_defaults(func=cmd_bench)
    kc = bsub.add_parser("caches", help="cache policies x samplers on a long prompt, side by side")
    kc.add_argument("--model", default="tiny-random-llada",
                    help="a model; tiny-random-{llada,dream} with --layers builds a fresh random one")
    kc.add_argument("--layers", type=POSITIVE, default=8)
    kc.add_argument("--prompt-length", type=POSITIVE, default=1024)
    kc.add_argument("--gen-length", type=int, default=256)
    kc.add_argument("--block-length", type=int, default=32)
    kc.add_argument("--samplers", nargs="*", default=["low_confidence", "threshold"], help="sampler specs")
    kc.add_argument("--caches", nargs="*", default=["none", "prefix", "dual", "window"],
                    help="cache policy specs (dual:look_back=16)")
    kc.add_argument("--repeats", type=POSITIVE, default=1)
    kc.add_argument("--no-progress", action="store_true")
    _add_threads(kc)
    kc.add_argument("--dtype", default=None)
    kc.add_argument("--device", default=None)
    kc.add_argument("--json", default=None)
    kc.set_defaults(func=cmd_bench_caches)
    kk = bsub.add_parser("kernels", help="attention backends and the fused vocabulary-statistics kernel "
                                         "vs sdpa / the reference (GPU shapes on a GPU, small ones on CPU)")
    kk.add_argument("--device", default=None)
    kk.add_argument("--repeats", type=POSITIVE, default=5)
    kk.add_argument("--json", default=None)
    kk.set_defaults(func=cmd_bench_kernels)
    for name, (_, text) in DELEGATED_BENCHES.items():  # their flags (--help too) are their modules' own
        kd = bsub.add_parser(name, add_help=False, help=text)
        kd.add_argument("rest", nargs=argparse.REMAINDER)
        kd.set_defaults(func=cmd_bench_delegated)
    return parser


# `dllm bench NAME ...` handed whole to NAME's module main(argv): (module, help)
DELEGATED_BENCHES: dict[str, tuple[str, str]] = {
    "spec": ("dllm.eval.spec.bench", "speculative decoding of an AR target: drafters vs target.generate, "
                                     "assisted generation, prompt lookup"),
    "breakdown": ("dllm.eval.bench.breakdown", "where a decode step's time goes at LLaDA-8B width (per layer, "
                                               "head, statistics, engine)"),
    "e2e": ("dllm.eval.bench.e2e", "end to end: the recommended setting against Fast-dLLM's (threshold + dual) on the "
                             "accuracy / tokens-per-second plane, every model / suite pair"),
}


def cmd_bench_delegated(args) -> int:
    module = importlib.import_module(DELEGATED_BENCHES[args.bench][0])
    return module.main(args.rest[1:] if args.rest[:1] == ["--"] else args.rest)


def main(argv: Optional[Sequence[str]] = None) -> int:
    parser = build_parser()
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv[:1] == ["bench"] and argv[1:2] and argv[1] in DELEGATED_BENCHES:  # their own flags, --help too
        argv = [*argv[:2], "--", *argv[2:]]
    args = parser.parse_args(argv)
    try:
        return args.func(args)
    except (ValueError, TypeError, KeyError, OSError, NotImplementedError) as err:
        print(f"dllm {args.command}: error: {err}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
