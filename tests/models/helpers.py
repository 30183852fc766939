"""Plain helpers shared by the model tests."""

import torch


def random_ids(model, batch: int, length: int, seed: int = 0) -> torch.Tensor:
    """[B, T] ids of ordinary tokens (no mask token), deterministic."""
    gen = torch.Generator().manual_seed(seed)
    ids = torch.randint(10, model.vocab_size, (batch, length), generator=gen)
    return ids.masked_fill(ids == model.mask_id, 11)
