"""The fused path's RoPE table (dllm/models/core/layer/rope.py ``RopeTable``) at its edges: negative
positions wrap as ``lookup`` documents (no host read refuses them), a CPU position below the table is
named, and positions past the caller's bound grow the table on a CPU."""

from __future__ import annotations

import pytest
import torch

from dllm.models.core.layer.rope import RopeTable, rope_cos_sin


def _rows(positions: list[int], bound: int = 3) -> torch.Tensor:
    return RopeTable(8, 10000.0).lookup(torch.tensor([positions]), torch.float32, bound)[0]  # [T, 2, 1, hd]


def test_non_negative_positions_are_the_reference_angles():
    rows = _rows([0, 5, 63, 200])
    cos, sin = rope_cos_sin(torch.tensor([[0, 5, 63, 200]]), 8, 10000.0)  # [1, 1, T, hd]
    assert torch.equal(rows[:, 0, 0], cos[0, 0])
    assert torch.equal(rows[:, 1, 0, 4:], sin[0, 0, :, 4:]) and torch.equal(rows[:, 1, 0, :4], -sin[0, 0, :, :4])


def test_a_negative_position_wraps_to_the_tables_end_as_documented():
    """Position -1 of a 64-row table reads position 63's row (``lookup``'s docstring), not the
    reference's negative angle: callers must not make negative positions."""
    assert torch.equal(_rows([-1, -64]), _rows([63, 0]))
    cos, _ = rope_cos_sin(torch.tensor([[-1]]), 8, 10000.0)
    assert not torch.equal(_rows([-1])[0, 0, 0], cos[0, 0, 0])


def test_a_cpu_position_below_the_table_is_named():
    with pytest.raises(ValueError, match=r"RoPE positions must be >= 0, got -65"):
        _rows([0, -65])
    with pytest.raises(ValueError, match=r"got -70"):  # past the table at both ends: the negative is named
        _rows([500, -70])
