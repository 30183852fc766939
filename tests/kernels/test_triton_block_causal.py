"""Block-causal masks (SDAR, Fast-dLLM v2, LLaDA 2) through the ``triton`` attention backend: the kernel's
per-key counts and per-row thresholds express every mask whose rows' key sets are nested, so masks
of any number of blocks (not only the two that happen to look like ``keys | pad_queries``) give
sdpa's output; masks that are not nested are still refused by name."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

import dllm
from dllm.kernels.attention import reference_attention
from dllm.kernels.triton.attention import flash_attention, triton_attention
from dllm.kernels.triton.padding import UnsupportedMaskError, mask_to_thresholds, nested_thresholds
from dllm.models import tiny
from dllm.models.core.layer.block import block_causal_mask

from .conftest import DEVICE
from .helpers import assert_close, left_padded

TOL = {torch.float32: 1e-5, torch.float16: 2e-3}


def _block_causal(b: int, tq: int, tk: int, block: int, pad: int) -> torch.Tensor:
    """bool [B, 1, Tq, Tk]: the last Tq of Tk columns as queries, blocks of ``block`` columns, row 0's
    first ``pad`` keys padding (row 0's pad queries whose block is all padding see no key at all)."""
    pos = torch.arange(tk)[None].expand(b, tk)
    mask = block_causal_mask(pos[:, tk - tq:], pos, block)  # [B, 1, Tq, Tk]
    real = torch.ones(b, tk, dtype=torch.bool)
    real[0, :pad] = False
    return (mask & real[:, None, None, :]).to(DEVICE)


def _sdpa(q, k, v, mask):
    g = q.shape[1] // k.shape[1]
    out = F.scaled_dot_product_attention(q.float(), k.float().repeat_interleave(g, 1),
                                         v.float().repeat_interleave(g, 1), attn_mask=mask)
    return out.nan_to_num(0.0)  # torch < 2.5 gives NaN for a row with no key; the repo's convention is 0


@pytest.mark.parametrize("n_blocks", [1, 2, 3, 4, 5])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16], ids=["fp32", "fp16"])
def test_block_causal_mask_matches_sdpa(n_blocks, dtype):
    """Blocks of 3 with the last block cut short (odd lengths), left padding, GQA 4:2, square mask."""
    t = 3 * n_blocks - 1
    g = torch.Generator().manual_seed(n_blocks)
    q = torch.randn(2, 4, t, 16, generator=g).to(dtype).to(DEVICE)
    k, v = (torch.randn(2, 2, t, 16, generator=g).to(dtype).to(DEVICE) for _ in range(2))
    mask = _block_causal(2, t, t, 3, pad=4)
    out, probs = triton_attention(q, k, v, mask)
    assert probs is None and out.dtype == dtype
    assert_close(f"blocks{n_blocks}", _sdpa(q, k, v, mask), out, TOL[dtype])
    assert_close(f"blocks{n_blocks}/ref", reference_attention(q, k, v, mask)[0], out, TOL[dtype])


@pytest.mark.parametrize("splits", [1, 2])
def test_cached_block_rows_with_key_end_and_splits(splits):
    """A cached step: the last block's 5 queries against 37 keys of a longer buffer, key_end cutting
    the keys per row, the keys split into ranges (flash-decoding) or not."""
    g = torch.Generator().manual_seed(7)
    tk, tq, buf = 37, 5, 48
    q = torch.randn(2, 4, tq, 16, generator=g).to(DEVICE)
    k, v = (torch.randn(2, 2, buf, 16, generator=g).to(DEVICE)[:, :, :tk] for _ in range(2))
    mask = _block_causal(2, tq, tk, 4, pad=6)
    mask[1, ..., 30:] = False  # row 1's keys end at 30: the same as key_end
    count, threshold = mask_to_thresholds(mask, 2, tq, tk)
    out = flash_attention(q, k, v, key_count=count, query_threshold=threshold, key_end=torch.tensor([tk, 30]),
                          num_splits=splits, block_n=16)
    assert_close(f"cached-S{splits}", _sdpa(q, k, v, mask), out, 1e-5)


