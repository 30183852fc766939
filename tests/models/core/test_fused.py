"""The fused layer path (dllm/models/core/layer/fused.py) against the module-by-module reference."""

from __future__ import annotations

import pytest
import torch

import dllm
from dllm.models.core.layer.norm import rms_norm_one_op, rms_norm_reference
from dllm.models.core.layer.rope import RopeTable, apply_rope, rope_cos_sin, rope_rows
from dllm.models.tiny import tiny

DENSE = ("llada", "dream", "sdar", "fastdllm_v2")
DTYPES = (torch.float32, torch.bfloat16)


def _ids(b=2, t=19, seed=0):
    return torch.randint(10, 40, (b, t), generator=torch.Generator().manual_seed(seed))


@pytest.mark.parametrize("round_once", [False, True])
@pytest.mark.parametrize("dtype", DTYPES + (torch.float16,))
@pytest.mark.parametrize("shape", [(3, 16), (2, 7, 64), (1, 33, 4, 32), (5, 4096)])
def test_one_op_norm_equals_reference(shape, dtype, round_once):
    g = torch.Generator().manual_seed(1)
    x = torch.randn(*shape, generator=g).to(dtype)
    w = (torch.rand(shape[-1], generator=g) + 0.5).to(dtype)
    ref = rms_norm_reference(x, w, 1e-6, round_once=round_once)
    assert torch.equal(rms_norm_one_op(x, w, 1e-6, round_once=round_once), ref)


def test_round_once_differs_from_twice_in_bf16_only():
    g = torch.Generator().manual_seed(2)
    x, w = torch.randn(64, 256, generator=g), torch.rand(256, generator=g) + 0.5
    assert torch.equal(rms_norm_reference(x, w, 1e-6, round_once=True), rms_norm_reference(x, w, 1e-6, round_once=False))
    xb, wb = x.bfloat16(), w.bfloat16()
    assert not torch.equal(rms_norm_reference(xb, wb, 1e-6, round_once=True),
                           rms_norm_reference(xb, wb, 1e-6, round_once=False))


@pytest.mark.parametrize("fp32", [True, False])
@pytest.mark.parametrize("dtype", DTYPES)
def test_table_rope_equals_reference(dtype, fp32):
    hd, theta = 32, 500000.0
    positions = torch.tensor([[0, 1, 2, 5, 9], [3, 3, 4, 100, 511]])
    x = torch.randn(2, 5, 6, hd).to(dtype)  # [B, T, H', hd]
    cos, sin = rope_cos_sin(positions, hd, theta)  # [B, 1, T, hd]
    want = apply_rope(x.transpose(1, 2), cos, sin, fp32=fp32).transpose(1, 2)
    table = RopeTable(hd, theta)
    got = rope_rows(x, table.lookup(positions, torch.float32 if fp32 else dtype, 511), fp32=fp32)
    assert torch.equal(got, want)


def test_rope_table_grows_past_its_length():
    table = RopeTable(8, 10000.0)
    small = table.lookup(torch.tensor([[0, 3]]), torch.float32, 3)
    assert table._tables[(torch.device("cpu"), torch.float32)].shape[0] == 64
    big = table.lookup(torch.tensor([[0, 3, 300]]), torch.float32, 300)
    assert table._tables[(torch.device("cpu"), torch.float32)].shape[0] == 512
    assert torch.equal(small, big[:, :2])


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("family", DENSE + ("llada2",))  # LLaDA 2.x: partial rotary, MoE feed-forward as its module
def test_fused_logits_equal_reference(family, dtype):
    m = tiny(family, dtype=dtype, d_model=128, n_heads=4, mlp_hidden=256)
    ids = _ids()
    with torch.inference_mode():
        m.transformer.set_fused(False)
        ref = m(ids).logits
        m.transformer.set_fused(True)
        assert m.transformer.fused_ready()
        got = m(ids).logits
    assert torch.equal(got, ref)


_RUNS = [(f, c, s) for f, caches in (("llada", ("none", "dual", "prefix")), ("dream", ("none", "dual")),
                                      ("sdar", ("block",)), ("fastdllm_v2", ("block",)), ("llada2", ("block",)))
         for c in caches for s in ("low_confidence", "threshold", "fast")] + [("sdar", "subblock", "fastdllm_v2")]


