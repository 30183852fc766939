"""Weight-only quantization (dllm.models.quantize): bytes, accuracy against float32, the loaders'
``quantization=`` argument, and the errors for what the libraries / device / dtype cannot do."""

from __future__ import annotations

import builtins
from pathlib import Path

import pytest
import torch
import torch.nn as nn

import dllm
from dllm.models import tiny
from dllm import tasks as T
from dllm.models.quantize import (QUANTIZATIONS, NF4Linear, QuantizationError, check_quantization, check_target,
                                  quantizable_linears, quantize_model, weight_bytes)


def _installed(name: str) -> bool:
    import importlib.util

    return importlib.util.find_spec(name) is not None


# the quantizing tests need the libraries (pip install "torchao>=0.15" "bitsandbytes>=0.46"); the
# error tests run without them
TORCHAO = pytest.mark.skipif(not _installed("torchao"), reason="torchao is not installed")
BNB = pytest.mark.skipif(not _installed("bitsandbytes"), reason="bitsandbytes is not installed")


def float_bytes(model: nn.Module) -> int:
    return sum(t.numel() * t.element_size() for t in {id(p): p for p in model.state_dict().values()}.values())


def test_weight_bytes_of_a_float_model_is_its_state_dict() -> None:
    model = dllm.load("tiny-random-llada")
    assert weight_bytes(model) == float_bytes(model)


@pytest.mark.parametrize("method", [pytest.param("int8", marks=TORCHAO), pytest.param("int4", marks=TORCHAO),
                                    pytest.param("nf4", marks=BNB)])
def test_quantized_model_is_smaller_and_close(method: str) -> None:
    ref = dllm.load("tiny-llada")
    model = dllm.load("tiny-llada", quantization=method)
    assert model.quantization == method
    linears = quantizable_linears(ref)
    assert len(linears) == 6 * 7 + 1  # q k v o gate up down per layer, and the LM head
    ratio = weight_bytes(ref) / weight_bytes(model)
    assert ratio >= {"int8": 3.0, "int4": 3.0, "nf4": 6.0}[method], ratio
    torch.manual_seed(0)
    ids = torch.randint(5, 70, (3, 24))
    with torch.no_grad():
        a, b = ref(ids).logits, model(ids).logits
    assert b.dtype == a.dtype and b.shape == a.shape
    rel = ((a - b).norm() / a.norm()).item()
    assert 0 < rel < {"int8": 0.02, "int4": 0.25, "nf4": 0.25}[method], rel


@TORCHAO
def test_int8_weights_are_torchao_int8() -> None:
    model = dllm.load("tiny-llada", quantization="int8")
    w = model.transformer.layers[0].attn.q_proj.weight
    names, _ = w.__tensor_flatten__()
    assert w.dtype == torch.float32  # the activations' dtype; the data below is int8
    assert getattr(w, names[0]).dtype == torch.int8
    assert model.transformer.embed.weight.dtype == torch.float32  # embeddings stay float


@pytest.mark.slow
@TORCHAO
def test_int8_tiny_llada_within_one_point_on_pb_mini() -> None:
    """The issue's bar: int8 weight-only within 1 point of float32 on tiny-llada's PB-mini suite
    (greedy, one token per step)."""
    from dllm.scoring.exact_match import decode_and_score, eval_examples

    examples = eval_examples(per_size=2)
    scores = []
    for method in (None, "int8"):
        tally = decode_and_score(dllm.load("tiny-llada", quantization=method), examples, "low_confidence",
                                 tokens_per_step=1)
        scores.append([tally.solved[i] for i in range(len(examples))])
    acc = [100 * sum(s) / len(s) for s in scores]
    assert acc[0] > 80  # the float model solves the suite: the comparison means something
    assert abs(acc[1] - acc[0]) <= 1.0, (acc, sum(a != b for a, b in zip(*scores)))


def _ar_greedy(model, examples):
    eos = T.word_id(T.EOS)
    out = []
    for ex in examples:
        ids = torch.tensor([T.prompt_ids(ex)])
        with torch.no_grad():
            gen = model.generate(ids, attention_mask=torch.ones_like(ids), do_sample=False, eos_token_id=eos,
                                 pad_token_id=T.word_id(T.PAD), max_new_tokens=T.answer_length(ex.task, ex.size) + 1)
        g = gen[0, ids.shape[1]:].tolist()
        out.append(g[:g.index(eos) + 1] if eos in g else g)
    return out


