"""Tensor / expert parallelism checked against one process, and its memory per rank.

Check (float32, gloo on CPU; rank 0 prints the table and writes --out):

    python -m torch.distributed.run --nproc-per-node 2 benchmarks/tensor_parallel.py --out tp2.json

Every rank loads each model whole and split (``dllm.load(..., tensor_parallel=N[, expert_parallel=True])``),
compares one forward's logits, decodes a ragged batch with three samplers and every cache the family
takes (none / dual / block; a cache a family refuses must be refused by both), checks the split's
tokens equal the whole model's and all ranks' tokens agree, and counts the parameter bytes each rank
holds. The models are tiny random checkpoints of every family in the official layouts, made by rank
0 under --models (8 query / 4 KV heads, so 2 and 4 ranks divide them).

Shapes (one process, no weights: the models are built on the meta device and split there):

    python benchmarks/tensor_parallel.py --shapes

gives the parameter bytes per rank of LLaDA-8B, Dream-7B, SDAR-8B and LLaDA 2.0-mini's shapes at
1 / 2 / 4 / 8 ranks (the embedding and LM head are replicated, everything else split).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

import torch

import dllm

SAMPLERS = ("low_confidence", "threshold", "fast", "dmax")  # dmax: soft inputs through the split embedding
CACHES = ("none", "dual", "block")
PROMPTS = [list(range(20, 28)), list(range(30, 46)), list(range(50, 58))]  # ragged; whole blocks of 4 and 8
FAMILIES = ("llada", "dream", "sdar", "fastdllm_v2", "llada2")
SPECS = ("llada", "dream", "sdar", "fastdllm_v2", "llada2", "llada2:ep", "target:tiny-ar")  # ":ep": expert_parallel


def param_bytes(model: torch.nn.Module) -> int:
    return sum(p.numel() * p.element_size() for p in model.parameters())


def make_models(root: Path) -> None:
    """The tiny random checkpoints (official layouts) the check loads."""
    from dllm.models.tiny import tiny

    for family in FAMILIES:
        if (root / family / "config.json").is_file():
            continue
        extra = dict(attn_head_dim=8, rope_dim=4) if family == "llada2" else dict(d_model=64, mlp_hidden=128)
        tiny(family, n_heads=8, n_kv_heads=4, **extra).save_pretrained(root / family)


def check(path: Path, expert_parallel: bool, n: int) -> dict:
    from dllm.models.parallel.objects import all_gather_object  # (a rank's last collective: released before exit)

    whole = dllm.load(path, dtype="float32")
    split = dllm.load(path, dtype="float32", tensor_parallel=n, expert_parallel=expert_parallel)
    ids = torch.tensor([PROMPTS[1]])
    with torch.inference_mode():
        diff = (whole.transformer(ids, torch.arange(ids.shape[1])[None])[0]
                - split.transformer(ids, torch.arange(ids.shape[1])[None])[0]).abs().max()
    out = {"model": path.name + (":ep" if expert_parallel else ""), "logits_max_abs_diff": float(diff),
           "param_bytes_whole": param_bytes(whole), "param_bytes_rank": param_bytes(split),
           "kv_heads_rank": split.transformer.config.n_kv_heads, "runs": []}
    for sampler in SAMPLERS:
        for cache in CACHES:
            kwargs = dict(gen_length=8, block_length=whole.block_size or 4, steps=4, cache=cache)
            try:
                want = dllm.generate(whole, PROMPTS, sampler, **kwargs).generated.tolist()
            except ValueError:  # a cache this family does not take: the split model must refuse it too
                try:
                    dllm.generate(split, PROMPTS, sampler, **kwargs)
                    out["runs"].append({"sampler": sampler, "cache": cache, "equal": False, "ranks_agree": True,
                                        "note": "the split model took a cache the whole one refused"})
                except ValueError:
                    pass
                continue
            got = dllm.generate(split, PROMPTS, sampler, **kwargs).generated.tolist()
            every = all_gather_object(got)
            out["runs"].append({"sampler": sampler, "cache": cache, "equal": got == want,
                                "ranks_agree": all(e == every[0] for e in every)})
    return out


TARGET_PROMPTS = ["[BOS] copy_long G N J M O G G M P I A P M G O N H O G N L B E N C I L N N I I K [SEP]",
                  "[BOS] reverse_long J L D H C E E B A J O M N K G I H O F F C F O J D P P M O H L B [SEP]"]
DRAFTERS = ("ngram", "dflash:model=tiny-ar-dflash")


def check_target(name: str, n: int) -> dict:
    """``speculative_generate`` with a target split by transformers' tensor-parallel plan
    (``load_target(..., tensor_parallel=N)``) against the whole target: greedy, a ragged batch."""
    from dllm.models.parallel.objects import all_gather_object

    whole, tok = dllm.load_target(name, dtype="float32")
    split, _ = dllm.load_target(name, dtype="float32", tensor_parallel=n)
    out = {"model": f"target {name}", "runs": [], "logits_max_abs_diff": None,  # (not measured)
           "param_bytes_whole": param_bytes(whole), "param_bytes_rank": local_param_bytes(split),
           "kv_heads_rank": None}
    for drafter in DRAFTERS:
        want = dllm.speculative_generate(whole, drafter, TARGET_PROMPTS, max_new_tokens=40, tokenizer=tok)
        got = dllm.speculative_generate(split, drafter, TARGET_PROMPTS, max_new_tokens=40, tokenizer=tok)
        every = all_gather_object(got.generated)
        out["runs"].append({"sampler": drafter, "cache": "-", "equal": got.generated == want.generated,
                            "ranks_agree": all(e == every[0] for e in every)})
    return out


def target_splits(name: str, n: int) -> bool:
    """Whether N divides the target's KV heads (tiny-ar has 2: checked at 2 ranks, not at 4)."""
    from dllm.models.loading import locate, read_config

    return read_config(locate(name))["num_key_value_heads"] % n == 0