@pytest.mark.parametrize("family,cache,sampler", _RUNS)
def test_fused_tokens_equal_reference_batched_and_ragged(family, cache, sampler):
    m = tiny(family, dtype=torch.bfloat16)
    block = {"sdar": 4, "fastdllm_v2": 8, "llada2": 4}.get(family, 8)
    prompts = [list(range(10, 22)), list(range(22 - 12 + block, 22))]  # ragged (left padded), same block offset
    outs = []
    for fused in (False, True):
        m.transformer.set_fused(fused)
        out = dllm.generate(m, prompts, sampler=sampler, cache=cache, gen_length=16, block_length=block,
                            return_trace=True)
        outs.append((out.sequences, out.trace, out.nfe))
    assert torch.equal(outs[0][0], outs[1][0]) and torch.equal(outs[0][1], outs[1][1])
    assert outs[0][2] == outs[1][2]


def test_default_is_fused_except_float32():
    m = tiny("llada", dtype=torch.bfloat16)
    with torch.no_grad():
        assert not tiny("llada").transformer.fused_ready()
        assert m.transformer.fused_ready()
    assert not m.transformer.fused_ready()  # autograd (training): module by module
    with pytest.raises(ValueError, match="fused must be True, False or None"):
        m.transformer.set_fused("yes")


def test_fused_weights_share_memory_and_refuse_when_replaced(tmp_path):
    m = tiny("dream", dtype=torch.bfloat16)
    ids = _ids()
    with torch.inference_mode():
        before = m(ids).logits
    attn = m.transformer.layers[0].attn
    fused = attn.fused_qkv()
    assert fused is not None and fused.valid()
    assert attn.q_proj.weight.data_ptr() == fused.weight.data_ptr()  # no second copy
    # a load replaces the parameters: the layer fuses again and reads the new weights
    state = {k: v.clone() * 0.5 for k, v in m.transformer.state_dict().items()}
    m.transformer.load_state_dict(state, assign=True)
    assert not fused.valid()
    with torch.inference_mode():
        after = m(ids).logits
        m.transformer.set_fused(False)
        ref = m(ids).logits
    assert torch.equal(after, ref) and not torch.equal(after, before)
    # saving a fused model writes separate official tensors that load back equal
    m.transformer.set_fused(True)
    with torch.inference_mode():
        m(ids)
    m.save_pretrained(tmp_path)
    assert m.transformer.layers[0].attn.fused_qkv().valid()  # saving copied, it did not unfuse
    loaded = dllm.load(str(tmp_path), dtype=torch.bfloat16)
    with torch.inference_mode():
        assert torch.equal(loaded(ids).logits, after)


def test_hooked_projection_runs_module_by_module():
    m = tiny("llada", dtype=torch.bfloat16)
    seen = []
    m.transformer.layers[1].mlp.gate_proj.register_forward_hook(lambda mod, a, out: seen.append(out.shape))
    assert not m.transformer.fused_ready()
    with torch.inference_mode():
        m(_ids())
    assert seen  # the hook ran: the reference path was taken


def _every_sampler():
    return sorted(name for name, _ in dllm.list_samplers())


@pytest.mark.parametrize("family", ["llada", "dream"])
@pytest.mark.parametrize("sampler", _every_sampler())
def test_every_sampler_gives_the_same_tokens_fused(family, sampler):
    """Every registered sampler, dual cache, a ragged batch in bfloat16: the fused layer path and
    the static cached step give the reference path's tokens."""
    from dllm.samplers import samplers as registry

    model = tiny(family, dtype=torch.bfloat16, seed=2)
    prompts = [list(range(10, 22)), list(range(15, 22))]
    kw = dict(sampler=sampler, gen_length=16, block_length=8, return_trace=True, seed=0)
    if registry.get(sampler).fixed_steps:
        kw["steps"] = 16
    cache = "none" if registry.get(sampler).shadow_block else "dual"
    outs = []
    for fused, graphs in ((False, False), (True, False), (True, "static")):
        model.transformer.set_fused(fused)
        try:
            out = dllm.generate(model, prompts, cache=cache, cuda_graphs=graphs, **kw)
        except ValueError as err:  # a sampler/cache combination the engine refuses: refused alike
            outs.append(("refused", str(err)))
            continue
        outs.append((out.sequences, out.trace, out.nfe))
    ref = outs[0]
    for got in outs[1:]:
        if ref[0] == "refused":
            assert got == ref
            continue
        assert torch.equal(got[0], ref[0]) and torch.equal(got[1], ref[1]) and got[2] == ref[2]


