"""The fused vocabulary-statistics path inside the samplers (``stats=fused``) against the reference
path (``stats=torch``): same tokens and the same number of forwards on tiny random models and on the
embedded trained model, at T = 0 and (same seed, same uniforms) at T > 0."""

from __future__ import annotations

import pytest
import torch

import dllm
from dllm import tasks as T
from dllm.models import tiny
from dllm.samplers._ops import propose_with_confidence
from dllm.samplers.stats import use_fused
from dllm.state import StepInput

from .conftest import DEVICE

PROMPTS = [[11, 12, 13, 14, 15, 16], [21, 22, 23]]  # left-padded into one batch
SAMPLERS = [("low_confidence", {}), ("threshold", {}), ("threshold", {"threshold": 0.5}), ("factor", {})]


def _generate(model, prompts, sampler, stats, options=None, **kw):
    return dllm.generate(model, prompts, sampler=sampler, stats=stats, **(options or {}), **kw)


@pytest.mark.parametrize("temperature", [0.0, pytest.param(1.0, marks=pytest.mark.slow)], ids=["T0", "T1"])
@pytest.mark.parametrize("sampler, options", SAMPLERS, ids=["low_confidence", "threshold", "threshold-0.5", "factor"])
@pytest.mark.parametrize("family", ["llada", pytest.param("dream", marks=pytest.mark.slow)])  # the rest under -m slow
def test_fused_stats_give_the_reference_tokens(family, sampler, options, temperature):
    model = tiny(family, seed=3).to(DEVICE)
    kw = dict(gen_length=12, block_length=4, temperature=temperature, seed=7)
    outs = {}
    for stats in ("torch", "fused"):
        outs[stats] = _generate(model, PROMPTS, sampler, stats, options, **kw)
    ref, fused = outs["torch"], outs["fused"]
    assert torch.equal(fused.generated, ref.generated), f"{fused.generated.tolist()} != {ref.generated.tolist()}"
    assert fused.nfe == ref.nfe


@pytest.mark.slow
@pytest.mark.parametrize("sampler", ["low_confidence", "threshold"])
def test_fused_stats_on_the_embedded_model(sampler):
    model = dllm.load("tiny-llada", dtype="float32").to(DEVICE)
    examples = T.test_split("reverse")[:2] + T.test_split("sudoku4")[:1]
    outs = {}
    for stats in ("torch", "fused"):
        outs[stats] = []
        for ex in examples:
            n = T.answer_length(ex.task, ex.size)
            outs[stats].append(_generate(model, [T.prompt_ids(ex)], sampler, stats, gen_length=n,
                                         block_length=n).generated)
    for ref, fused in zip(outs["torch"], outs["fused"]):
        assert torch.equal(fused, ref)


def test_fused_confidence_matches_the_float64_softmax():
    g = torch.Generator().manual_seed(0)
    logits = (torch.randn(2, 6, 300, generator=g) * 3).to(DEVICE)  # [B, Q, V]
    active = torch.ones(2, 6, dtype=torch.bool, device=DEVICE)
    inp = StepInput(logits=logits, tokens=torch.full((2, 6), 7, device=DEVICE), active=active, query_start=0,
                    window=(1, 5), step=0, steps=None, mask_id=7, temperature=0.0, generator=None)
    t_ref, c_ref = propose_with_confidence(inp, "torch")
    t_fused, c_fused = propose_with_confidence(inp, "fused")
    assert torch.equal(t_fused, t_ref)
    assert c_fused.dtype == torch.float32 and c_ref.dtype == torch.float64
    finite = torch.isfinite(c_ref)
    assert torch.equal(finite, torch.isfinite(c_fused))
    torch.testing.assert_close(c_fused[finite].double(), c_ref[finite], rtol=1e-5, atol=1e-7)


def test_auto_takes_the_fused_path_only_on_cuda():
    logits = torch.zeros(1, 2, 8, device=DEVICE)
    assert use_fused("auto", logits) == (DEVICE.type == "cuda")
    assert use_fused("fused", logits) and not use_fused("torch", logits)


LOPA = [("lopa", {}), ("lopa", {"confidence": "max_prob", "compact": False}), ("lopa", {"bonus": True, "reuse": False}),
        ("lopa", {"compact": False}), ("lopa", {"compact": False, "verify_variants": False, "branches": 5}),
        ("fast", {}), ("fast", {"compact": False})]


@pytest.mark.parametrize("sampler, options", LOPA, ids=["lopa", "lopa-maxprob-static", "lopa-bonus", "lopa-static",
                                                        "lopa-noguard-static", "fast", "fast-static"])
@pytest.mark.parametrize("cache", ["none", "dual"])
def test_lopa_with_fused_stats_gives_the_reference_tokens(sampler, options, cache):
    """LoPA's anchor, variant ranking, variant scores and bonus from the fused statistics (float32, one
    pass) against the float64 / float32 softmaxes: the same tokens and forwards on a ragged batch."""
    model = tiny("llada", seed=3).to(DEVICE)
    kw = dict(gen_length=12, block_length=4, cache=cache)
    ref = _generate(model, PROMPTS, sampler, "torch", options, **kw)
    fused = _generate(model, PROMPTS, sampler, "fused", options, **kw)
    assert torch.equal(fused.generated, ref.generated), f"{fused.generated.tolist()} != {ref.generated.tolist()}"
    assert (fused.nfe, fused.forwarded_tokens) == (ref.nfe, ref.forwarded_tokens)


def test_lopa_proposals_agree_between_the_two_paths():
    from dllm.samplers.lopa import Proposals

    g = torch.Generator().manual_seed(1)
    logits = (torch.randn(3, 2, 5, 300, generator=g) * 3).to(DEVICE)  # [N, k, W, V]
    ref, fused = Proposals(logits, 7, False, torch.float64), Proposals(logits, 7, True, torch.float64)
    assert torch.equal(fused.tokens, ref.tokens) and not (ref.tokens == 7).any()
    torch.testing.assert_close(fused.max_prob.double(), ref.max_prob, rtol=1e-5, atol=1e-7)
    torch.testing.assert_close(fused.confidence("negative_entropy").double(), ref.confidence("negative_entropy"),
                               rtol=1e-4, atol=1e-6)  # Dream's + 1e-10 inside the log: far below this
    rows = torch.tensor([2, 0], device=DEVICE)
    for props in (ref, fused):
        sub = props.rows(rows)
        assert torch.equal(sub.tokens, props.tokens[rows])
        assert torch.equal(sub.confidence("max_prob"), props.confidence("max_prob")[rows])
        assert torch.equal(sub.confidence("negative_entropy"), props.confidence("negative_entropy")[rows])