@pytest.mark.slow
@TORCHAO
def test_int8_ar_target_and_drafter() -> None:
    """tiny-ar loaded int8 by load_target decodes the long copy tasks (which float32 solves) like float32 (outputs counted), and a
    speculative loop with an int8 DFlash drafter stays lossless: the target's own greedy tokens."""
    from dllm.drafters.dflash.drafter import DFlashBlockDrafter
    from dllm.drafters.dflash.dflash2.io import load_any_dflash
    from dllm.models.targets import load_target
    from dllm.drafters.loop import speculative_generate
    from dllm.models.text.task_tokenizer import task_tokenizer

    examples = [ex for task in ("copy_long", "double_long") for ex in T.test_split(task, n=2)]
    target, _ = load_target("tiny-ar")
    quant, _ = load_target("tiny-ar", quantization="int8")
    assert weight_bytes(target) / weight_bytes(quant) >= 3.0
    ref, got = _ar_greedy(target, examples), _ar_greedy(quant, examples)
    score = lambda outs: sum(T.score(ex, [T.vocabulary()[t] for t in o]) for ex, o in zip(examples, outs))  # noqa: E731
    assert score(ref) == len(examples)  # float32 solves these
    assert abs(score(got) - score(ref)) <= 1, (score(got), sum(a != b for a, b in zip(ref, got)))

    drafter_model = load_any_dflash("tiny-ar-dflash", quantization="int8")
    assert drafter_model.quantization == "int8"
    drafter = DFlashBlockDrafter(model=drafter_model, sample=False)
    for ex, want in zip(examples, ref):
        out = speculative_generate(target, drafter, [T.prompt_ids(ex)], temperature=0.0, plan=16,
                                   max_new_tokens=T.answer_length(ex.task, ex.size) + 1, tokenizer=task_tokenizer())
        assert out.generated[0] == want


@TORCHAO
def test_drafter_options_quantize_and_name_valid_methods() -> None:
    with pytest.raises(QuantizationError, match="unknown quantization 'int2'; valid: none, int8, int4, nf4"):
        dllm.make_drafter("dflash:model=tiny-ar-dflash,quantization=int2")
    with pytest.raises(QuantizationError, match="unknown quantization 'fp8'; valid: none, int8, int4, nf4"):
        dllm.make_drafter("dlm:model=tiny-llada,quantization=fp8")
    assert dllm.make_drafter("dflash:model=tiny-ar-dflash,quantization=int8").model.quantization == "int8"
    assert dllm.make_drafter("dlm:model=tiny-llada,quantization=int4").model.quantization == "int4"


@BNB
def test_nf4_layer_answers_weight_in_the_model_dtype() -> None:
    model = dllm.load("tiny-llada", quantization="nf4")
    layer = model.transformer.layers[0].attn.k_proj
    assert isinstance(layer, NF4Linear)
    assert layer.weight.dtype == torch.float32 and layer.weight.shape == (128, 128)
    x = torch.randn(2, 5, 128)
    assert torch.allclose(layer(x), x @ layer.weight.T, atol=1e-4)
    out = dllm.generate(model, [[10, 11, 12]], gen_length=8, block_length=8, steps=8)  # KV cache allocation
    assert out.sequences.shape == (1, 11)


def test_unknown_quantization_is_refused_before_loading() -> None:
    with pytest.raises(QuantizationError, match=r"unknown quantization 'int3'; valid: none, int8, int4, nf4"):
        dllm.load("tiny-llada", quantization="int3")
    with pytest.raises(QuantizationError, match="valid: none, int8"):
        dllm.load_target("tiny-ar", quantization=8)
    assert check_quantization("none") is None and check_quantization(None) is None
    assert check_quantization("INT8") is QUANTIZATIONS["int8"]


def test_device_dtype_and_combinations_are_refused() -> None:
    with pytest.raises(QuantizationError, match=r"does not run on device 'mps'; valid devices: cpu, cuda"):
        check_target(QUANTIZATIONS["int8"], torch.device("mps"), torch.float32)
    with pytest.raises(QuantizationError, match="needs the model in float32, bfloat16, float16, got float64"):
        dllm.load("tiny-random-llada", dtype="float64", quantization="int8")
    with pytest.raises(QuantizationError, match="pass device= instead of device_map"):
        dllm.load("tiny-random-llada", device_map="auto", quantization="int8")
    with pytest.raises(QuantizationError, match="no weights to quantize"):
        dllm.load("oracle", quantization="int8")


@TORCHAO
def test_a_quantized_model_is_not_quantized_again() -> None:
    model = dllm.load("tiny-random-llada", quantization="int8")
    with pytest.raises(QuantizationError, match="already quantized"):
        quantize_model(model, "int4")


