"""Kernel benchmark: the Triton kernels against the PyTorch paths they replace, shape by shape.

``run_kernel_bench(shapes, backends)`` returns one dict per (shape, backend):

- ``kind``: "attention" (a cached step: a query block against the whole key set, LLaDA/Dream
  heads, a key-padding mask), "stats" (per-row vocabulary statistics over [N, V] logits) or "lopa"
  (``fast``'s sampler step with a free forward: the fused statistics and LoPA's two selection kernels
  as ``triton``, the torch statistics and ops as ``reference``);
- ``shape``: a readable label, e.g. ``B1-H32-Hkv32-Tq32-Tk2048-D128-bf16-pad16``;
- ``backend``: an attention backend name (``triton``, ``sdpa``, ``reference``), ``auto`` (a fresh
  ``dllm.kernels.autotune.AutoAttention``: its probe runs in the warm-up, ``note`` says what it
  chose), or, for stats,
  ``triton`` (``dllm.kernels.triton.stats.vocab_stats``) / ``reference`` (the float64 PyTorch computation the
  samplers do today, ``reference.vocab_stats_reference``);
- ``ms``: median wall time per call over ``repeats`` (after ``warmup`` calls), device-synchronised;
  None when the backend cannot run here (``note`` says why);
- ``speedup``: baseline ms / this ms, baseline = sdpa for attention (reference when sdpa is not
  run) and reference for stats;
- ``vs_sdpa`` (attention): this ms / sdpa's ms on the same shape, the time as a ratio to sdpa
  (below 1: faster than sdpa); None without an sdpa time;
- ``max_abs_err``: against the reference backend on the same inputs (attention output; stats:
  the largest error over the float fields, and ``argmax`` agreement in ``note``);
- ``interpreted``: the Triton kernels ran under TRITON_INTERPRET=1 (CPU): timings are meaningless.

``default_shapes(device)`` gives realistic shapes on a GPU (LLaDA-8B: H 32, D 128; Dream-7B GQA:
H 28 / Hkv 4; prompts 1k-8k, blocks of 8-64 queries; vocabulary 126,464) and small ones on CPU, so
the command keeps working everywhere; ``tiny_shapes()`` the smallest (a CPU smoke run in seconds).
``dllm.eval.bench.kernel_report`` renders the rows (``format_report``: every row, then each attention
shape's time over sdpa's and what ``auto`` chose).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Optional, Sequence, Union

import torch

from dllm.eval.bench.kernel_tiles import Tile, tiled_attention
from dllm.eval.bench.timing import timed

_DTYPES = {"fp32": torch.float32, "fp16": torch.float16, "bf16": torch.bfloat16}


@dataclass(frozen=True)
class AttnShape:
    """A cached step: ``q_len`` queries (the block) against ``kv_len`` keys, ``pad`` of them padding."""

    batch: int
    heads: int
    kv_heads: int
    q_len: int
    kv_len: int
    head_dim: int
    dtype: str = "bf16"
    pad: int = 0  # left-padded keys per row (a key-padding mask is passed when > 0)

    @property
    def label(self) -> str:
        return (f"B{self.batch}-H{self.heads}-Hkv{self.kv_heads}-Tq{self.q_len}-Tk{self.kv_len}-"
                f"D{self.head_dim}-{self.dtype}" + (f"-pad{self.pad}" if self.pad else ""))


@dataclass(frozen=True)
class StatsShape:
    """``rows`` positions (the block window of every batch row) over a ``vocab``-wide vocabulary."""

    rows: int
    vocab: int
    dtype: str = "bf16"
    temperature: float = 0.0

    @property
    def label(self) -> str:
        return f"N{self.rows}-V{self.vocab}-{self.dtype}" + (f"-T{self.temperature:g}" if self.temperature else "")


@dataclass(frozen=True)
class LoPAShape:
    """One ``fast`` step's sampler work with a free forward: ``batch`` rows, a block of ``width``
    positions, a ``vocab``-wide vocabulary, ``fast``'s three variants (their logits made beforehand)."""

    batch: int
    width: int
    vocab: int
    dtype: str = "bf16"

    @property
    def label(self) -> str:
        return f"fast-step-B{self.batch}-W{self.width}-V{self.vocab}-{self.dtype}"


Shape = Union[AttnShape, StatsShape, LoPAShape]


