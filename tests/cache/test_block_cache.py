"""``cache="block"``: the exact cache of block-causal models (dllm/cache/block_causal.py).

It equals recomputing everything (``cache="none"``) token for token for every registered sampler,
its stored keys/values of finished blocks equal a fresh forward's, it forwards the rows its
docstring says (fewer than Fast-dLLM's ``dual`` on long prompts), and every approximate policy is
refused for block-causal models with the reason, as is ``block`` for a bidirectional model."""

from __future__ import annotations

import pytest
import torch

import dllm
from dllm.models import tiny
from dllm.samplers import list_samplers, make_sampler
from dllm.schedule import plan_block_causal

PROMPTS = [[5, 6, 7, 8, 9, 10, 11], [12, 13, 14]]  # lengths 7 and 3: the same offset (3) in blocks of 4
SAMPLERS = [name.split()[0] for name, _ in list_samplers()]
# LLaDA's "random" remasking draws a random score for every query row even at T = 0: the stream's
# length is the query's, so it differs between policies (as it does under prefix/dual), in tokens only
QUERY_NOISE = ("random",)


@pytest.fixture(scope="module")
def model():
    return tiny("sdar", seed=3)


def _pair(model, sampler, **kw):
    kw.setdefault("gen_length", 13)
    out = {c: dllm.generate(model, PROMPTS, sampler, cache=c, return_trace=True, seed=7, **kw)
           for c in ("none", "block")}
    return out["none"], out["block"]


# samplers that read logits right of the block (Sampler.reads_right_of_block), which the block cache
# never forwards: they decide from what the cache computes, documented as not exact under it
RIGHT_OF_BLOCK = [s for s in SAMPLERS if make_sampler(s).reads_right_of_block]


def test_the_samplers_that_read_right_of_the_block_are_these():
    assert RIGHT_OF_BLOCK == ["klass", "prophet"]
    assert not make_sampler("klass", reset_each_block=True).reads_right_of_block


@pytest.mark.parametrize("sampler", RIGHT_OF_BLOCK)
def test_a_sampler_reading_right_of_the_block_decodes_under_it(sampler):
    """On the trained tiny-sdar, prompts where those columns change a decision without the cache: each
    decode completes under both policies; klass that starts each block afresh is exact again."""
    model = dllm.load("tiny-sdar")
    prompt = {"prophet": [[7, 8, 9]], "klass": [[13, 14]]}[sampler]
    kw = dict(gen_length=10, block_length=4)
    out = {c: dllm.generate(model, prompt, sampler, cache=c, **kw) for c in ("none", "block")}
    assert all((o.sequences != model.mask_id).all() for o in out.values())
    if sampler == "klass":
        same = {c: dllm.generate(model, prompt, "klass:reset_each_block=True", cache=c, **kw).sequences
                for c in ("none", "block")}
        assert torch.equal(same["none"], same["block"])


@pytest.mark.parametrize("cfg_scale", [0.0, 1.5], ids=["plain", "cfg"])
@pytest.mark.parametrize("sampler", [s for s in SAMPLERS if s not in QUERY_NOISE + tuple(RIGHT_OF_BLOCK)])
def test_every_sampler_equals_no_cache_at_temperature_zero(model, sampler, cfg_scale):
    ref, out = _pair(model, sampler, cfg_scale=cfg_scale)
    assert torch.equal(out.sequences, ref.sequences)
    assert torch.equal(out.trace, ref.trace)
    assert out.nfe == ref.nfe
    assert out.forwarded_tokens < ref.forwarded_tokens


@pytest.mark.parametrize("sampler", [s for s in SAMPLERS if make_sampler(s).reads_block_only
                                     and not make_sampler(s).greedy_only] + ["sdar"])
def test_samplers_drawing_noise_on_the_block_equal_no_cache_when_sampling(model, sampler):
    """At T > 0 a sampler that draws its noise for the block's rows only (``reads_block_only``, or
    ``sdar``: the grid block's rows) consumes the same random stream under both policies. (One that
    draws noise for every query row, LLaDA's Gumbel ``low_confidence``, consumes a stream whose length
    is the query's: equal in distribution, not in tokens, as under any cache.)"""
    ref, out = _pair(model, sampler, temperature=0.8)
    assert torch.equal(out.sequences, ref.sequences)


def test_finished_blocks_keep_exact_keys(model):
    """After a call the buffers of every finished grid block hold what a fresh forward of the final
    canvas computes (the current block's last step ran before its last commit: not compared)."""
    seen = {}

    def spy(state):
        seen["kv"], seen["x"], seen["s"] = state.kv, state.x.clone(), state.block_start

    dllm.generate(model, PROMPTS[:1], "low_confidence", gen_length=13, cache="block", callback=spy)
    x, kv = seen["x"], seen["kv"]
    last_grid = seen["s"] - 4  # the last block starts on the grid; the one before it is complete
    fresh = model.new_kv_cache(1, x.shape[1])
    with torch.no_grad():
        model(x, cache=fresh.view(0))
    for layer in range(model.config.n_layers):
        assert torch.allclose(kv.k[layer][:, :, :last_grid], fresh.k[layer][:, :, :last_grid], atol=1e-5, rtol=0)
        assert torch.allclose(kv.v[layer][:, :, :last_grid], fresh.v[layer][:, :, :last_grid], atol=1e-5, rtol=0)


