"""Learn2PD (``dllm.samplers.learn2pd``) against the transcription of the authors' loops
(``tests/reference/decoders/learn2pd_generate.py``: ``generate_learn2parallel`` and
``generate_l2p_eot``): the same tokens and forwards on 20 prompts x 4 settings on tiny-llada and
tiny-dream, with the shipped filter in the authors' format (``learn2pd-tiny``: it reads the
confidences as theirs does); EoTP on an oracle; caches, ragged batches, the filter, bad options."""

from __future__ import annotations

import json

import pytest
import torch

import dllm
from dllm import tasks as T
from dllm.models.oracle import OracleLM, oracle_prompts, score_generation
from dllm.samplers.learn2pd import (DEFAULT_FILTER, Learn2PDFilter, end_of_text, filter_directory, load_filter,
                                    shipped_filters)
from tests.reference.decoders.learn2pd_generate import learn2pd_generate
from tests.samplers.test_apd import prompts, upto_eos  # the same 20 prompts as APD's test

AUTHORS_FORMAT = "learn2pd-tiny"  # the shipped filter that reads what the authors' filter reads
SETTINGS = [
    dict(threshold=0.96, eotp=False),  # L2P at the authors' accept_thres
    dict(threshold=0.8, eotp=True),  # L2P + EoT, one block of the answer length
    dict(threshold=0.9, eotp=False, temperature=1.0),  # sampled proposals, the reference's uniforms
    dict(threshold=0.9, eotp=False, block_length=4),  # blocks of 4 (the canvas rounded up to them)
]


@pytest.fixture(scope="module", params=["tiny-llada", "tiny-dream"])
def model(request):
    return dllm.load(request.param)


