"""The everyday ``dllm`` verbs: ``generate``, ``info``, and the listings ``samplers``, ``drafters``,
``tasks`` (flags: ``*_args(parser)``; runs: ``run_*(args)``; rows in ``dllm.cli.table``; ``dllm spec``
is ``dllm.cli.speculative``).

Bad input is an error message and exit status 2, checked before any decoding: ranges by argparse,
everything else by the command before it loads a model (``dllm generate: error: ...``).
"""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any

from dllm.cli.args import add_decode_args, add_model_place, add_quantization, option_dict, output_png


def load_model(args) -> Any:
    """The model ``args.model`` names, at ``--dtype`` / ``--device`` when the command has them."""
    from dllm.models import load

    return load(args.model, dtype=getattr(args, "dtype", None), device=getattr(args, "device", None),
                quantization=getattr(args, "quantization", None))


def generate_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--model", required=True, help="local dir, hub id, or embedded model name")
    add_quantization(p)
    p.add_argument("--prompt", required=True, help="the prompt text (the model's tokenizer encodes it)")
    p.add_argument("--chat", action="store_true", help="apply the model's chat template")
    p.add_argument("--show", action="store_true", help="redraw the canvas as tokens get committed")
    p.add_argument("--stop-at-eos", action="store_true",
                   help="after each block, rows that produced EOS are finished (default: decode every block)")
    add_model_place(p)
    p.add_argument("--order-png", type=output_png, default=None, metavar="PATH",
                   help="also write a heatmap of the step at which each position was committed (.png)")
    p.add_argument("--compile", nargs="?", const="inductor", default=None, metavar="BACKEND",
                   help="torch.compile the transformer layers (default backend: inductor)")
    p.add_argument("--cuda-graphs", action="store_true",
                   help="replay every cached forward as a CUDA graph (a CUDA model and a KV cache; default: off)")
    add_decode_args(p)


def run_generate(args) -> int:
    from dllm.cli.canvas import CanvasView
    from dllm.engine import generate
    from dllm.inputs import model_device

    options = option_dict(args.option)  # checked before loading a model, as --order-png
    if args.order_png:
        import importlib.util

        from dllm.eval.order_plot import check_png_path, plot_order
        check_png_path(args.order_png)
        if importlib.util.find_spec("matplotlib") is None:
            raise ValueError("--order-png needs matplotlib: pip install dllm[eval]")
    model = load_model(args)
    if args.chat:  # the model's own message, ending in what to do with this command's flags
        model.usable_chat_template(hint="drop --chat and give a raw --prompt")
    if args.cuda_graphs and model_device(model).type != "cuda":
        raise ValueError(f"--cuda-graphs replays CUDA graphs: it needs a CUDA model (--device cuda), but the model "
                         f"is on {model_device(model).type}")
    if args.compile:
        from dllm.models.core.compile import compile_model
        compile_model(model, args.compile)
    view = CanvasView(model) if args.show else None
    out = generate(
        model, args.prompt, sampler=args.sampler, gen_length=args.gen_length,
        block_length=args.block_length, steps=args.steps, temperature=args.temperature,
        cfg_scale=args.cfg_scale, seed=args.seed, chat=args.chat, stop_at_eos=args.stop_at_eos,
        cache=args.cache, callback=view, return_trace=bool(args.order_png), cuda_graphs=args.cuda_graphs,
        **options,
    )
    text = out.texts[0] if out.texts else " ".join(map(str, out.generated[0].tolist()))
    print(text)
    if args.order_png:
        path = plot_order(out, args.order_png, tokenizer=model.tokenizer, title=f"{args.model}: {args.sampler}")
        print(f"decoding order: {path}", file=sys.stderr)
    print(json.dumps(out.summary()), file=sys.stderr)
    return 0


def _print_rows(rows: list[tuple[str, ...]]) -> int:
    """Left-aligned name, then the other columns, two spaces apart."""
    width = max(len(r[0]) for r in rows)
    for name, *rest in rows:
        print("  ".join([f"{name:<{width}}", *rest]))
    return 0


def run_samplers(args) -> int:
    from dllm.samplers import list_samplers

    return _print_rows(list_samplers())


def run_drafters(args) -> int:
    from dllm.drafters.base import list_drafters

    return _print_rows(list_drafters())


def run_tasks(args) -> int:
    from dllm.eval.task_eval import list_task_rows

    rows = list_task_rows()
    width = max(len(sizes) for _, sizes, _ in rows)  # "24..2040": wider than the common "3..8"
    return _print_rows([(name, f"{sizes:>{width}}", desc) for name, sizes, desc in rows])


def info_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("model", help="local dir, hub id, or embedded model name")


def run_info(args) -> int:
    model = load_model(args)
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
        "attention": c.attention,  # bidirectional, or block_causal (SDAR, LLaDA 2: with its trained block)
    }
    if c.block_causal:
        info["block_size"] = c.block_size
    moe = getattr(model, "moe_config", None)
    if moe is not None:  # LLaDA 2.x MoE: routed experts, top-k, shared experts
        info.update(n_experts=moe.n_experts, experts_per_token=moe.top_k, shared_experts=moe.n_shared)
    return _print_rows([(k, str(v)) for k, v in info.items()])
