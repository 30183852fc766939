"""``factor`` against the transcription of Fast-dLLM's factor mode (tests/reference/decoders/fastdllm_factor.py:
NVlabs/Fast-dLLM ``llada/generate.py`` at f6b35ec, ``get_transfer_index_dynamic`` driven by ``generate``,
``generate_with_prefix_cache`` and ``generate_with_dual_cache`` with ``factor`` set).

``dllm.generate(model, prompt, sampler="factor", factor=f, rule="reference", cache=c)`` equals the authors'
drivers token for token and NFE for NFE on 16 stress-suite prompts of tiny-llada, greedy, without a cache and
with the prefix and dual caches, at Fast-dLLM's setting (``factor=1.0``, blocks of 32: ``eval_gsm8k.sh``; 1 is
also ``get_transfer_index_dynamic``'s default) and at the project's frontier's other ends (1.5 / 1.9, blocks of
4 / 8). The generated length is the answer length rounded up to whole blocks (Fast-dLLM asserts it).

The default ``rule="written"`` (the longest prefix, as the rule is stated) is not the authors' code: their walk
also commits the last rank when it is the first to fail, so a block's last two masks always go together. It
differs from the authors' drivers on most of these prompts (shown below) and equals the transcription with that
quirk removed (``last_rank_quirk=False``). No run here would commit the mask id (none is skipped)."""

from __future__ import annotations

import functools

import numpy as np
import pytest
import torch

import dllm
from dllm.samplers import make_sampler
from dllm.samplers.threshold import factor_prefix_mask, factor_prefix_mask_as_reference
from tests.reference.decoders.fastdllm_factor import (dynamic_transfer_count, factor_generate,
                                                      factor_generate_with_dual_cache,
                                                      factor_generate_with_prefix_cache, get_transfer_index_dynamic)
from tests.reference.decoders.fastdllm_generate import FastDLLMLLaDA
from tests.samplers.test_hierarchy_upstream import prompts as stress_prompts

from builders import MASK, V, step_input

N_PROMPTS = 16
DRIVERS = {"none": factor_generate, "prefix": factor_generate_with_prefix_cache,
           "dual": factor_generate_with_dual_cache}
SLOW = pytest.mark.slow


@functools.lru_cache(maxsize=None)
def model():
    return dllm.load("tiny-llada")


@functools.lru_cache(maxsize=None)
def prompts() -> tuple[tuple[tuple[int, ...], int], ...]:
    """(prompt ids, answer length) of ``N_PROMPTS`` test-split instances spread over the stress suite."""
    return tuple((tuple(p), answer) for p, answer in stress_prompts(model(), N_PROMPTS))