def test_forwarded_rows_as_documented(model):
    """One token per step, prompt 7 (grid blocks [0, 4), [4, 8) holding the prompt tail 4..6), 13
    generated: blocks [7, 8), [8, 12), [12, 16), [16, 20). First block start: the prefill [0, 8);
    later block starts [g - 4, e) = 8 rows; later steps [g, e) = 4 rows."""
    out = dllm.generate(model, PROMPTS[:1], "low_confidence", gen_length=13, cache="block")
    starts = 8 + 3 * 8  # the first block has one step (1 mask), the three others start with 8 rows
    later = 3 * 3 * 4
    assert out.forwarded_tokens == starts + later
    assert out.nfe == 13


def _dual_twin(model):
    """A bidirectional model of the same sizes: what `dual` costs on this canvas."""
    return tiny("llada", seed=0, d_model=64, n_layers=2, n_heads=4, n_kv_heads=2, mlp_hidden=128,
                max_positions=model.config.max_positions)


@pytest.mark.parametrize("prompt_length", [256, 512, 1024, 2040])
def test_fewer_forwarded_tokens_than_dual_on_long_prompts(prompt_length):
    """The long-prompt suite's prompt sizes (dllm/tasks/long_prompt.py: 256-2,040 words, 2-4-word
    answers): ``block`` forwards fewer rows than ``dual`` (a full forward per block) and ``none``."""
    sdar = tiny("sdar", seed=3, max_positions=2048)
    ids = torch.randint(10, 100, (1, prompt_length), generator=torch.Generator().manual_seed(prompt_length))
    gen = 8 - (prompt_length % 4)  # two grid blocks after a prompt tail
    block = dllm.generate(sdar, ids, "low_confidence", gen_length=gen, cache="block")
    dual = dllm.generate(_dual_twin(sdar), ids, "low_confidence", gen_length=gen, block_length=4, cache="dual")
    length = prompt_length + gen
    assert block.forwarded_tokens < dual.forwarded_tokens
    # dual re-forwards the whole canvas at its second block start, block only two grid blocks
    assert dual.forwarded_tokens - block.forwarded_tokens >= length - 2 * 4
    assert block.nfe == dual.nfe


@pytest.mark.parametrize("cache", ["prefix", "dual", "dual:look_back=16,look_ahead=16", "window", "drift",
                                   "auto:look_back=4", "dual:refresh=1"])
def test_approximate_policies_refused_with_the_reason(model, cache):
    with pytest.raises(ValueError, match=r"refused for .*block-causally \(block 4\).*Valid for this model: "
                                         r"none, block"):
        dllm.generate(model, PROMPTS, "low_confidence", gen_length=8, cache=cache)


def test_auto_is_block_for_block_causal_models(model):
    auto = dllm.generate(model, PROMPTS, "threshold", gen_length=9, cache="auto", return_trace=True)
    block = dllm.generate(model, PROMPTS, "threshold", gen_length=9, cache="block", return_trace=True)
    assert torch.equal(auto.sequences, block.sequences)
    assert (auto.nfe, auto.forwarded_tokens) == (block.nfe, block.forwarded_tokens)


def test_block_cache_refused_for_bidirectional_models():
    with pytest.raises(ValueError, match="exact only for a block-causal model.*attends bidirectionally"):
        dllm.generate(tiny("llada", seed=1), PROMPTS, "low_confidence", gen_length=8, block_length=4,
                      cache="block")


def test_block_length_must_be_the_trained_block(model):
    with pytest.raises(ValueError, match=r"block_length=8 disagrees with the checkpoint's trained block.*"
                                         r"block_size 4.*use block_length=4 or None"):
        dllm.generate(model, PROMPTS, gen_length=16, block_length=8)
    out = dllm.generate(model, PROMPTS, gen_length=9, block_length=4, cache="block")
    assert out.sequences.shape[1] == 7 + 9


def test_prompts_at_different_block_offsets_refused(model):
    with pytest.raises(ValueError, match=r"lengths 2, 3 end at different offsets.*mod 4"):
        dllm.generate(model, [[5, 6], [5, 6, 7]], gen_length=8)


def test_block_plan():
    plan = plan_block_causal(13, None, None, fixed_steps=True, block_size=4, prompt_lengths=[7])
    assert [(s, e) for s, e, _ in plan.blocks] == [(0, 1), (1, 5), (5, 9), (9, 13)]
    assert [n for _, _, n in plan.blocks] == [1, 4, 4, 4]
    aligned = plan_block_causal(6, None, 6, fixed_steps=True, block_size=4, prompt_lengths=[8])
    assert [(s, e, n) for s, e, n in aligned.blocks] == [(0, 4, 3), (4, 6, 2)]  # 3 steps / block, last 2
    with pytest.raises(ValueError, match="steps=5 cannot be split evenly over the 2 blocks"):
        plan_block_causal(6, None, 5, fixed_steps=True, block_size=4, prompt_lengths=[8])


@pytest.mark.parametrize("cache", ["none", "block"])
@pytest.mark.parametrize("sampler", ["sdar", "threshold", "low_confidence"])
def test_left_padded_batch_decodes_as_each_prompt_alone(model, sampler, cache):
    prompts = PROMPTS + [[20, 21, 22, 23, 24, 25, 26, 27, 28, 29, 30]]  # lengths 7, 3, 11: offset 1 in blocks of 4
    batch = dllm.generate(model, prompts, sampler, gen_length=13, cache=cache)
    for i, p in enumerate(prompts):
        alone = dllm.generate(model, [p], sampler, gen_length=13, cache=cache)
        assert torch.equal(batch.generated[i], alone.generated[0])
