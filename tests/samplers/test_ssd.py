"""ssd: token-for-token identical to low_confidence at one token per step, in fewer steps."""

import pytest
import torch

import dllm
from dllm import tasks as T
from dllm.models import tiny
from dllm.models.oracle import OracleLM, oracle_prompts, score_generation
from dllm.samplers import make_sampler

PROMPTS = [[7, 8, 9, 10, 11], [12, 13], [14, 15, 16]]


@pytest.mark.parametrize("family", ["llada", "dream"])
@pytest.mark.parametrize("draft", [1, 2, 4, 8])
@pytest.mark.parametrize("gen,block", [(12, 4), (12, 12), (10, 4)])
def test_lossless_against_low_confidence_one_token_per_step(family, draft, gen, block):
    model = tiny(family, seed=3)
    ref = dllm.generate(model, PROMPTS, sampler="low_confidence", gen_length=gen, block_length=block)
    out = dllm.generate(model, PROMPTS, sampler="ssd", gen_length=gen, block_length=block, draft=draft)
    assert torch.equal(out.sequences, ref.sequences)
    assert out.steps <= ref.steps


def test_lossless_with_cfg():
    model = tiny("llada", seed=4)
    ref = dllm.generate(model, PROMPTS, sampler="low_confidence", gen_length=8, block_length=4, cfg_scale=1.0)
    out = dllm.generate(model, PROMPTS, sampler="ssd", gen_length=8, block_length=4, cfg_scale=1.0)
    assert torch.equal(out.sequences, ref.sequences)


def test_on_the_oracle_whole_drafts_are_accepted():
    exs = T.test_split("copy", 6, 4)
    prompts = oracle_prompts(exs)
    la = T.answer_length("copy", 6)
    ref = dllm.generate(OracleLM(), prompts, sampler="low_confidence", gen_length=la, block_length=la)
    out = dllm.generate(OracleLM(), prompts, sampler="ssd", gen_length=la, block_length=la, draft=4)
    assert torch.equal(out.sequences, ref.sequences) and all(score_generation(exs, out))
    # every step accepts 4 drafts + 1 bonus: ceil(7 / 5) = 2 steps, 2 forwards each
    assert out.steps == 2 and out.nfe == 4 and ref.nfe == la


def test_counts_the_verification_forward():
    model = tiny("llada", seed=3)
    out = dllm.generate(model, [[7, 8, 9]], sampler="ssd", gen_length=4, draft=3)
    assert out.nfe == 2 * out.steps
    assert out.forwarded_tokens == out.steps * (1 + 3) * 7  # 1 step canvas + 3 variants, L = 7


def test_bad_input():
    with pytest.raises(ValueError, match="draft must be an integer >= 1, got 0"):
        make_sampler("ssd", draft=0)
    model = tiny("llada", seed=3)
    with pytest.raises(ValueError, match="greedy only"):
        dllm.generate(model, [[7, 8]], sampler="ssd", gen_length=4, temperature=1.0)
    with pytest.raises(ValueError, match="cache policy 'dual' cannot serve with these options: refresh=2"):
        dllm.generate(model, [[7, 8]], sampler="ssd", gen_length=4, cache="dual:refresh=2")