@pytest.mark.parametrize("setting", SETTINGS, ids=lambda s: ",".join(f"{k}={v}" for k, v in s.items()))
def test_equals_the_authors_loop(model, setting):
    opts = dict(setting)
    t = opts.pop("temperature", 0.0)
    block = opts.pop("block_length", None)
    weights = dict(load_filter(AUTHORS_FORMAT).state_dict())  # linear1 / linear2: the authors' key names
    eos = model.eos_ids[0]
    for i, (prompt, g) in enumerate(prompts(model)):
        if block is not None:
            g = -(-g // block) * block  # the reference needs whole blocks
        bl = block or g
        ref, ref_nfe = learn2pd_generate(model, weights, prompt, g, block_length=bl, accept_thres=opts["threshold"],
                                         mask_id=model.mask_id, eos_id=eos, eot=opts["eotp"], temperature=t,
                                         generator=torch.Generator().manual_seed(i))
        out = dllm.generate(model, [prompt], sampler="learn2pd", filter=AUTHORS_FORMAT, gen_length=g, block_length=bl,
                            temperature=t, seed=i, **opts)
        ours = out.generated[0].tolist()
        assert upto_eos(ours, eos) == upto_eos(ref, eos), (i, prompt)
        assert out.nfe == ref_nfe, (i, prompt)


def test_eotp_ends_the_text_at_the_likeliest_eos():
    """A filter that accepts nothing leaves one token per step; EoTP's rule (b) ends each row after its
    likeliest EOS proposal (the oracle's answer EOS), so its EOS padding costs no step; with blocks,
    ``stop_at_eos`` then releases the row (no forward for its later blocks)."""
    reject = Learn2PDFilter(32)
    with torch.no_grad():
        for p in reject.parameters():
            p.zero_()
        reject.linear2.bias.fill_(-100.0)
    exs = T.test_split("copy", 4, 4)  # answers of 4 words + EOS, in a canvas of 13
    oracle = OracleLM()
    run = lambda **kw: dllm.generate(oracle, oracle_prompts(exs), sampler="learn2pd", filter=reject,  # noqa: E731
                                     gen_length=13, **kw)
    off, on = run(eotp=False), run(eotp=True)
    assert all(score_generation(exs, off)) and all(score_generation(exs, on))
    assert torch.equal(off.generated, on.generated)
    assert off.nfe == 13 and on.nfe == 6  # the first step ends the text after column 4: 5 masks, 1 committed
    blocks_off, blocks_on = run(eotp=False, block_length=4, stop_at_eos=True), run(eotp=True, block_length=4,
                                                                                    stop_at_eos=True)
    assert torch.equal(blocks_on.generated, on.generated) and blocks_on.nfe < blocks_off.nfe


def test_end_of_text_rules():
    active = torch.ones(3, 6, dtype=torch.bool)
    x0 = torch.tensor([[7, 7, 4, 7, 4, 7], [7, 4, 7, 4, 7, 7], [7, 7, 7, 7, 7, 7]])
    conf = torch.tensor([[0.9] * 6, [0.9, 0.5, 0.9, 0.8, 0.9, 0.9], [0.9] * 6])
    accepted = torch.zeros(3, 6, dtype=torch.bool)
    accepted[0, 4] = accepted[0, 2] = True  # (a) the first accepted EOS: column 2
    cut = end_of_text(accepted, x0, conf, active, eos=4)
    assert cut[0].tolist() == [False, False, False, True, True, True]
    assert cut[1].tolist() == [False, False, False, False, True, True]  # (b) the likeliest EOS: column 3
    assert not cut[2].any()  # no EOS proposed: the text goes on


@pytest.mark.parametrize("cache", ["none", "dual", "auto"])
def test_caches_and_ragged_batches_equal_each_row_alone(cache):
    model = dllm.load("tiny-llada")
    exs = [ex for name in ("copy", "sort", "replace_index") for ex in T.test_split(name, 6, n=2)]
    rows = [model.generation_prompt(" ".join(T.prompt_words(ex))) for ex in exs]  # ragged: 9 and 13 tokens
    kw = dict(sampler="learn2pd", gen_length=7, cache=cache)  # every answer: 6 words + EOS
    batch = dllm.generate(model, rows, **kw)
    assert (batch.generated != model.mask_id).all()
    for j, row in enumerate(rows):
        assert torch.equal(batch.generated[j], dllm.generate(model, [row], **kw).generated[0]), (cache, j)
    words = T.vocabulary()
    solved = sum(T.score(ex, [words[t] for t in r]) for ex, r in zip(exs, batch.generated.tolist()))
    assert solved >= 5, (cache, solved)


def test_the_filter_pads_a_narrow_block_and_refuses_a_wide_one():
    f = Learn2PDFilter(8, 4)
    conf = torch.rand(3, 5)
    padded = torch.cat([conf, torch.zeros(3, 3)], dim=1)
    assert torch.equal(f(conf), f(padded)[:, :5])
    with pytest.raises(ValueError, match="at most 8 positions"):
        f(torch.rand(1, 9))
    with pytest.raises(ValueError, match="block_length <= 32"):
        dllm.generate(dllm.load("tiny-llada"), "[BOS] sort D A C B [SEP]", sampler="learn2pd", gen_length=40)


def test_a_block_wider_than_the_filter_is_refused_when_the_settings_resolve():
    """As sdar's and fastdllm_v2's options: the server's settings check (``DecodeSettings.resolve``)
    names block_length before any decode starts, not the first block's ``begin_block``."""
    from dllm.options import SettingError
    from dllm.settings import DecodeSettings

    model = dllm.load("tiny-llada")
    with pytest.raises(SettingError, match="block_length <= 32") as err:
        DecodeSettings(sampler="learn2pd", block_length=40).resolve(model, [[2, 5, 6]], 40)
    assert err.value.field == "block_length"
    DecodeSettings(sampler="learn2pd", block_length=32).resolve(model, [[2, 5, 6]], 40)


def test_the_shipped_filters_load_and_name_their_recipe():
    """Both shipped filters are the authors' two-layer shape (2,112 parameters), and their
    filter.json holds the recipe that made them as the registry defines it now."""
    from dataclasses import asdict

    from dllm.train.learn2pd import filter_recipes

    assert {AUTHORS_FORMAT, DEFAULT_FILTER} <= set(shipped_filters())
    for name in (AUTHORS_FORMAT, DEFAULT_FILTER):
        f = load_filter(name)
        assert (f.width, f.hidden) == (32, 32) and sum(p.numel() for p in f.parameters()) == 2112
        made = json.loads((filter_directory(name) / "filter.json").read_text())
        assert made["recipe"] == json.loads(json.dumps(asdict(filter_recipes.get(name))))
        assert f.input == made["recipe"]["input"] and made["evaluation"]["test"]["at_0.96"]["precision"] > 0.95


@pytest.mark.parametrize("bad, match", [
    (dict(threshold=1.5), r"threshold must be a number in \[0, 1\]"), (dict(threshold=-0.1), "threshold"),
    (dict(filter="no-such-filter"), "neither a shipped Learn2PD filter .*learn2pd-tiny"),
    (dict(filter=""), "filter must be"), (dict(filter=3), "filter must be"),
    (dict(eotp="yes"), "eotp must be True or False"), (dict(ties="lowest"), "ties must be one of"),
])
def test_bad_options(bad, match):
    with pytest.raises(ValueError, match=match):
        dllm.generate(dllm.load("tiny-llada"), "[BOS] sort D A C B [SEP]", sampler="learn2pd", gen_length=5, **bad)


@pytest.mark.parametrize("cache", ["none", "dual"])
@pytest.mark.parametrize("family", ["llada", "dream"])
def test_every_step_commits_in_every_unfinished_row(family, cache):
    """``commits_every_step`` (the engine skips its progress rule): the top-1 is always committed, so
    every row with a mask left commits one at every step, greedy and sampled (random models)."""
    from dllm.models.tiny import tiny
    from dllm.samplers import make_sampler

    assert make_sampler("learn2pd").commits_every_step
    model = tiny(family, seed=7)
    prompts = [list(range(10, 22)), list(range(14, 22))]
    for temperature, seed in ((0.0, None), (1.0, 5)):
        seen = []
        dllm.generate(model, prompts, sampler="learn2pd", cache=cache, gen_length=16, block_length=8,
                      temperature=temperature, seed=seed,
                      callback=lambda s: seen.append((s.x[:, s.block_start:s.block_end] == s.mask_id).sum(1).tolist()))
        before = [8, 8]
        for counts in seen:
            assert all(c < b for c, b in zip(counts, before) if b > 0), (seen, family, cache)
            before = counts if any(counts) else [8, 8]
