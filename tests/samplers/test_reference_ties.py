"""Token equality with the reference samplers where confidences tie: on peaked logits the softmax
saturates to exactly 1.0 at several masks, so the top-k cut falls among equal confidences and only
the reference's own ``torch.topk`` reproduces its choice (``test_reference_equality.py`` runs the
tie-free cases); and the ``ties`` option on one step of equal confidences."""

from __future__ import annotations

import functools
import re

import pytest
import torch
from reference_cases import DREAM_PROMPT_LEN, LLADA_PROMPT_LEN, SHAPES, dream_model_fn, prompt_of

from tests.reference.decoders.dream_generate import dream_generate
from tests.reference.decoders.llada_generate import AmbiguousTieError, MaskCommitError, llada_generate

PEAKED_PROMPTS = range(20)


@functools.lru_cache(maxsize=None)
def _peaked_model(family: str, scale: float):
    """The tiny float32 model of ``model_of`` with every logit multiplied by ``scale``: its final
    RMSNorm weight is scaled (the LM head is linear), so ``forward`` and ``raw_logits`` agree. At
    scale 10 the float32 max-probability is exactly 1.0 at most masks (ties for ``maskgit_plus``,
    ``topk_margin``, ``low_confidence``) while the negative entropy stays distinct; at 100 the
    negative entropy is exactly 0.0 too."""
    from dllm.models import tiny

    model = tiny(family=family, seed=0, dtype=torch.float32)
    with torch.no_grad():
        model.transformer.norm.weight.mul_(scale)
    return model.eval()


def _peaked_counts(run_reference, run_dllm):
    """Over ``PEAKED_PROMPTS``: (prompts compared, prompts whose reference choice a tie decided,
    prompts where dllm differs). Prompts where the reference commits the mask id are skipped."""
    compared = tied = differ = 0
    for seed in PEAKED_PROMPTS:
        try:
            ref = run_reference(seed, forbid_ties=False)
        except MaskCommitError:
            continue
        try:
            run_reference(seed, forbid_ties=True)
        except AmbiguousTieError:
            tied += 1
        compared += 1
        differ += not torch.equal(run_dllm(seed), ref)
    return compared, tied, differ


# (algorithm, logit scale, gen_length, steps, batch)
PEAKED_DREAM_CASES = [
    pytest.param("maskgit_plus", 10.0, 16, 8, 1, id="maskgit_plus-x10-g16s8"),
    pytest.param("maskgit_plus", 100.0, 16, 16, 1, id="maskgit_plus-x100-g16s16"),
    pytest.param("topk_margin", 10.0, 16, 8, 1, id="topk_margin-x10-g16s8"),
    pytest.param("topk_margin", 100.0, 12, 5, 2, id="topk_margin-x100-g12s5-b2"),
    pytest.param("entropy", 100.0, 16, 8, 1, id="entropy-x100-g16s8"),
    pytest.param("entropy", 100.0, 12, 5, 2, id="entropy-x100-g12s5-b2"),
]


@pytest.mark.slow  # seconds: the default run leaves it to -m slow (CI runs both)
@pytest.mark.parametrize("alg,scale,gen,steps,batch", PEAKED_DREAM_CASES)
def test_dream_peaked_ties_equal_reference(alg, scale, gen, steps, batch):
    """Dream's ``torch.topk`` over tied confidences: dllm makes the same call, so the same choice.
    (With a stable sort -- lowest index first -- maskgit_plus / topk_margin matched 0-4 of 20
    prompts at scale 10 and every algorithm 0 of 20 at scale 100.)"""
    import dllm

    model = _peaked_model("dream", scale)

    def run_reference(seed, forbid_ties):
        prompt = prompt_of(model, batch, DREAM_PROMPT_LEN, seed)
        return dream_generate(dream_model_fn(model), prompt, max_new_tokens=gen, steps=steps, alg=alg,
                              mask_id=int(model.mask_id), forbid_mask_commit=True, forbid_ties=forbid_ties)

    def run_dllm(seed):
        prompt = prompt_of(model, batch, DREAM_PROMPT_LEN, seed)
        return dllm.generate(model, prompt, sampler=alg, gen_length=gen, steps=steps).sequences

    compared, tied, differ = _peaked_counts(run_reference, run_dllm)
    assert compared >= 15 and tied >= compared // 2, (compared, tied)  # the ties are real
    assert differ == 0, f"{differ} of {compared} prompts differ from Dream"


# (temperature, logit scale, shape, batch)
PEAKED_LLADA_CASES = [
    pytest.param(0.0, 10.0, "g16b8s8", 1, id="x10-g16b8s8"),
    pytest.param(0.0, 100.0, "g16b16s16", 1, id="x100-g16b16s16"),
    pytest.param(0.0, 100.0, "g16b16s5", 2, id="x100-g16b16s5-b2"),
    pytest.param(0.8, 100.0, "g12b4s6", 1, id="x100-g12b4s6-T0.8"),
]


