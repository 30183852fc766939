"""``spec_threshold``: token-for-token equal to ``threshold`` (its reference), with fewer forwards."""

import pytest
import torch

import dllm
from dllm.models import load, tiny
from dllm.samplers import make_sampler

PROMPTS = [[7, 8, 9, 10, 11], [12, 13], [14, 15, 16]]


@pytest.mark.parametrize("family", ["llada", "dream"])
@pytest.mark.parametrize("seed", [0, 1, 2])
@pytest.mark.parametrize("tau,draft,gen,block", [(0.9, 4, 16, 8), (0.3, 3, 12, 12), (0.05, 2, 16, 4), (0.9, 1, 8, 8)])
def test_equals_threshold_on_random_models(family, seed, tau, draft, gen, block):
    m = tiny(family, seed=seed)
    ref = dllm.generate(m, PROMPTS, sampler="threshold", threshold=tau, gen_length=gen, block_length=block)
    out = dllm.generate(m, PROMPTS, sampler="spec_threshold", threshold=tau, draft=draft, gen_length=gen,
                        block_length=block)
    assert torch.equal(out.sequences, ref.sequences)


@pytest.mark.parametrize("name", ["tiny-llada", "tiny-dream"])
def test_equals_threshold_on_the_embedded_models_with_fewer_forwards(name):
    from dllm import tasks as T

    m = load(name)
    exs = T.test_split("shuffle", 8, n=4) + T.test_split("sort", 8, n=4)
    prompts = [T.prompt_ids(ex) for ex in exs]
    la = T.answer_length("sort", 8)
    ref = dllm.generate(m, prompts, sampler="threshold", gen_length=la, block_length=la)
    out = dllm.generate(m, prompts, sampler="spec_threshold", gen_length=la, block_length=la)
    assert torch.equal(out.sequences, ref.sequences)
    assert out.nfe <= ref.nfe


def test_options_and_greedy_only():
    with pytest.raises(ValueError, match=r"threshold must be a number in \(0, 1\], got 0"):
        make_sampler("spec_threshold", threshold=0)
    with pytest.raises(ValueError, match="draft must be an integer >= 1, got 0"):
        make_sampler("spec_threshold", draft=0)
    with pytest.raises(ValueError, match="greedy only"):
        dllm.generate(tiny("llada"), [[7, 8]], sampler="spec_threshold", gen_length=4, temperature=1.0)


def test_equals_threshold_on_the_oracle():
    """On exact posteriors (``OracleLM``) too, including tasks with dependent tokens."""
    from dllm import tasks as T

    oracle = load("oracle")
    for task in ("shuffle", "replace_random", "sort"):
        exs = T.test_split(task, 5, n=3)
        prompts = [T.prompt_ids(ex) for ex in exs]
        la = T.answer_length(task, 5)
        ref = dllm.generate(oracle, prompts, sampler="threshold", gen_length=la, block_length=la)
        out = dllm.generate(oracle, prompts, sampler="spec_threshold", gen_length=la, block_length=la)
        assert torch.equal(out.sequences, ref.sequences), task