def test_missing_library_names_the_pip_command(monkeypatch: pytest.MonkeyPatch) -> None:
    real = builtins.__import__

    def fake(name, *args, **kwargs):
        if name == "bitsandbytes":
            raise ImportError("No module named 'bitsandbytes'")
        return real(name, *args, **kwargs)

    monkeypatch.setattr(builtins, "__import__", fake)
    with pytest.raises(QuantizationError, match=r"needs bitsandbytes, which is not installed .*pip install "
                                                r"'bitsandbytes>=0.46'"):
        dllm.load("tiny-random-llada", quantization="nf4")


@TORCHAO
def test_quantized_model_refuses_to_save(tmp_path: Path) -> None:
    model = dllm.load("tiny-random-llada", quantization="int8")
    with pytest.raises(QuantizationError, match="cannot save a int8-quantized model in the official layout"):
        model.save_pretrained(tmp_path / "out")
    assert not (tmp_path / "out").exists()


@TORCHAO
def test_tied_head_stays_float() -> None:
    """An LM head that IS the embedding matrix is left alone (quantizing it would untie it)."""

    class Tied(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.embed = nn.Embedding(16, 32)
            self.proj = nn.Linear(32, 32)
            self.head = nn.Linear(32, 16, bias=False)
            self.head.weight = self.embed.weight

    model = quantize_model(Tied(), "int8")
    assert model.head.weight is model.embed.weight and type(model.head.weight) is nn.Parameter
    assert type(model.proj.weight).__name__ == "Int8Tensor"
    assert [n for n, _ in quantizable_linears(model)] == ["proj"]


@TORCHAO
def test_old_library_names_the_version_needed(monkeypatch: pytest.MonkeyPatch) -> None:
    import torchao

    monkeypatch.setattr(torchao, "__version__", "0.10.0")
    with pytest.raises(QuantizationError, match=r"needs torchao >= 0.15, found 0.10.0; pip install 'torchao>=0.15'"):
        dllm.load("tiny-random-llada", quantization="int4")


@pytest.mark.parametrize("method", [pytest.param("int8", marks=TORCHAO), pytest.param("nf4", marks=BNB)])
def test_bfloat16_model_stays_bfloat16(method: str) -> None:
    ref = dllm.load("tiny-llada", dtype="bfloat16")
    model = dllm.load("tiny-llada", dtype="bfloat16", quantization=method)
    ids = torch.randint(5, 70, (2, 16), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        a, b = ref(ids).logits, model(ids).logits
    assert b.dtype == torch.bfloat16 and model.transformer.layers[0].attn.q_proj.weight.dtype == torch.bfloat16
    assert ((a.float() - b.float()).norm() / a.float().norm()) < {"int8": 0.05, "nf4": 0.3}[method]


@TORCHAO
def test_int4_has_a_zero_point_per_group_and_half_a_step_of_error() -> None:
    """int4 is asymmetric, as documented: each group of 32 columns has its own scale and zero point,
    so its 16 levels span the group's range (widened to include 0, as torchao's affine qparams do)
    and a weight is off by at most half a step: (max(max, 0) - min(min, 0)) / 30. (It was torchao's
    default, symmetric: zero point 0, levels over [-absmax, absmax], so a group of weights of one
    sign used half the levels and was off by up to twice that.)"""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(64, 8, bias=False))
    with torch.no_grad():
        model[0].weight.uniform_(0.5, 1.0)  # one sign: the case symmetric int4 wastes half its levels on
    w = model[0].weight.detach().clone()  # [8, 64]
    quantize_model(model, "int4")
    with torch.no_grad():
        deq = model(torch.eye(64)).T  # [8, 64]: the weight the layer computes with
    groups = w.view(8, 2, 32)
    span = groups.amax(-1, keepdim=True).clamp_min(0) - groups.amin(-1, keepdim=True).clamp_max(0)
    err = (deq - w).abs().view(8, 2, 32)
    assert (err <= (span / 30).expand_as(groups) * 1.01 + 1e-6).all(), (err / (span / 30)).max()
    assert model[0].weight.zero_point.ne(0).all()


@BNB
def test_quantizing_a_model_that_already_ran_fused_uses_the_quantized_weights() -> None:
    """A bf16 model runs its fused layers (q/k/v and gate/up as one matrix each). quantize_model
    replaces those projections by NF4 modules; the next forward must compute with them, as a model
    quantized before any forward does (the fused matrices of the replaced float modules were reused:
    float q/k/v/gate/up weights, silently)."""
    ids = torch.randint(10, 60, (2, 12), generator=torch.Generator().manual_seed(0))
    fresh = quantize_model(tiny("dream", dtype=torch.bfloat16), "nf4")
    used = tiny("dream", dtype=torch.bfloat16)
    with torch.no_grad():
        used(ids)
        assert used.transformer.fused_ready()  # the float model ran fused
        quantize_model(used, "nf4")
        assert torch.equal(used(ids).logits, fresh(ids).logits)
