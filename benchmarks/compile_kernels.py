"""Every Triton kernel of ``dllm.kernels`` compiled for NVIDIA GPUs on this machine, without one: the
launches its wrappers make at LLaDA-8B's, Dream-7B's, SDAR-8B's and the embedded tiny-llada's shapes
(bfloat16; batch 1 and 8;
a 32-wide block against 1,056 and 4,096 keys), each compiled by Triton's compiler and the ptxas it
bundles (``dllm.kernels.triton.ahead``), with registers per thread, local memory (spills), shared memory and
the blocks per SM these allow on each target; then the attention kernel's tile shapes and warps at
LLaDA-8B's cached step on the first target (what a GPU's timing would choose among).

    python benchmarks/compile_kernels.py [--targets sm90,sm80] [--out benchmarks/results/kernel-compile.txt]

The interpreter (``TRITON_INTERPRET=1``, how the tests run the kernels on a CPU) compiles nothing, so
this is where a kernel that cannot compile, or cannot launch (more shared memory or registers than
a GPU has), shows before a GPU does. It unsets ``TRITON_INTERPRET`` for itself. Triton here is the
one this machine has (``triton.__version__`` in the header); a GPU's may differ.
"""

from __future__ import annotations

import argparse
import os
from pathlib import Path

os.environ.pop("TRITON_INTERPRET", None)  # before triton is imported: the kernels must be compiled ones
os.environ.setdefault("TRITON_DEFAULT_FP_FUSION", "1")  # triton's default, said out loud (it warns otherwise)

import torch  # noqa: E402
import triton  # noqa: E402

from dllm.kernels.triton import ahead  # noqa: E402
from dllm.kernels.triton.launch import Launch, record_launches  # noqa: E402

# (label, heads, kv heads, head dim, d_model, vocab, mask id)
MODELS = (("LLaDA-8B", 32, 32, 128, 4096, 126464, 126336), ("Dream-7B", 28, 4, 128, 3584, 152064, 151666),
          ("SDAR-8B", 32, 8, 128, 4096, 151936, 151669),
          ("tiny-llada", 4, 4, 32, 128, 80, 1))  # the embedded models: a mask id of 1, which Triton specializes
BLOCK, KEYS = 32, (1056, 4096)


def _launches(sms: int) -> list[Launch]:
    """Every launch the wrappers make for the cached steps of the models above, recorded for a GPU of
    ``sms`` SMs (nothing runs; the tensors are CPU placeholders of the right dtypes and shapes)."""
    from dllm.kernels.triton.attention import flash_attention, triton_attention
    from dllm.kernels.triton.fused import rms_norm_triton, rope_rows_triton
    from dllm.kernels.triton.lopa import lopa_propose, lopa_select
    from dllm.kernels.triton.stats import stats_buffers, vocab_stats

    bf16 = torch.bfloat16
    with record_launches(sms) as rec:
        for _, h, hkv, hd, d, vocab, mask_id in MODELS:
            for batch in (1, 8):
                logits = torch.empty(batch, BLOCK, vocab, dtype=bf16)
                vocab_stats(logits, banned=mask_id)  # greedy
                vocab_stats(logits, banned=mask_id, temperature=1.0, uniforms=torch.empty(logits.shape,
                                                                                          dtype=torch.float64))
                vocab_stats(logits, banned=mask_id, temperature=1.0, seed=0)  # Philox
                for keys in KEYS:
                    q = torch.empty(batch, h, BLOCK, hd, dtype=bf16)
                    k = torch.empty(batch, hkv, keys, hd, dtype=bf16)
                    flash_attention(q, k, k)
                    pad = torch.ones(batch, 1, 1, keys, dtype=torch.bool)  # left padding: a key mask
                    triton_attention(q, k, k, pad)
                    flash_attention(q, k, k, return_lse=True, num_splits=1)
            x = torch.empty(1, BLOCK, d, dtype=bf16)
            w = torch.empty(d, dtype=bf16)
            for round_once in (True, False):
                rms_norm_triton(x, w, 1e-6, round_once=round_once)
            heads = torch.empty(1, BLOCK, h + 2 * hkv, hd, dtype=bf16)  # q, k, v heads of the fused projection
            qk = heads[:, :, :h + hkv]
            rms_norm_triton(qk, torch.empty(hd, dtype=bf16), 1e-6, round_once=True,
                            second=(torch.empty(hd, dtype=bf16), h))  # SDAR's q and k norms
            for fp32, table in ((True, torch.float32), (False, bf16)):
                rope_rows_triton(qk, torch.empty(1, BLOCK, 2, 1, hd, dtype=table), fp32=fp32)
        for rows, k_var in ((1, 4), (8, 4), (1, 8)):  # LoPA's step kernels: rows x variants, a 32-wide block
            idx, val = stats_buffers((rows, BLOCK), torch.device("cpu"))
            active = torch.empty(rows, BLOCK, dtype=torch.bool)
            cur = torch.empty(rows, BLOCK, dtype=torch.long)
            variants = torch.empty(rows, k_var, BLOCK, dtype=torch.long)
            at = torch.empty(rows, k_var, dtype=torch.long)
            v_idx, v_val = stats_buffers((rows * k_var, BLOCK), torch.device("cpu"))
            for reuse, conf in ((None, "max_prob"), (torch.zeros(rows, dtype=torch.long), "max_prob"),
                                (None, "negative_entropy")):
                lopa_propose(idx, val, active, cur, k_var - 1, 0.9, conf, rows=reuse)
                lopa_select(v_idx, v_val, idx, active, variants, at, active, 0.9, conf, verify=True, bonus=True,
                            rows=reuse)
    return rec.launches


