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
