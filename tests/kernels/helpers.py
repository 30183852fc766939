"""Comparison helpers for the kernel tests (relative RMS error, max-abs logged, NaN checked first)."""

from __future__ import annotations

import logging

import torch

log = logging.getLogger("dllm.tests.kernels")


def rel_rms(ref: torch.Tensor, out: torch.Tensor) -> float:
    """||out - ref||_rms / ||ref||_rms over the finite entries of ref (0 when ref is all zero)."""
    ref, out = ref.double(), out.double()
    keep = torch.isfinite(ref)
    diff = (out[keep] - ref[keep]).pow(2).mean().sqrt()
    base = ref[keep].pow(2).mean().sqrt()
    return float(diff / base) if base > 0 else float(diff)


def assert_close(name: str, ref: torch.Tensor, out: torch.Tensor, ratio: float, atol: float = 0.0) -> float:
    """Fail unless ``out`` matches ``ref`` to relative RMS error <= ``ratio`` (or every entry within
    ``atol``: for fields whose reference is ~0, such as the entropy of a peaked row); infinities
    must match exactly. Logs and returns the error; the max-abs difference goes in the message."""
    assert ref.shape == out.shape, f"{name}: shape {tuple(out.shape)} != reference {tuple(ref.shape)}"
    assert not torch.isnan(ref).any(), f"{name}: reference has NaN"
    assert not torch.isnan(out).any(), f"{name}: kernel output has NaN"
    inf_ref, inf_out = torch.isinf(ref), torch.isinf(out)
    assert torch.equal(inf_ref, inf_out) and torch.equal(ref[inf_ref], out[inf_out].to(ref.dtype)), \
        f"{name}: infinities differ"
    err = rel_rms(ref, out)
    finite = ~inf_ref
    max_abs = float((out[finite].double() - ref[finite].double()).abs().max()) if finite.any() else 0.0
    log.info("%s: rel-RMS %.3e, max-abs %.3e", name, err, max_abs)
    assert err <= ratio or max_abs <= atol, f"{name}: relative RMS error {err:.3e} > {ratio:.1e} (max-abs {max_abs:.3e})"
    return err


def left_padded(model, lengths=(9, 5), seed=0, device="cpu") -> tuple[torch.Tensor, torch.Tensor]:
    """Random ids of ``lengths`` left-padded with the model's pad id, and their real-token mask, on
    ``device``: ([B, T] long, [B, T] bool)."""
    t = max(lengths)
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(10, 60, (len(lengths), t), generator=g)
    real = torch.zeros(len(lengths), t, dtype=torch.bool)
    for b, n in enumerate(lengths):
        real[b, t - n:] = True
        ids[b, : t - n] = model.pad_id
    return ids.to(device), real.to(device)