def test_offloaded_or_meta_projections_are_not_fused():
    from dllm.models.core.layer.fused import fusable

    lins = [torch.nn.Linear(4, 4), torch.nn.Linear(4, 2)]
    assert fusable(lins)
    lins[1]._hf_hook = object()  # accelerate's hook: it may load the weight only when the module runs
    assert not fusable(lins)
    with torch.device("meta"):
        meta = [torch.nn.Linear(4, 4), torch.nn.Linear(4, 2)]
    assert not fusable(meta)


def test_output_and_down_projections_see_hooks_and_replaced_weights_after_fusing():
    """The fused path runs o_proj and down_proj as F.linear only while their weights are the ones it
    gathered and no hook is on them: a hook registered after the first forward runs, and a weight
    replaced by assignment is the one used (both without invalidate_fused)."""
    m = tiny("llada", dtype=torch.bfloat16)
    ids = _ids()
    with torch.inference_mode():
        before = m(ids).logits
        layer = m.transformer.layers[0]
        seen = []
        handle = layer.mlp.down_proj.register_forward_hook(lambda mod, a, out: seen.append(1) or out * 0)
        zeroed = m(ids).logits
        handle.remove()
        assert seen and not torch.equal(zeroed, before)
        assert torch.equal(m(ids).logits, before)
        layer.attn.o_proj.weight = torch.nn.Parameter(torch.zeros_like(layer.attn.o_proj.weight))
        assert not torch.equal(m(ids).logits, before)


@pytest.mark.parametrize("family", ["llada", "sdar"])
def test_attention_maps_on_the_fused_path_equal_the_reference(family):
    """A forward that asks for some layers' attention maps stays on the fused path (those layers'
    attention on the reference backend): the same logits and maps as module by module."""
    m = tiny(family, dtype=torch.bfloat16, n_layers=3)
    ids = _ids()
    outs = []
    with torch.inference_mode():
        for fused in (False, True):
            m.transformer.set_fused(fused)
            out = m(ids, want_attn_layers=(1, -1))
            outs.append(out)
        assert m.transformer.fused_ready()
    assert torch.equal(outs[0].logits, outs[1].logits)
    assert outs[0].attn.keys() == outs[1].attn.keys() == {1, 2}
    assert all(torch.equal(outs[0].attn[i], outs[1].attn[i]) for i in (1, 2))


def test_layers_skip_the_module_call_unless_something_watches_it():
    """The fused path runs an unhooked layer's (and the transformer's) ``forward`` without
    ``nn.Module.__call__``; a hook on the layer, a global module hook or a compiled module still get
    the module call: the hook sees every forward and the logits are the same."""
    from dllm.models.core.layer.fused import call_module

    model = tiny("llada", dtype=torch.bfloat16, seed=1)
    ids = torch.randint(5, 40, (2, 12), generator=torch.Generator().manual_seed(0))
    plain = model(ids).logits
    seen = []
    handle = model.transformer.layers[1].register_forward_hook(lambda m, a, o: seen.append("layer"))
    glob = torch.nn.modules.module.register_module_forward_hook(
        lambda m, a, o: seen.append("global") if m is model.transformer.layers[0] else None)
    try:
        hooked = model(ids).logits
    finally:
        handle.remove()
        glob.remove()
    assert seen == ["global", "layer"]
    assert torch.equal(hooked, plain)

    class Twice(torch.nn.Module):
        def forward(self, x):
            return 2 * x

    m = Twice()
    m._compiled_call_impl = lambda x: 3 * x  # what Module.compile() installs: the call must take it
    assert call_module(m, torch.ones(1)).item() == 3.0
    m._compiled_call_impl = None
    assert call_module(m, torch.ones(1)).item() == 2.0


@pytest.mark.parametrize("explicit", [False, True])
def test_fused_forward_past_max_positions_equals_reference(explicit):
    """RoPE has no table limit: a forward longer than the checkpoint's ``max_positions`` (default
    positions) or with explicit positions past it runs on the fused path, as the reference does."""
    m = tiny("dream", dtype=torch.bfloat16, max_positions=32)
    t = 24 if explicit else 70  # the table holds 64 rows (the next power of two, at least 64)
    ids = _ids(t=t)
    positions = (torch.arange(t) * 5 + 30).expand(2, t) if explicit else None  # up to 145
    with torch.inference_mode():
        m.transformer.set_fused(False)
        ref = m(ids, positions=positions).logits
        m.transformer.set_fused(True)
        got = m(ids, positions=positions).logits
    assert torch.equal(got, ref)