def default_shapes(device: torch.device) -> list[Shape]:
    if device.type == "cuda":
        return [
            *(AttnShape(1, 32, 32, 32, tk, 128, "bf16", pad=16) for tk in (1024, 2048, 4096)),  # LLaDA-8B
            AttnShape(8, 32, 32, 32, 2048, 128, "bf16", pad=64),
            AttnShape(1, 28, 4, 32, 2048, 128, "bf16", pad=16),  # Dream-7B (GQA 7:1)
            AttnShape(1, 32, 32, 256, 2048, 128, "bf16"),  # prefix policy: block + everything right of it
            *(AttnShape(1, 32, 32, tq, tk, 128, "bf16", pad=16)  # decode blocks of 8-64 against 512-8k keys
              for tq, tk in ((8, 512), (8, 4096), (16, 2048), (64, 2048), (32, 8192), (64, 8192))),
            StatsShape(32, 126464, "bf16"),
            StatsShape(32, 126464, "bf16", temperature=1.0),
            StatsShape(256, 126464, "bf16"),
            LoPAShape(1, 32, 126464, "bf16"),
            LoPAShape(8, 32, 126464, "bf16"),
        ]
    return [  # CPU: small enough for the Triton interpreter (~2.5 ms per program and tile)
        AttnShape(1, 4, 4, 32, 256, 64, "fp32", pad=16),
        AttnShape(1, 4, 2, 32, 256, 64, "fp16"),
        StatsShape(8, 4096, "fp32"),
        StatsShape(8, 4096, "fp32", temperature=1.0),
        LoPAShape(1, 8, 4096, "fp32"),
    ]


def tiny_shapes() -> list[Shape]:
    """The smallest meaningful shapes: a CPU smoke run (Triton interpreted) in seconds."""
    return [AttnShape(1, 2, 1, 16, 64, 32, "fp32", pad=8), StatsShape(2, 256, "fp32"), LoPAShape(1, 8, 256, "fp32")]


def _time_ms(fn: Callable[[], Any], device: torch.device, repeats: int, warmup: int) -> float:
    return timed(fn, device, repeats=repeats, warmup=warmup).seconds * 1e3


def _triton_refusal() -> Optional[str]:
    from dllm.kernels.attention import backends

    return backends.get("triton").refusal(need_probs=False)


def _interpreted() -> bool:
    if _triton_refusal() is not None:
        return False
    from dllm.kernels.triton.attention import _attn_fwd_kernel, _interpreted as interp

    return interp(_attn_fwd_kernel)


def _kernel_refusal(dtype: torch.dtype) -> Optional[str]:
    """Why a Triton kernel of ``dtype`` cannot run here (no Triton backend, or bfloat16 in the
    interpreter); None: it can."""
    return _triton_refusal() or _bf16_refusal(dtype)


def _bf16_refusal(dtype: torch.dtype) -> Optional[str]:
    """Why a Triton kernel cannot take ``dtype`` here: bfloat16 in the interpreter (None: it can)."""
    return "triton: bf16 is not supported by the interpreter" if dtype == torch.bfloat16 and _interpreted() else None


def _row(kind: str, shape: Shape, backend: str) -> dict[str, Any]:
    """A result row before its backend ran (``ms`` None until timed)."""
    return {"kind": kind, "shape": shape.label, "backend": backend, "ms": None, "speedup": None,
            "max_abs_err": None, "note": ""}