def rows(target: ahead.Target) -> list[str]:
    """One row per distinct result; ``programs``: how many of the distinct specialisations (argument
    alignments, strides equal to 1, ...) compiled to it."""
    from tqdm import tqdm

    counts: dict[str, int] = {}
    launches = ahead.distinct(_launches(target.sms), target)
    for launch in tqdm(launches, desc=f"compile for {target.name}", unit="program", leave=False):
        c = ahead.compile_launch(launch, target)
        pointers = ahead.pointer_types(launch, target)
        fits = f"{c.blocks_per_sm} ({c.limited_by})" if c.launches else f"CANNOT LAUNCH ({c.limited_by})"
        row = (f"| {c.name} | {pointers} | {c.config} | {c.regs} | {c.local} | {c.shared / 1024:.1f} | "
               f"{c.num_warps} | {fits} |")
        counts[row] = counts.get(row, 0) + 1
    return [f"{row} {n} |" for row, n in counts.items()]


def attention_rows(target: ahead.Target) -> list[str]:
    """The attention kernel's tile shapes and warps at LLaDA-8B's cached step (batch 1, a 32-row block
    against 4,096 keys, split over the keys as planned for the target), num_stages 1 and 3."""
    from dllm.kernels.triton.attention import flash_attention

    q = torch.empty(1, 32, BLOCK, 128, dtype=torch.bfloat16)
    k = torch.empty(1, 32, 4096, 128, dtype=torch.bfloat16)
    out = []
    for block_m in (16, 32, 64):
        for block_n in (32, 64, 128):
            with record_launches(target.sms) as rec:
                flash_attention(q, k, k, block_m=block_m, block_n=block_n)
            first = rec.launches[0]
            for warps in (4, 8):
                got = []
                for stages in (1, 3):
                    kwargs = dict(first.kwargs, num_warps=warps, num_stages=stages)
                    got.append(ahead.compile_launch(Launch(first.name, first.kernel, first.grid, first.args, kwargs),
                                                    target))
                cells = [f"{c.regs} / {c.local} / {c.shared / 1024:.1f} / {c.blocks_per_sm} ({c.limited_by})"
                         for c in got]  # num_stages 1, then 3
                out.append(f"| {block_m} | {block_n} | {warps} | {first.grid} | {cells[0]} | {cells[1]} |")
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--targets", default="sm90,sm80", help=f"comma-separated, of {sorted(ahead.TARGETS)}")
    ap.add_argument("--out", default=None, help="also write the tables to this file")
    args = ap.parse_args()
    names = [t for t in args.targets.split(",") if t]
    bad = [t for t in names if t not in ahead.TARGETS]
    if bad or not names:
        ap.error(f"--targets takes names of {sorted(ahead.TARGETS)}, got {args.targets!r}")
    reason = ahead.unavailable_reason()
    if reason is not None:
        raise SystemExit(f"cannot compile here: {reason}")
    lines = ["# python benchmarks/compile_kernels.py" + (f" --targets {args.targets}" if args.targets != "sm90,sm80"
                                                         else "") + (f" --out {args.out}" if args.out else ""),
             f"# triton {triton.__version__} (from {Path(triton.__file__).parent.parent}), torch {torch.__version__}; compiled here (no GPU): registers per thread, "
             "local memory per thread in bytes (spills), shared memory per block, and blocks per SM (its limit) "
             "from the target's limits"]
    for name in names:
        target = ahead.TARGETS[name]
        lines += ["", f"## {target.name}, {target.sms} SMs", "",
                  "| kernel | pointer arguments | constexprs and options | registers | local B | shared KiB | warps | "
                  "blocks / SM | programs |", "|---|---|---|---|---|---|---|---|---|", *rows(target)]
    sweep = ahead.TARGETS[names[0]]
    lines += ["", f"## flash_attention's tiles at LLaDA-8B's cached step on {sweep.name} (1 x 32 heads, 32 rows, 4,096 "
              "keys, hd 128)", "",
              "| BLOCK_M | BLOCK_N | warps | grid | num_stages 1: registers / local B / shared KiB / blocks per SM | "
              "num_stages 3 (the default) |", "|---|---|---|---|---|---|", *attention_rows(sweep)]
    text = "\n".join(lines)
    print(text)
    if args.out:
        Path(args.out).write_text(text + "\n")


if __name__ == "__main__":
    main()
