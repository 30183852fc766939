"""Plain helpers shared by the model tests."""

import torch


def random_ids(model, batch: int, length: int, seed: int = 0) -> torch.Tensor:
    """[B, T] ids of ordinary tokens (no mask token), deterministic."""
    gen = torch.Generator().manual_seed(seed)
    ids = torch.randint(10, model.vocab_size, (batch, length), generator=gen)
    return ids.masked_fill(ids == model.mask_id, 11)


def assert_regenerated(shipped: dict, fresh: dict, ulps: int = 64) -> None:
    """Tensors of a shipped checkpoint against the same generator run here: equal up to ``ulps`` of
    each tensor's largest value. ``torch``'s random normals take another code path on CPUs without
    AVX2 (``ATEN_CPU_CAPABILITY=default``), which moves the last bits of the drawn weights; on the
    machine that wrote the files they are equal bit for bit."""
    assert shipped.keys() == fresh.keys()
    for k in shipped:
        a, b = shipped[k], fresh[k]
        eps = torch.finfo(a.dtype).eps if a.is_floating_point() else 0
        atol = ulps * eps * float(a.abs().max()) if a.numel() else 0
        torch.testing.assert_close(b, a, rtol=0, atol=atol, msg=lambda m, k=k: f"{k}: {m}")


def logits_atol(model, logits: torch.Tensor, ulps: int = 64) -> float:
    """An absolute tolerance for logits of two models whose weights agree as ``assert_regenerated``
    allows: ``ulps`` of float32 times the logits' size and the square root of the reductions."""
    cfg = model.config
    depth = (cfg.d_model + cfg.mlp_hidden) * cfg.n_layers
    return ulps * torch.finfo(logits.dtype).eps * depth ** 0.5 * max(1.0, float(logits.abs().max()))
