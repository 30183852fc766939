"""``DiffusionLM.cached_logits``: the engine's cached forward without the module call and the input
checks gives exactly the logits of ``model(...)`` (every family, ragged and not, a block query and a
stacked variant query), and a hook on the model makes it call the module (the hook must see it)."""

from __future__ import annotations

import pytest
import torch

import dllm
from dllm.models import tiny

FAMILIES = ["llada", "dream", "sdar", "fastdllm_v2", "llada2"]


def _prefilled(model, rows: int, length: int, padded: bool):
    """Buffers of ``rows`` x ``length`` columns written by one full forward; returns (ids, positions,
    key padding mask or None, buffers)."""
    g = torch.Generator().manual_seed(0)
    ids = torch.randint(10, 40, (rows, length), generator=g)
    kpm = None
    positions = torch.arange(length).expand(rows, length)
    if padded:  # the second row left-padded by 3
        kpm = torch.ones(rows, length, dtype=torch.bool)
        kpm[1, :3] = False
        positions = (kpm.cumsum(1) - 1).clamp(min=0)
    kv = model.new_kv_cache(rows, length)
    model(ids, positions=positions, key_padding_mask=kpm, cache=kv.view(0, length))
    return ids, positions, kpm, kv


@pytest.mark.parametrize("padded", [False, True], ids=["plain", "ragged"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
@pytest.mark.parametrize("family", FAMILIES)
def test_cached_logits_equal_the_module_call(family, dtype, padded):
    model = tiny(family, dtype=dtype, seed=1)
    ids, positions, kpm, kv = _prefilled(model, 2, 24, padded)
    s, e = 16, 20  # a block query against the buffers
    a = 1 if model.logit_shift else 0  # a shifted family has no logits for the query's first row
    with torch.inference_mode():
        for rows in [None, (a, e - s)]:
            got = model.cached_logits(ids[:, s:e], positions[:, s:e], kpm, kv.view(s, 24), rows)
            want = model(ids[:, s:e], positions=positions[:, s:e], key_padding_mask=kpm, cache=kv.view(s, 24),
                         logits_rows=rows).logits
            assert torch.equal(got, want)


def test_a_stacked_variant_query_gives_the_module_call_s_logits():
    model = tiny("llada", dtype=torch.bfloat16, seed=1)
    ids, positions, kpm, kv = _prefilled(model, 2, 24, False)
    g, s, e = 3, 16, 20
    rows = torch.arange(2).repeat_interleave(g)  # each row's 3 variants
    variants = ids[:, s:e].repeat_interleave(g, 0).reshape(2, -1)  # [n, g*T]
    pos = positions[:, s:e].repeat(1, g)
    with torch.inference_mode():
        view = kv.rows_view(rows, s, 24, None, g, every_row=True, stacked=True)
        got = model.cached_logits(variants, pos, None, view, (0, e - s))
        view = kv.rows_view(rows, s, 24, None, g, every_row=True, stacked=True)
        want = model(variants, positions=pos, cache=view, logits_rows=(0, e - s)).logits
    assert torch.equal(got, want)


def test_a_hook_on_the_model_sees_the_engine_s_cached_forwards():
    """With a forward pre-hook on the model the engine's cached steps are module calls (the hook runs
    at each), and the tokens are the ones the direct path gives."""
    model = tiny("llada", dtype=torch.bfloat16, seed=1)
    kw = dict(sampler="threshold", cache="dual", gen_length=16, block_length=8)
    direct = dllm.generate(model, [list(range(10, 22))], **kw)
    widths = []
    hook = model.register_forward_pre_hook(lambda m, args, kwargs: widths.append(args[0].shape[1]), with_kwargs=True)
    try:
        hooked = dllm.generate(model, [list(range(10, 22))], **kw)
    finally:
        hook.remove()
    assert torch.equal(hooked.sequences, direct.sequences) and hooked.nfe == direct.nfe
    assert len(widths) == hooked.nfe and widths.count(8) == hooked.nfe - 2  # 2 full forwards, one per block