@pytest.mark.slow  # seconds: the default run leaves it to -m slow (CI runs both)
@pytest.mark.parametrize("temperature,scale,shape,batch", PEAKED_LLADA_CASES)
def test_llada_peaked_ties_equal_reference(temperature, scale, shape, batch):
    """LLaDA's softmax runs in the logits dtype (float32 here): p(x0) saturates to 1.0 and its
    per-row ``torch.topk`` decides among equal confidences; dllm calls ``torch.topk`` the same way.
    (A stable sort matched 19 of 20 prompts at scale 10 / g16b8s8 and 0-2 of 20 at scale 100.)"""
    import dllm

    model = _peaked_model("llada", scale)
    gen, block, steps = SHAPES[shape]

    def run_reference(seed, forbid_ties):
        prompt = prompt_of(model, batch, LLADA_PROMPT_LEN, seed)
        torch.manual_seed(seed)
        return llada_generate(lambda x, am: model.raw_logits(x), prompt, steps=steps, gen_length=gen,
                              block_length=block, temperature=temperature, mask_id=int(model.mask_id),
                              forbid_mask_commit=True, forbid_ties=forbid_ties)

    def run_dllm(seed):
        prompt = prompt_of(model, batch, LLADA_PROMPT_LEN, seed)
        return dllm.generate(model, prompt, sampler="low_confidence", gen_length=gen, block_length=block,
                             steps=steps, temperature=temperature, seed=seed).sequences

    compared, tied, differ = _peaked_counts(run_reference, run_dllm)
    assert compared >= 15 and tied >= 1, (compared, tied)  # the ties are real
    assert differ == 0, f"{differ} of {compared} prompts differ from LLaDA"


def test_top_k_of_topk_is_torch_topk_per_row():
    """Rows whose count is the call's k, ties straddling every cut: each row's choice is the set of
    LLaDA's per-row ``torch.topk(score[j], k)``; a row with a smaller count takes the first entries
    of that sorted result (its n largest scores), a row with 0 nothing; ineligible entries never."""
    from dllm.samplers._ops import top_k_of_topk

    g = torch.Generator().manual_seed(0)
    score = torch.randint(0, 3, (4, 40), generator=g).float()  # many equal values
    eligible = torch.rand(4, 40, generator=g) < 0.8
    k_max = 7
    counts = torch.tensor([7, 0, 3, 7])
    commit = top_k_of_topk(score, counts, k_max, eligible)
    masked = score.masked_fill(~eligible, float("-inf"))
    for j, n in enumerate(counts.tolist()):
        expected = torch.zeros(40, dtype=torch.bool)
        expected[torch.topk(masked[j], k=k_max).indices[:n]] = True
        assert commit[j].tolist() == (expected & eligible[j]).tolist(), j
        if n:  # the n largest scores
            assert masked[j][commit[j]].min() >= masked[j][~commit[j] & eligible[j]].max(), j
    for j in (0, 3):  # a full count is LLaDA's own call
        expected = torch.zeros(40, dtype=torch.bool)
        expected[torch.topk(masked[j], k=k_max).indices] = True
        assert commit[j].tolist() == expected.tolist(), j


@pytest.mark.parametrize("name", ["low_confidence", "maskgit_plus", "topk_margin", "entropy"])
def test_ties_option_on_one_step_of_equal_confidences(name):
    """Every position certain (p = 1 in float32): ``ties="reference"`` commits what ``torch.topk``
    of the reference's confidence row picks, ``ties="first"`` the lowest indices."""
    from builders import decode_state, step_input

    from dllm.samplers import make_sampler

    width, vocab, mask = 40, 12, 11
    logits = torch.full((1, width, vocab), -1e4)
    logits[0, torch.arange(width), torch.arange(width) % 5] = 1e4  # [1, W, V]: one-hot, p == 1.0
    picks = {}
    for ties in ("reference", "first"):
        sampler = make_sampler(name, ties=ties)
        state = decode_state((1, width), mask_id=mask, block_steps=4, block_masks_at_start=torch.tensor([width]))
        sampler.begin_block(state)
        picks[ties] = sampler.step(step_input(logits, mask_id=mask, steps=4), state)
    score = picks["reference"].score[0]
    assert (score == score[0]).all()  # all tied
    k = int(picks["first"].commit.sum())
    assert k > 0 and picks["first"].commit[0].tolist() == [True] * k + [False] * (width - k)
    expected = torch.zeros(width, dtype=torch.bool)
    expected[torch.topk(score, k).indices] = True
    assert picks["reference"].commit[0].tolist() == expected.tolist()


def test_ties_option_is_validated():
    from dllm.samplers import make_sampler

    for name in ("low_confidence", "random", "origin", "entropy"):
        with pytest.raises(ValueError, match=r"ties must be one of 'reference', 'first', got 'last'"):
            make_sampler(name, ties="last")


@pytest.mark.parametrize("name, options, named", [
    ("origin", {"alg_temp": 0.5}, "alg_temp=0.5"),
    ("origin", {"ties": "first"}, "ties='first'"),
])
def test_an_option_the_sampler_cannot_read_is_refused(name, options, named):
    """``origin`` has no top-k (alg_temp and ties act on the confidence algorithms' cut only): such an
    option is refused by name, not silently ignored."""
    from dllm.samplers import make_sampler

    with pytest.raises(ValueError, match=f"sampler '{name}'.*{re.escape(named)}"):
        make_sampler(name, **options)
    make_sampler(name)  # the defaults stay valid
    make_sampler("origin", alg_temp=0.0)  # 0 (Dream's "no alg_temp") reads as None
    make_sampler("maskgit_plus", **options)  # the option acts there