def _attention_rows(shape: AttnShape, backends: Sequence[str], device: torch.device, repeats: int,
                    warmup: int, seed: int) -> list[dict[str, Any]]:
    from dllm.kernels.attention import backends as registry

    g = torch.Generator(device=device).manual_seed(seed)
    dt = _DTYPES[shape.dtype]
    q = torch.randn(shape.batch, shape.heads, shape.q_len, shape.head_dim, generator=g, device=device).to(dt)
    k = torch.randn(shape.batch, shape.kv_heads, shape.kv_len, shape.head_dim, generator=g, device=device).to(dt)
    v = torch.randn(shape.batch, shape.kv_heads, shape.kv_len, shape.head_dim, generator=g, device=device).to(dt)
    mask = None
    if shape.pad:
        real = torch.ones(shape.batch, shape.kv_len, dtype=torch.bool, device=device)
        real[:, : shape.pad] = False
        mask = real[:, None, None, :]  # [B, 1, 1, Tk]
    ref_out = registry.get("reference").fn(q, k, v, mask, False)[0].float()
    rows: list[dict[str, Any]] = []
    for name in backends:
        row = _row("attention", shape, name)
        auto = None
        tile = Tile.parse(name)
        if name == "auto":
            from dllm.kernels.autotune import AutoAttention, AutoConfig

            fn, reason = (auto := AutoAttention(AutoConfig(), registry.get)), None
        elif tile is not None:  # the triton kernel at another tile (--tiles)
            fn, reason = tiled_attention(tile), registry.get("triton").refusal(need_probs=False)
        else:
            backend = registry.get(name)
            fn, reason = backend.fn, backend.refusal(need_probs=False)
        if reason is None and name.startswith("triton"):
            reason = _bf16_refusal(dt)
        if reason is not None:
            row["note"] = reason
        else:
            out = fn(q, k, v, mask, False)[0]  # auto: the probe
            row["max_abs_err"] = float((out.float() - ref_out).abs().max())
            row["ms"] = round(_time_ms(lambda: fn(q, k, v, mask, False), device, repeats, warmup), 4)
            if auto is not None:
                (decision,) = auto.decisions()
                times = ", ".join(f"{n} {t:.1f} us" for n, t in decision.times_us.items())
                row["note"] = f"chose {decision.chosen}" + (f" ({times})" if times else "") + "".join(
                    f"; {r}" for r in decision.refused.values())
        rows.append(row)
    return rows


def _stats_rows(shape: StatsShape, backends: Sequence[str], device: torch.device, repeats: int,
                warmup: int, seed: int, mask_id: int = 126336) -> list[dict[str, Any]]:
    from dllm.kernels.reference import vocab_stats_reference

    g = torch.Generator(device=device).manual_seed(seed)
    dt = _DTYPES[shape.dtype]
    logits = (4 * torch.randn(shape.rows, shape.vocab, generator=g, device=device)).to(dt)
    banned = mask_id if mask_id < shape.vocab else shape.vocab - 1
    temp = shape.temperature
    uniforms = torch.rand(shape.rows, shape.vocab, generator=g, device=device, dtype=torch.float64) if temp else None
    ref = vocab_stats_reference(logits, banned, temp, uniforms)
    rows: list[dict[str, Any]] = []
    for name in backends:
        row = _row("stats", shape, name)
        if name == "reference":
            fn: Callable[[], Any] = lambda: vocab_stats_reference(logits, banned, temp, uniforms)
        elif name == "triton":
            reason = _kernel_refusal(dt)
            if reason is not None:
                row["note"] = reason
                rows.append(row)
                continue
            from dllm.kernels.triton.stats import vocab_stats

            fn = lambda: vocab_stats(logits, banned=banned, temperature=temp, uniforms=uniforms)
        else:
            continue  # attention-only backends (sdpa) have no stats path
        st = fn()
        errs = [float((getattr(st, f).double() - getattr(ref, f)).abs().max())
                for f in ("top1_prob", "margin", "entropy", "gap", "lse") if getattr(st, f) is not None]
        row["max_abs_err"] = max(errs)
        same = float((st.argmax == ref.argmax).float().mean())
        row["note"] = f"argmax agree {same:.4f}"
        if temp:
            row["note"] += f", sample agree {float((st.sample == ref.sample).float().mean()):.4f}"
        row["ms"] = round(_time_ms(fn, device, repeats, warmup), 4)
        rows.append(row)
    return rows


