"""``generate(seed=[...])``: one generator per row, so a row of a ragged batch draws exactly what it
draws alone with its seed (``dllm.samplers.draws``), for every sampler that draws."""

from __future__ import annotations

import pytest
import torch

import dllm
from dllm.models.tiny import tiny
from dllm.samplers import list_samplers, make_sampler

PROMPTS = [[5, 6, 7, 8, 9, 10], [11, 12, 13], [14, 15, 16, 17, 18, 19, 20, 21]]
SEEDS = [3, 5, 3]  # a seed repeated on rows of different prompts
DRAWING = [name for name, _ in list_samplers() if not make_sampler(name).greedy_only]


@pytest.fixture(scope="module")
def llada():
    return tiny("llada", n_layers=1, d_model=32, n_heads=2, n_kv_heads=2, mlp_hidden=64, seed=0)


@pytest.fixture(scope="module")
def dream():
    return tiny("dream", n_layers=1, d_model=32, n_heads=2, n_kv_heads=2, mlp_hidden=64, seed=0)


def _alone_and_batched(model, seeds=SEEDS, **kw):
    g = kw["gen_length"]
    alone = [dllm.generate(model, [p], seed=s, **kw).sequences[0, -g:].tolist() for p, s in zip(PROMPTS, seeds)]
    batched = dllm.generate(model, PROMPTS, seed=list(seeds), **kw).sequences[:, -g:].tolist()
    return alone, batched


@pytest.mark.parametrize("cache", ["none", "dual"])
@pytest.mark.parametrize("sampler", DRAWING)
def test_each_row_draws_what_it_draws_alone(llada, sampler, cache):
    alone, batched = _alone_and_batched(llada, sampler=sampler, cache=cache, gen_length=8, block_length=4,
                                        temperature=1.0)
    assert batched == alone


@pytest.fixture(scope="module")
def trained():
    return dllm.load("tiny-llada")


TASKS = ["[BOS] sort D A C B [SEP]", "[BOS] sort B A [SEP]", "[BOS] reverse A B C D E [SEP]"]


def _block_steps(model, prompts, seeds, **kw):
    """How many steps each block of a decode of ``prompts`` runs."""
    seen = []
    dllm.generate(model, prompts, seed=seeds, callback=lambda st: seen.append(st.block_index), **kw)
    return [seen.count(b) for b in range(max(seen) + 1)]


@pytest.mark.parametrize("cache", ["none", "dual"])
@pytest.mark.parametrize("sampler", DRAWING)
def test_a_row_whose_block_ends_early_draws_no_more(trained, sampler, cache):
    """Adaptive samplers on a trained model: rows fill their blocks at different steps. A row whose
    block is done keeps stepping with the batch but draws nothing there (alone it ran no such step),
    so it starts the next block where it would alone."""
    spec = "sdar:denoising_steps=3" if sampler == "sdar" else sampler  # at most a block's width of steps
    kw = dict(sampler=spec, cache=cache, gen_length=7, block_length=3, temperature=0.7)
    seeds = [11, 22, 33]
    alone = [dllm.generate(trained, [p], seed=[s], **kw).generated_ids[0] for p, s in zip(TASKS, seeds)]
    assert dllm.generate(trained, TASKS, seed=seeds, **kw).generated_ids == alone


def test_the_rows_above_do_end_their_blocks_at_different_steps(trained):
    """The test above can fail: under ``threshold`` the batch's rows need different steps per block."""
    kw = dict(sampler="threshold", gen_length=7, block_length=3, temperature=0.7)
    seeds = [11, 22, 33]
    alone = [_block_steps(trained, [p], [s], **kw) for p, s in zip(TASKS, seeds)]
    assert len({tuple(a) for a in alone}) > 1
    assert _block_steps(trained, TASKS, seeds, **kw) == [max(a[b] for a in alone) for b in range(3)]


@pytest.mark.parametrize("sampler", ["origin", "maskgit_plus", "entropy"])
def test_dream_family(dream, sampler):
    alone, batched = _alone_and_batched(dream, sampler=sampler, gen_length=8, block_length=8, temperature=1.0)
    assert batched == alone


@pytest.mark.parametrize("sampler", ["random", "origin"])
def test_greedy_samplers_that_still_draw(llada, sampler):
    """T = 0 with a random order (LLaDA ``random``, Dream ``origin``): the draws are per row too."""
    alone, batched = _alone_and_batched(llada, sampler=sampler, gen_length=8, block_length=8, temperature=0.0)
    assert batched == alone


def test_one_shared_seed_is_not_per_row(llada):
    """The check above can fail: with one generator for the batch, rows repeat no draw of their own."""
    kw = dict(sampler="low_confidence", gen_length=8, block_length=8, temperature=1.0)
    same = dllm.generate(llada, [PROMPTS[0]] * 3, seed=[7, 7, 7], **kw).sequences
    shared = dllm.generate(llada, [PROMPTS[0]] * 3, seed=7, **kw).sequences
    assert (same == same[0]).all()  # per-row: equal seeds, equal rows
    assert not (shared == shared[0]).all()  # shared: each row draws the next part of one stream


def test_unseeded_entries_are_fresh(llada):
    out = dllm.generate(llada, PROMPTS, seed=[3, None, 3], sampler="low_confidence", gen_length=8, temperature=1.0)
    alone = dllm.generate(llada, [PROMPTS[0]], seed=3, sampler="low_confidence", gen_length=8, temperature=1.0)
    assert torch.equal(out.sequences[0, -8:], alone.sequences[0, -8:])


@pytest.mark.parametrize("seed, match", [([1, 2], "2 seeds for 3 prompts"), ([1, -1, 2], "seed must be"),
                                         ([1, 2**64, 2], "seed must be"), ([1, True, 2], "seed must be")])
def test_bad_seed_lists(llada, seed, match):
    with pytest.raises(ValueError, match=match):
        dllm.generate(llada, PROMPTS, seed=seed, gen_length=4)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.bfloat16, torch.float16])
@pytest.mark.parametrize("k,replacement", [(1, True), (1, False), (3, False), (2, True)])
def test_the_race_draws_what_torch_multinomial_draws(dtype, k, replacement):
    """draws.race is aten's multinomial fast path without its host reads: the same samples, and the
    generator left in the same state, for every seed (rows with one certain entry included)."""
    from dllm.engine.graph_check import is_host_read
    from dllm.samplers.draws import race

    for seed in range(40):
        g = torch.Generator().manual_seed(seed)
        p = torch.softmax(torch.randn(7, 50, generator=g) * 3, dim=-1).to(dtype)
        p[0] = 0
        p[0, 5] = 1
        g1, g2 = torch.Generator().manual_seed(seed + 99), torch.Generator().manual_seed(seed + 99)
        assert torch.equal(torch.multinomial(p, k, replacement=replacement, generator=g1), race(p, k, g2, replacement))
        assert torch.equal(g1.get_state(), g2.get_state())
    reads = is_host_read(torch.ops.aten.multinomial.default, (p, k, replacement))
    assert reads == (k == 1 or not replacement)  # the fast path's sanity checks, which race leaves out