def local_param_bytes(model: torch.nn.Module) -> int:
    """Bytes this rank holds (a DTensor parameter counts its local shard)."""
    total = 0
    for p in model.parameters():
        local = p.to_local() if hasattr(p, "to_local") else p
        total += local.numel() * local.element_size()
    return total


def run_check(args: argparse.Namespace) -> int:
    import torch.distributed as dist

    n = int(os.environ["WORLD_SIZE"])
    dist.init_process_group("gloo")
    root = Path(args.models)
    if dist.get_rank() == 0:
        make_models(root)
    dist.barrier()
    results = [check_target(spec.split(":", 1)[1], n) if spec.startswith("target:")
               else check(root / spec.split(":")[0], spec.endswith(":ep"), n) for spec in args.specs
               if not spec.startswith("target:") or target_splits(spec.split(":", 1)[1], n)]
    if dist.get_rank() == 0:
        print(f"{n} ranks (gloo, float32), ragged batch of {len(PROMPTS)}, samplers {', '.join(SAMPLERS)}")
        print("| model | runs (caches, or drafters of a target) | tokens equal | ranks agree | max |logit diff| | "
              "params per rank / whole |")
        print("|---|---|---|---|---|---|")
        for r in results:
            runs = r["runs"]
            kinds = sorted({x["cache"] for x in runs}) if runs[0]["cache"] != "-" else [x["sampler"] for x in runs]
            print(f"| {r['model']} | {len(runs)} ({', '.join(kinds)}) | "
                  f"{sum(x['equal'] for x in runs)}/{len(runs)} | {sum(x['ranks_agree'] for x in runs)}/{len(runs)} | "
                  f"{'-' if r['logits_max_abs_diff'] is None else format(r['logits_max_abs_diff'], '.1e')} | "
                  f"{r['param_bytes_rank'] / r['param_bytes_whole']:.3f} |")
        if args.out:
            Path(args.out).write_text(json.dumps({"world": n, "results": results}, indent=1))
    dist.destroy_process_group()
    return 0