def _lopa_rows(shape: LoPAShape, backends: Sequence[str], device: torch.device, repeats: int,
               warmup: int, seed: int, mask_id: int = 0) -> list[dict[str, Any]]:
    """``fast:compact=False``'s sampler step (statistics, anchor, variants, scores, winner; its
    variant forward returns logits made beforehand) with the fused statistics and LoPA's two kernels
    (``triton``) against the torch statistics and ops (``reference``), on the same inputs. A step
    without carried statistics: two passes over the vocabulary (a block's first; later steps read
    one). ``note``: whether the two commit the same positions."""
    from dllm.samplers import make_sampler
    from dllm.state import StepInput

    g = torch.Generator(device=device).manual_seed(seed)
    dt = _DTYPES[shape.dtype]
    b, w, v, k = shape.batch, shape.width, shape.vocab, 3  # fast's branches
    logits = (4 * torch.randn(b, w, v, generator=g, device=device)).to(dt)  # [B, W, V]
    v_logits = (4 * torch.randn(b * k, w, v, generator=g, device=device)).to(dt)  # [B * k, W, V]
    active = torch.rand(b, w, generator=g, device=device) < 0.75
    tokens = torch.where(active, mask_id, 1 + torch.arange(w, device=device).expand(b, w) % (v - 1))
    inp = StepInput(logits=logits, tokens=tokens, active=active, query_start=0, window=(0, w), step=0, steps=None,
                    mask_id=mask_id, temperature=0.0, generator=None,
                    forward_variants=lambda canvas, rows, n, every_row=False, host_rows=None: v_logits)
    rows: list[dict[str, Any]] = []
    decisions = {}
    for name in backends:
        row = _row("lopa", shape, name)
        if name == "triton":
            reason = _kernel_refusal(dt)
            if reason is not None:
                row["note"] = reason
                rows.append(row)
                continue
            sampler = make_sampler("fast", compact=False, stats="fused")
        elif name == "reference":
            sampler = make_sampler("fast", compact=False, stats="torch")
        else:
            continue
        decisions[name] = sampler.step(inp, None).commit.clone()  # the fused step rewrites its outputs next step
        row["ms"] = round(_time_ms(lambda: sampler.step(inp, None), device, repeats, warmup), 4)
        rows.append(row)
    if len(decisions) == 2:
        same = torch.equal(decisions["triton"], decisions["reference"])
        for row in rows:
            row["note"] = "same commits" if same else "commits differ (float32 statistics: near-ties)"
    return rows


def run_kernel_bench(
    shapes: Optional[Sequence[Shape]] = None,
    backends: Sequence[str] = ("triton", "sdpa", "auto", "reference"),
    *,
    device: Union[str, torch.device, None] = None,
    repeats: int = 10,
    warmup: int = 2,
    seed: int = 0,
) -> list[dict[str, Any]]:
    """Time every backend on every shape (default: ``default_shapes(device)``); one dict per pair.

    device: default CUDA when available, else CPU; a device this machine lacks (``cuda`` without a
        GPU) is a ValueError naming it and the available devices, before anything runs. A backend
        that cannot run here yields a row with ``ms=None`` and the reason in ``note``, so the bench
        runs everywhere.
    """
    from dllm.models.loading import resolve_device

    dev = resolve_device(device) if device is not None else torch.device("cuda" if torch.cuda.is_available() else "cpu")
    shapes = list(shapes) if shapes is not None else default_shapes(dev)
    interpreted = _interpreted()
    results: list[dict[str, Any]] = []
    for shape in shapes:
        if isinstance(shape, AttnShape):
            rows = _attention_rows(shape, backends, dev, repeats, warmup, seed)
            sdpa = next((r["ms"] for r in rows if r["backend"] == "sdpa" and r["ms"]), None)
            for r in rows:
                r["vs_sdpa"] = round(r["ms"] / sdpa, 2) if sdpa and r["ms"] else None
            base = sdpa or next((r["ms"] for r in rows if r["backend"] == "reference" and r["ms"]), None)
        else:
            rows = (_stats_rows if isinstance(shape, StatsShape) else _lopa_rows)(shape, backends, dev, repeats,
                                                                                 warmup, seed)
            base = next((r["ms"] for r in rows if r["backend"] == "reference" and r["ms"]), None)
        for r in rows:
            if base and r["ms"]:
                r["speedup"] = round(base / r["ms"], 2)
            r["interpreted"] = interpreted and r["backend"].startswith("triton")
            r.setdefault("vs_sdpa", None)
        results.extend(rows)
    return results


def main(argv: Optional[Sequence[str]] = None) -> None:
    """``dllm bench kernels [--device cuda] [--repeats 10] [--tiny]``: print the table of every
    (shape, backend), then the per-shape ratios to sdpa and what ``auto`` chose."""
    import argparse

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--device", default=None)
    ap.add_argument("--repeats", type=int, default=10)
    ap.add_argument("--warmup", type=int, default=2)
    ap.add_argument("--backends", default="triton,sdpa,auto,reference")
    ap.add_argument("--tiny", action="store_true", help="the smallest shapes only (a CPU smoke run in seconds)")
    args = ap.parse_args(argv)
    from dllm.eval.bench.kernel_report import format_report

    rows = run_kernel_bench(tiny_shapes() if args.tiny else None, backends=args.backends.split(","),
                            device=args.device, repeats=args.repeats, warmup=args.warmup)
    print(format_report(rows))


if __name__ == "__main__":
    main()


__all__ = ["run_kernel_bench", "default_shapes", "tiny_shapes", "AttnShape", "LoPAShape", "StatsShape"]