def gen_length(answer: int, block: int) -> int:
    return -(-answer // block) * block  # whole blocks: Fast-dLLM asserts gen_length % block_length == 0


@functools.lru_cache(maxsize=None)
def reference(cache: str, factor: float, block: int, quirk: bool = True) -> tuple[tuple[list[int], int], ...]:
    """Per prompt: (the transcription's canvas, its NFE); ``quirk=False``: without the last-rank quirk."""
    m, rows = model(), []
    net = FastDLLMLLaDA(m)
    for prompt, answer in prompts():
        x, nfe = DRIVERS[cache](net, torch.tensor([prompt]), gen_length=gen_length(answer, block), block_length=block,
                                mask_id=m.mask_id, factor=factor, forbid_mask_commit=True, last_rank_quirk=quirk)
        rows.append((x[0].tolist(), nfe))
    return tuple(rows)


def ours(prompt, answer: int, cache: str, block: int, sampler: str = "factor", **options) -> tuple[list[int], int]:
    out = dllm.generate(model(), [list(prompt)], sampler=sampler, gen_length=gen_length(answer, block),
                        block_length=block, cache=cache, **options)
    return out.sequences[0].tolist(), out.nfe


def differing(case: tuple[str, float, int], quirk: bool = True, **run) -> list[int]:
    """Indices of the prompts where ``ours(..., **run)`` differs in tokens or NFE from the transcription at
    ``case`` = (cache, factor, block)."""
    cache, _, block = case
    pairs = zip(prompts(), reference(*case, quirk))
    return [i for i, ((prompt, answer), ref) in enumerate(pairs) if ours(prompt, answer, cache, block, **run) != ref]


# ---- end to end: the authors' drivers ----------------------------------------------------------------------
@pytest.mark.parametrize("cache,factor,block", [
    ("none", 1.0, 32),
    ("dual", 1.0, 32),
    ("prefix", 1.5, 4),
    pytest.param("prefix", 1.0, 32, marks=SLOW),
    pytest.param("none", 1.9, 8, marks=SLOW),
    pytest.param("prefix", 1.9, 8, marks=SLOW),
    pytest.param("dual", 1.9, 8, marks=SLOW),
    pytest.param("none", 1.5, 4, marks=SLOW),
    pytest.param("dual", 1.5, 4, marks=SLOW),
])
def test_reference_rule_equals_fastdllm(cache, factor, block):
    assert differing((cache, factor, block), factor=factor, rule="reference") == []


@pytest.mark.parametrize("cache", ["prefix", "dual"])
def test_a_partial_last_block_equals_the_engine(cache):
    """The cached drivers' ``partial_last_block`` (not in the original; used by benchmarks/frontier_driver.py
    on answers that are not a multiple of the block): 10 positions in blocks of 4, 4, 2 exactly as the
    engine decodes them, on the first 4 prompts; the original asserts whole blocks."""
    m = model()
    for prompt, _ in prompts()[:4]:
        x, nfe = DRIVERS[cache](FastDLLMLLaDA(m), torch.tensor([prompt]), gen_length=10, block_length=4,
                                mask_id=m.mask_id, factor=1.5, forbid_mask_commit=True, partial_last_block=True)
        out = dllm.generate(m, [list(prompt)], sampler="factor", factor=1.5, rule="reference", gen_length=10,
                            block_length=4, cache=cache)
        assert (out.sequences[0].tolist(), out.nfe) == (x[0].tolist(), nfe)
    with pytest.raises(AssertionError):
        DRIVERS[cache](FastDLLMLLaDA(m), torch.tensor([prompts()[0][0]]), gen_length=10, block_length=4,
                       mask_id=m.mask_id, factor=1.5)


def test_the_comparison_can_fail():
    """On the fast prefix-cache case's prompts: steps commit several tokens; ``threshold`` (0.9) and the
    default ``rule="written"`` (the quirk) each differ from the transcription on most prompts (14 and 12 of
    16 when written)."""
    case = ("prefix", 1.5, 4)
    forwards = sum(nfe for _, nfe in reference(*case))
    assert forwards < sum(gen_length(answer, case[2]) for _, answer in prompts())  # several tokens per forward
    assert len(differing(case, sampler="threshold", threshold=0.9)) >= N_PROMPTS // 2
    assert len(differing(case, factor=case[1])) >= N_PROMPTS // 2


@SLOW
@pytest.mark.parametrize("cache,factor,block", [("none", 1.0, 32), ("prefix", 1.0, 32), ("dual", 1.5, 4)])
def test_written_rule_is_the_reference_without_the_last_rank_quirk(cache, factor, block):
    assert differing((cache, factor, block), quirk=False, factor=factor) == []


# ---- one step --------------------------------------------------------------------------------------------
@pytest.mark.parametrize("factor", [0.5, 1.0, 1.9, 4.0])
@pytest.mark.parametrize("rule,quirk", [("reference", True), ("written", False)])
def test_one_step_equals_the_transcription_on_random_logits(factor, rule, quirk):
    g = torch.Generator().manual_seed(11)
    sampler = make_sampler("factor", factor=factor, rule=rule)
    for t in range(40):
        w = 2 + t % 14
        logits = torch.randn(3, w, V, generator=g) * (1 + t % 5)  # [B, W, V]
        logits[..., MASK] = -1e4  # the mask id is never proposed
        active = torch.rand(3, w, generator=g) < 0.8  # [B, W]
        active[:, t % w] = True  # every row has a mask (the original needs one)
        x = torch.where(active, MASK, 1)  # [B, W]
        x0, transfer = get_transfer_index_dynamic(logits, 0.0, "low_confidence", active, x, None, factor,
                                                  last_rank_quirk=quirk)
        out = sampler.step(step_input(logits, active, tokens=x), None)
        assert out.commit.tolist() == (transfer & active).tolist(), t
        assert out.tokens[active].tolist() == x0[active].tolist(), t


def boundary_rows(factor: float, n_max: int = 40) -> list[tuple[int, float]]:
    """(rank k, confidence c) with c within 4 ulps of ``1 - f / (k + 1)`` where the two forms of the test,
    ``c >= 1 - f / (k + 1)`` (Fast-dLLM) and ``(k + 1)(1 - c) <= f`` (the rule as written), disagree."""
    out = []
    for k in range(2, n_max):
        c = 1 - factor / (k + 1)
        for _ in range(4):
            c = float(np.nextafter(c, 0.0))
        for _ in range(9):
            passes_reference = not c < 1 - factor / (k + 1)
            if passes_reference != ((k + 1) * (1 - c) <= factor):
                out.append((k, c))
            c = float(np.nextafter(c, 1.0))
    return out


@pytest.mark.parametrize("factor", [0.7, 1.0, 1.3, 1.9])
def test_the_reference_rule_compares_as_fastdllm_at_the_boundary(factor):
    """Rows of confident ranks, then rank k at a confidence where the two forms disagree, then two that fail:
    ``rule="reference"`` commits what the original's walk commits; the written form commits otherwise."""
    rows = boundary_rows(factor)
    assert len(rows) >= 3
    for k, c in rows:
        conf = torch.tensor([[0.999] * (k - 1) + [c, 0.0, 0.0]], dtype=torch.float64)  # [1, N] descending
        n = conf.shape[1]
        theirs = dynamic_transfer_count(conf[0], factor)
        got = factor_prefix_mask_as_reference(conf, torch.tensor([n]), factor)  # [1, N]
        assert got.tolist() == [[r < theirs for r in range(n)]], (k, c)
        assert int(factor_prefix_mask(conf, factor).sum()) != theirs, (k, c)


def test_the_last_rank_quirk_on_hand_built_confidences():
    """Two masks, the second far from confident: Fast-dLLM commits both, the written rule only the first;
    with a third mask that fails too, both commit the first only (the failure is not at the last rank)."""
    for conf, theirs in (([0.99, 0.1], 2), ([0.99, 0.1, 0.05], 1)):
        sorted_conf = torch.tensor([conf], dtype=torch.float64)  # [1, N]
        n = sorted_conf.shape[1]
        assert dynamic_transfer_count(sorted_conf[0], 1.0) == theirs
        assert int(factor_prefix_mask_as_reference(sorted_conf, torch.tensor([n]), 1.0).sum()) == theirs
        assert int(factor_prefix_mask(sorted_conf, 1.0).sum()) == 1
        assert dynamic_transfer_count(sorted_conf[0], 1.0, last_rank_quirk=False) == 1


def test_rule_is_checked():
    with pytest.raises(ValueError, match=r"rule must be one of 'written', 'reference', got 'paper'"):
        make_sampler("factor", rule="paper")