# (family, TransformerConfig fields, MoE fields or None): the released models' sizes
SHAPES = {
    "LLaDA-8B": ("llada", dict(vocab_size=126464, d_model=4096, n_layers=32, n_heads=32, n_kv_heads=32,
                              mlp_hidden=12288), None),
    "Dream-7B": ("dream", dict(vocab_size=152064, d_model=3584, n_layers=28, n_heads=28, n_kv_heads=4,
                              mlp_hidden=18944, qkv_bias=True, rope_fp32=False, rms_eps=1e-6), None),
    "SDAR-8B": ("sdar", dict(vocab_size=151936, d_model=4096, n_layers=36, n_heads=32, n_kv_heads=8,
                            mlp_hidden=12288, attn_head_dim=128, qk_norm=True, attention="block_causal",
                            block_size=4, rope_fp32=False, rms_eps=1e-6, norm_round_once=True), None),
    "LLaDA2.0-mini": ("llada2", dict(vocab_size=157184, d_model=2048, n_layers=20, n_heads=16, n_kv_heads=4,
                                    mlp_hidden=5120, attn_head_dim=128, qk_norm=True, attention="block_causal",
                                    block_size=32, rope_dim=64, rope_fp32=False, rms_eps=1e-6),
                      dict(n_experts=256, top_k=8, expert_hidden=512, n_shared=1, n_group=8, topk_group=4,
                           routed_scaling=2.5, first_dense=1)),
}


def shapes_table() -> str:
    """Parameter bytes per rank (bf16) of the released shapes, split on the meta device."""
    from dllm.models.core.config import TransformerConfig
    from dllm.models.core.layer.moe import MoEConfig
    from dllm.models.families.registry import family_class
    from dllm.models.inputs import SpecialIds
    from dllm.models.parallel.plan import ParallelPlan, check_plan
    from dllm.models.parallel.shard import TensorParallel, splits_vocab

    lines = ["| model | ranks | expert parallel | GiB per rank (bf16) | / one process |", "|---|---|---|---|---|"]
    for name, (family, fields, moe_fields) in SHAPES.items():
        cfg = TransformerConfig(**fields)
        moe = MoEConfig(**moe_fields) if moe_fields else None
        special = SpecialIds(mask_id=fields["vocab_size"] - 1, eos_id=fields["vocab_size"] - 2,
                             pad_id=fields["vocab_size"] - 2)
        whole = None
        for n in (1, 2, 4, 8):
            for ep in ((False, True) if moe else (False,)):
                try:
                    check_plan(cfg, n, moe=moe, expert_parallel=ep)
                except ValueError as err:
                    lines.append(f"| {name} | {n} | {'yes' if ep else 'no'} | refused: {err} | |")
                    continue
                with torch.device("meta"):
                    model = family_class(family)(cfg, special, **({"moe": moe} if moe else {}))
                model.to(torch.bfloat16)
                if n > 1:
                    TensorParallel(ParallelPlan(n, 0, ep), None, moe, splits_vocab(cfg, n)).shard_modules(model)
                size = param_bytes(model)
                whole = size if n == 1 else whole
                lines.append(f"| {name} | {n} | {'yes' if ep else 'no'} | {size / 2**30:.2f} | {size / whole:.3f} |")
    return "\n".join(lines)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--shapes", action="store_true", help="per-rank parameter memory of released shapes (no torchrun)")
    ap.add_argument("--models", default="/tmp/dllm-tp-models", help="where rank 0 writes the tiny checkpoints")
    ap.add_argument("--specs", nargs="+", default=list(SPECS), help=f"models to check (default: {' '.join(SPECS)})")
    ap.add_argument("--out", default=None, help="write the verdicts as JSON (rank 0)")
    args = ap.parse_args(argv)
    torch.set_num_threads(1)
    if args.shapes:
        print(shapes_table())
        return 0
    if "WORLD_SIZE" not in os.environ:
        ap.error("run under torchrun: python -m torch.distributed.run --nproc-per-node 2 benchmarks/tensor_parallel.py")
    return run_check(args)


if __name__ == "__main__":
    sys.exit(main())
