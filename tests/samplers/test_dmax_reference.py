"""DMax's release loop (transcribed in tests/reference/decoders/dmax_generate.py over the transcribed
LLaDA 2 modelling, the family DMax ships for) against ``dllm.generate(model, ..., "dmax")`` on the
same weights: token for token and forward for forward, 20 prompts per setting, block sizes 4 and 8,
thresholds 0.5 (the release's evaluations), 0.0 (its chat example) and 0.9, caches ``block`` (the
exact cache of block-causal models, what ``auto`` picks) and ``none``, with the release's stop after a
block that holds EOS.

The weights give the mask a zero LM-head row, so the arg-max is never the mask id (dllm's sampler
never proposes it; the release's may, dllm/samplers/dmax.py), and a larger EOS row so that some
answers stop early."""

from __future__ import annotations

import pytest
import torch

import dllm
from dllm.models import load
from dllm.samplers import dmax as _dmax  # noqa: F401  (registers "dmax")
from tests.reference.decoders.dmax_generate import dmax_generate
from tests.reference.modelling.llada2_modeling import RefLLaDA2MoeModelLM

from tests.models.families.test_llada2 import TINY

N_PROMPTS = 20
EOS, MASK = 94, 95


@pytest.fixture(scope="module", params=[4, 8], ids=lambda bs: f"bs{bs}")
def pair(request, tmp_path_factory):
    bs = request.param
    path = tmp_path_factory.mktemp(f"dmax-llada2-bs{bs}")
    ref = RefLLaDA2MoeModelLM.random({**TINY, "block_size": bs}, seed=11)
    with torch.no_grad():
        ref.lm_head.weight[MASK] = 0.0  # never the arg-max (module docstring)
        ref.lm_head.weight[EOS] *= 3.0  # some answers end before the last block
    ref.save_official(path)
    return ref, load(path)


def _prompt(i: int, bs: int) -> tuple[torch.Tensor, int]:
    g = torch.Generator().manual_seed(300 + i)
    n = int(torch.randint(3, 15, (1,), generator=g))
    prompt = torch.randint(5, 90, (1, n), generator=g)
    return prompt, (-(n + 12)) % bs + 12  # gen_length reaching a grid boundary, as the release's canvas


def _compare(ref, ours, *, threshold: float, cache: str) -> int:
    bs = ours.config.block_size
    stopped = 0
    for i in range(N_PROMPTS):
        prompt, gen = _prompt(i, bs)
        n = prompt.shape[1]
        nfe: list = []
        want = dmax_generate(ref, prompt, block_length=bs, gen_length=gen, threshold=threshold, mask_id=MASK,
                             eos_id=EOS, nfe=nfe)[0, n:n + gen]
        out = dllm.generate(ours, prompt, "dmax", gen_length=gen, cache=cache, stop_at_eos=True, threshold=threshold)
        assert torch.equal(out.generated[0], want), (i, want.tolist(), out.generated[0].tolist())
        assert out.nfe == nfe[0], (i, out.nfe, nfe[0])
        stopped += int(bool((want == EOS).any()))
    return stopped


@pytest.mark.parametrize("threshold,cache", [(0.5, "block"), (0.0, "block"), (0.9, "none")])
def test_token_equal_to_the_release(pair, threshold, cache):
    _compare(*pair, threshold=threshold, cache=cache)


@pytest.mark.slow
def test_token_equal_other_caches_and_eos_stop(pair):
    stopped = _compare(*pair, threshold=0.5, cache="none") + _compare(*pair, threshold=0.3, cache="auto")
    assert stopped >= 1  # the stop after a block holding EOS is exercised
