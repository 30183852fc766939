"""torch.compile of the layers (dllm.models.core.compile): the compiled path against the eager one."""

import pytest
import torch

import dllm
from dllm.models import compile_model, load, uncompile_model
from dllm.models.core.compile import HALVES, check_backend, is_compiled


@pytest.fixture(params=["tiny-llada", "tiny-dream"])
def model(request):
    m = load(request.param)
    yield m
    uncompile_model(m)


def _prompts():
    from dllm import tasks as T

    return [T.prompt_ids(T.test_split("copy", 8, 2)[i]) for i in range(2)] + [
        T.prompt_ids(T.test_split("reverse", 4, 1)[0])]


def test_halves_compose_the_layer_exactly():
    """TransformerBlock.forward == residual_out(attention(qkv_rows)) (the split compile relies on)."""
    m = load("tiny-random-llada")
    ids = torch.randint(0, 50, (2, 11))
    tr = m.transformer
    h = tr.embed(ids)
    from dllm.models.core.transformer import rope_cos_sin
    cos, sin = rope_cos_sin(torch.arange(11).expand(2, 11), tr.config.head_dim, tr.config.rope_theta)
    layer = tr.layers[0]
    out, _ = layer(h, cos, sin, None, tr._attn_fn)
    q, k, v = layer.qkv_rows(h, cos, sin)
    att = torch.nn.functional.scaled_dot_product_attention(
        q, k.repeat_interleave(q.shape[1] // k.shape[1], 1), v.repeat_interleave(q.shape[1] // v.shape[1], 1))
    torch.testing.assert_close(out, layer.residual_out(h, att), rtol=1e-5, atol=1e-5)


@pytest.mark.slow  # torch.compile traces for seconds per model
@pytest.mark.parametrize("backend", ["aot_eager", "inductor"])
def test_compiled_logits_and_tokens_match_eager(model, backend):
    if backend == "inductor" and model.logit_shift:
        pytest.skip("inductor once (LLaDA) is enough: the halves are the same code for both families")
    ids = torch.randint(0, 70, (2, 23))
    real = torch.ones_like(ids, dtype=torch.bool)
    real[0, :3] = False  # a left-padded row
    eager = model(ids, key_padding_mask=real).logits
    prompts = _prompts()
    runs = {}
    for cache in ("none", "dual"):
        runs[cache] = dllm.generate(model, prompts, "fast", gen_length=12, block_length=4, cache=cache)
    compile_model(model, backend)
    assert is_compiled(model) and all(name in model.transformer.layers[0].__dict__ for name in HALVES)
    torch.testing.assert_close(model(ids, key_padding_mask=real).logits, eager, rtol=1e-4, atol=1e-4)
    for cache, ref in runs.items():
        out = dllm.generate(model, prompts, "fast", gen_length=12, block_length=4, cache=cache)
        assert torch.equal(out.generated, ref.generated), cache
        assert (out.nfe, out.forwarded_tokens) == (ref.nfe, ref.forwarded_tokens)
    uncompile_model(model)
    assert not is_compiled(model) and not any(n in model.transformer.layers[0].__dict__ for n in HALVES)
    torch.testing.assert_close(model(ids, key_padding_mask=real).logits, eager, rtol=0, atol=0)


def test_bad_requests_are_refused_and_eager_still_works(model, monkeypatch):
    with pytest.raises(ValueError, match=r"unknown torch.compile backend 'nope'; valid backends: \[.*'inductor'"):
        compile_model(model, "nope")
    with pytest.raises(ValueError, match="OracleLM has no transformer layers to compile"):
        compile_model(load("oracle"))
    with pytest.raises(ValueError, match="either mode or options"):
        compile_model(model, "inductor", mode="default", max_autotune=True)
    monkeypatch.setattr("shutil.which", lambda name: None)
    with pytest.raises(RuntimeError, match="inductor' on CPU needs a C\\+\\+ compiler"):
        check_backend("inductor", torch.device("cpu"))
    monkeypatch.undo()
    assert not is_compiled(model)
    ids = torch.randint(0, 70, (1, 9))
    assert model(ids).logits.shape == (1, 9, model.vocab_size)


def test_a_backend_that_fails_is_undone(model):
    """The probe forward compiles now; a failing backend leaves the model eager and says so."""
    import torch._dynamo

    from torch._dynamo.backends.registry import _COMPILER_FNS

    def broken(gm, example_inputs):  # noqa: ARG001
        raise RuntimeError("no code generator here")
    if "dllm_test_broken" not in _COMPILER_FNS:  # registered once per process
        torch._dynamo.register_backend(broken, name="dllm_test_broken")

    torch._dynamo.reset()  # code an earlier test compiled (the slow inductor cases) would be reused, not recompiled
    ids = torch.randint(0, 70, (1, 9))
    ref = model(ids).logits
    with pytest.raises(RuntimeError, match="failed on the first forward; the compile was undone .* no code generator"):
        compile_model(model, "dllm_test_broken")
    assert not is_compiled(model)
    torch.testing.assert_close(model(ids).logits, ref, rtol=0, atol=0)