def test_nested_thresholds_reproduce_nested_masks_only():
    g = torch.Generator().manual_seed(0)
    sets = torch.rand(3, 9, generator=g).argsort(-1)  # a random key order per batch row
    ranks = torch.randint(0, 10, (3, 6), generator=g)  # row t sees the first ranks[t] keys of that order
    nested = (sets.argsort(-1)[:, None, :] < ranks[:, :, None])  # [B, Tq, Tk], incl. empty and full rows
    count, threshold = nested_thresholds(nested)
    assert torch.equal(count[:, None, :] >= threshold[:, :, None], nested)
    window = torch.ones(1, 6, 6, dtype=torch.bool).tril().triu(-1)  # rows {t-1, t}: not nested
    count, threshold = nested_thresholds(window)
    assert not torch.equal(count[:, None, :] >= threshold[:, :, None], window)


@pytest.mark.parametrize("bad", ["window", "block_diagonal"])
def test_a_mask_that_is_not_nested_is_refused(bad):
    t = 8
    m = torch.ones(1, 1, t, t, dtype=torch.bool).tril().triu(-2) if bad == "window" else \
        (torch.arange(t)[:, None] // 4 == torch.arange(t)[None] // 4)[None, None]
    q = torch.zeros(1, 2, t, 16, device=DEVICE)
    with pytest.raises(UnsupportedMaskError, match=r"rows' allowed keys are nested .*use attn_backend='sdpa'"):
        triton_attention(q, q, q, m.to(DEVICE))


def test_flash_attention_mask_argument_checks():
    q = torch.zeros(2, 2, 4, 16, device=DEVICE)
    k = torch.zeros(2, 1, 8, 16, device=DEVICE)
    count = torch.ones(2, 8, dtype=torch.int32, device=DEVICE)
    with pytest.raises(ValueError, match="key_count and query_threshold go together.*got only key_count"):
        flash_attention(q, k, k, key_count=count)
    with pytest.raises(ValueError, match=r"query_threshold must be int32 \[B=2, Tq=4\] on .*got torch.int64"):
        flash_attention(q, k, k, key_count=count, query_threshold=torch.ones(2, 4, dtype=torch.long, device=DEVICE))
    with pytest.raises(ValueError, match="either as key_count/query_threshold or as key_padding"):
        flash_attention(q, k, k, count.bool(), key_count=count, query_threshold=count[:, :4])


@pytest.mark.parametrize("family, lengths", [("sdar", (14, 9)), ("fastdllm_v2", (27, 20)), ("llada2", (13, 6))])
def test_block_causal_tiny_models_match_sdpa(family, lengths):
    """SDAR and LLaDA 2 (blocks of 4: 4 blocks), Fast-dLLM v2 (blocks of 8: 4 blocks), left-padded, GQA 4:2."""
    model = tiny(family, seed=1, attn_backend="triton").to(DEVICE)
    ids, real = left_padded(model, lengths, device=DEVICE)
    with torch.no_grad():
        fast = model(ids, key_padding_mask=real).logits
        one = model(ids[:1, : lengths[0] - 1]).logits  # unpadded, 3+ blocks, odd length
        model.set_attn_backend("sdpa")
        ref = model(ids, key_padding_mask=real).logits
        ref_one = model(ids[:1, : lengths[0] - 1]).logits
    assert_close(f"{family}/padded", ref[real], fast[real], 1e-5)
    assert_close(f"{family}/one", ref_one, one, 1e-5)


def test_sdar_generate_with_triton_gives_sdpa_tokens():
    prompts = [[11, 12, 13, 14, 15, 16, 17, 18, 19, 20], [21, 22, 23, 24, 25, 26]]  # lengths agree mod 4; 5 blocks
    outs = {}
    for backend in ("sdpa", "triton"):
        model = tiny("sdar", seed=2, attn_backend=backend).to(DEVICE)
        outs[backend] = dllm.generate(model, prompts, gen_length=8, block_length=4, steps=6).generated
    assert torch.equal(outs["triton"], outs["sdpa"]), f"{outs['triton'].tolist()} != {outs['sdpa'].tolist()}"
