"""LLaDA 2.x's official decoding loop (``LLaDA2MoeModelLM.generate``, transcribed in
tests/reference/decoders/llada2_generate.py over the transcribed modelling) against ``dllm.generate(model,
..., "sdar", cache="block")``: token for token on 20 prompts per setting, block sizes 4 and 8,
several thresholds, temperatures, top-k / top-p, with the official stop after a block holding EOS.

LLaDA 2's step is SDAR's ``low_confidence_dynamic`` rule (dllm/samplers/sdar.py): the same quota
schedule, sampled proposals over the grid block's rows, ``> threshold`` else the most confident
masks. Two conventions of the original are mapped, not copied: its ``temperature=0`` samples at 1
(the division is skipped, ``multinomial`` still draws), so it is compared with dllm's
``temperature=1.0``; and it may sample the mask id itself, leaving the position masked at the end of
a block -- those runs are detected (on the official final canvas) and excluded: dllm's engine
requires a block free of masks after its steps, so on a block's last step the sampler replaces a
drawn mask with the row's best other token (``never_mask``); the rest must all be equal."""

from __future__ import annotations

import pytest
import torch

import dllm
from dllm.models import load
from tests.reference.decoders.llada2_generate import llada2_generate
from tests.reference.modelling.llada2_modeling import RefLLaDA2MoeModelLM

from .test_llada2 import TINY

N_PROMPTS = 20
EOS, MASK = 94, 95


@pytest.fixture(scope="module", params=[4, 8], ids=lambda bs: f"bs{bs}")
def pair(request, tmp_path_factory):
    bs = request.param
    path = tmp_path_factory.mktemp(f"llada2-bs{bs}")
    ref = RefLLaDA2MoeModelLM.random({**TINY, "block_size": bs}, seed=11)
    with torch.no_grad():  # a larger EOS row: some answers end before the last block
        ref.lm_head.weight[EOS] *= 3.0
    ref.save_official(path)
    return ref, load(path)


def _prompt(i: int, bs: int) -> tuple[torch.Tensor, int]:
    g = torch.Generator().manual_seed(100 + i)
    n = int(torch.randint(3, 15, (1,), generator=g))
    prompt = torch.randint(5, 90, (1, n), generator=g)
    return prompt, (-(n + 12)) % bs + 12  # gen_length reaching a grid boundary, as the official canvas


def _compare(ref, ours, *, threshold, temperature=0.0, steps=None, top_k=None, top_p=None, cache="block"):
    bs = ours.config.block_size
    steps = steps or bs
    equal, skipped, stopped = 0, 0, 0
    for i in range(N_PROMPTS):
        prompt, gen = _prompt(i, bs)
        torch.manual_seed(i)
        canvas: list = []
        r = llada2_generate(ref, prompt, temperature=temperature, block_length=bs, steps=steps, gen_length=gen,
                            top_k=top_k, top_p=top_p, threshold=threshold, eos_id=EOS, mask_id=MASK,
                            canvas=canvas)[0]
        n = prompt.shape[1]
        decoded = canvas[0][0, n:n + gen]
        stop = -(-(n + len(r)) // bs) * bs - n if len(r) < gen else gen  # the end of the block the loop stopped after
        if (decoded[:stop] == MASK).any():  # the original sampled the mask id and left it: excluded (module docstring)
            skipped += 1
            continue
        o = dllm.generate(ours, prompt, "sdar", gen_length=gen, cache=cache, seed=i, stop_at_eos=True,
                          temperature=temperature if temperature > 0 else 1.0, denoising_steps=steps,
                          strategy="low_confidence_dynamic", threshold=threshold, top_k=top_k or 0,
                          top_p=1.0 if top_p is None else top_p).sequences[0, prompt.shape[1]:]
        assert torch.equal(o[:len(r)], r), (i, r.tolist(), o.tolist())
        assert torch.equal(o[:stop], decoded[:stop])  # the whole decoded region, past the first EOS too
        if len(r) < gen:  # the official loop stops after the block holding its first EOS; dllm stops after
            assert r[-1] == EOS and (o[stop:] == EOS).all()  # the same block, the rest filled with EOS
            stopped += int(stop < gen)
        equal += 1
    return equal, skipped, stopped


SLOW = pytest.mark.slow  # ~5 s per block size on one CPU core: the fast suite keeps one threshold


@pytest.mark.parametrize("threshold", [0.5, pytest.param(0.95, marks=SLOW), pytest.param(0.3, marks=SLOW)])
def test_token_equal_one_token_quota_per_step(pair, threshold):
    equal, skipped, _ = _compare(*pair, threshold=threshold)
    assert equal + skipped == N_PROMPTS and equal >= N_PROMPTS - 3  # every compared run equal (above)


@SLOW
def test_token_equal_at_temperature_with_top_k_top_p(pair):
    equal, skipped, _ = _compare(*pair, threshold=0.5, temperature=0.7, top_k=20, top_p=0.95)
    assert equal + skipped == N_PROMPTS and equal >= N_PROMPTS - 3  # every compared run equal (above)


@SLOW
def test_token_equal_without_cache(pair):
    equal, skipped, _ = _compare(*pair, threshold=0.5, cache="none")
    assert equal + skipped == N_PROMPTS and equal >= N_PROMPTS - 3  # every compared run equal (above)


@SLOW
def test_fewer_steps_than_block(pair):
    ref, ours = pair
    equal, skipped, _ = _compare(ref, ours, threshold=0.5, steps=ours.config.block_size // 2)
    assert equal + skipped == N_PROMPTS and equal >= N_PROMPTS - 3


@SLOW
def test_eos_stop_is_exercised(pair):
    stopped = sum(_compare(*pair, threshold=t)[2] for t in (0.95, 0.3))
    assert stopped >= 1
