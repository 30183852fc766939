"""``dllm.kernels.triton.launch``: the Triton attention kernel's tile sizes and flash-decoding key split
(pure functions), and the split merge kernel against the plain-PyTorch merge."""

from __future__ import annotations

import math

import pytest
import torch

from dllm.kernels.triton.launch import SplitConfig, fixed_splits, plan_attention, plan_splits
from dllm.kernels.reference import attention_reference
from dllm.kernels.triton.attention import _merge_splits, flash_attention

from .conftest import DEVICE
from .helpers import assert_close

SMS = 132  # an H100 / H200

DECODE = [(b, h, tq, tk) for b in (1, 4) for h in (28, 32) for tq in (8, 16, 32, 64)
          for tk in (512, 1024, 2048, 4096, 8192)]


@pytest.mark.parametrize("b, h, tq, tk", DECODE)
def test_decode_shapes_fill_the_device_with_ranges_of_several_tiles(b, h, tq, tk):
    cfg = SplitConfig()
    plan = plan_attention(b, h, tq, tk, 128, sms=SMS)
    assert plan.block_m == max(16, tq) and plan.query_tiles == 1 and plan.block_n == 64
    tiles = math.ceil(tk / plan.block_n)
    assert plan.split_len % plan.block_n == 0
    assert plan.splits * plan.split_len >= tk > (plan.splits - 1) * plan.split_len  # no empty range
    assert plan.splits == 1 or plan.split_len >= cfg.min_tiles * plan.block_n
    base = b * h * plan.query_tiles  # programs without a split
    if base >= cfg.waves * SMS or tiles < 2 * cfg.min_tiles:
        assert plan.splits == 1
    else:  # enough programs, unless the ranges are already down to min_tiles tiles
        assert base * plan.splits >= cfg.waves * SMS or plan.split_len == cfg.min_tiles * plan.block_n


def test_plan_examples():
    assert plan_splits(32, 2048, 64, SMS) == (8, 256)  # LLaDA-8B, batch 1, a 32-token block: 256 programs
    assert plan_splits(32, 8192, 64, SMS) == (10, 896)  # 128 tiles, 14 per range
    assert plan_splits(32, 512, 64, SMS) == (2, 256)
    assert plan_splits(32, 448, 64, SMS) == (1, 448)  # 7 tiles: too few for two ranges of 4
    assert plan_splits(264, 8192, 64, SMS) == (1, 8192)  # the grid fills the device already
    assert plan_splits(1, 1 << 20, 64, SMS, SplitConfig(max_splits=16))[0] <= 16
    assert plan_attention(1, 2, 40, 100, 40, sms=None) == plan_attention(1, 2, 40, 100, 40, sms=None, num_splits=1)
    p = plan_attention(1, 2, 40, 100, 200, sms=None)
    assert (p.block_d, p.block_m, p.block_n, p.query_tiles, p.splits) == (256, 64, 32, 1, 1)


def test_fixed_splits_and_errors():
    assert fixed_splits(3, 256, 32) == (3, 96)  # 8 tiles: 3 per range
    assert fixed_splits(8, 100, 64) == (2, 64)  # never more ranges than tiles
    assert fixed_splits(1, 0, 64) == (1, 64)
    with pytest.raises(ValueError, match="num_splits must be >= 1, got 0"):
        fixed_splits(0, 10, 16)
    with pytest.raises(ValueError, match="sms=0"):
        plan_splits(4, 100, 16, 0)
    with pytest.raises(ValueError, match="min_tiles >= 1"):
        SplitConfig(min_tiles=0)
    # tiles that tl.arange / tl.dot cannot take: named, not an interpreter or compiler error
    with pytest.raises(ValueError, match="block_m must be a power of two >= 16, got 24"):
        plan_attention(1, 2, 40, 100, 64, sms=None, block_m=24)
    with pytest.raises(ValueError, match="block_n must be a power of two >= 16, got 8"):
        flash_attention(*(torch.zeros(1, 2, 4, 16, device=DEVICE) for _ in range(3)), block_n=8)


def test_the_planned_decode_split_matches_the_reference():
    b, h, hkv, tq, tk, d = 1, 2, 1, 8, 512, 32
    plan = plan_attention(b, h, tq, tk, d, sms=SMS)
    assert plan.splits == 2
    g = torch.Generator().manual_seed(3)
    q = torch.randn(b, h, tq, d, generator=g).to(DEVICE)
    k = torch.randn(b, hkv, tk, d, generator=g).to(DEVICE)
    v = torch.randn(b, hkv, tk, d, generator=g).to(DEVICE)
    pad = torch.ones(b, tk, dtype=torch.bool, device=DEVICE)
    pad[:, :300] = False  # the first range is all padding
    out, lse = flash_attention(q, k, v, pad, return_lse=True, num_splits=plan.splits, block_n=plan.block_n)
    ref, ref_lse = attention_reference(q, k, v, pad)
    assert_close("decode-split/out", ref, out, 1e-5)
    assert_close("decode-split/lse", ref_lse, lse, 1e-5)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
def test_merge_kernel_matches_the_torch_merge(dtype):
    g = torch.Generator().manual_seed(0)
    s, b, h, tq, d = 3, 2, 2, 5, 24
    part = torch.randn(s, b, h, tq, d, generator=g).to(DEVICE)
    part_lse = torch.randn(s, b, h, tq, generator=g).to(DEVICE)
    part_lse[1] = float("-inf")  # an empty range
    part_lse[:, 1, 0, 2] = float("-inf")  # a row with no key anywhere
    out, lse = _merge_splits(part, part_lse, dtype, True)
    total = torch.logsumexp(part_lse, dim=0)
    ref = (torch.exp(part_lse - total).nan_to_num(0.0)[..., None] * part).sum(dim=0)
    assert out.dtype == dtype and out.shape == (b, h, tq, d)
    assert_close("merge/out", ref, out.float(), 1e-6 if dtype == torch.float32 else 1e-3)
    assert_close("merge/lse", total, lse, 1e-6)
    assert torch.all(out[1, 0, 2] == 0)
