"""``credit`` against the transcription of dInfer's code (tests/reference/decoders/credit_generate.py:
inclusionAI/dInfer ``CreditThresholdParallelDecoder`` in ``python/dinfer/decoding/parallel_strategy.py``,
driven by the ``BlockWiseDiffusionLLM`` / ``BlockDiffusionLLMAttnmask`` loops of ``generate_uniform.py`` as
tests/reference/decoders/hierarchy_generate.py transcribes them).

``dllm.generate(model, prompt, sampler="credit", stop_at_eos=True, ...)`` equals the authors' loop
(``early_stop=True``, as every dInfer script runs it) token for token, and its forwards equal the authors'
forwards that found a mask in their block (dInfer's unrolled loop also runs some on a full block), on 16
PB-mini prompts per setting: tiny-llada without a cache, with dInfer's ``dual`` and ``prefix`` caches (block
start refresh) and tiny-dream (dInfer's ``use_shift``), greedy and sampled; and on 16 random prompts a random
tiny LLaDA 2 on its block grid (the block-diffusion path). The settings: the decoder's credit defaults
(alpha 0.7, gamma 0.2, beta 0.8) with its scripts' threshold (0.9) and its evaluation guide's (0.8), and
other credit options (alpha 1.5, gamma 0.5, beta 0.5, threshold 0.7). Runs where the mask id or a tie of the
1e-5 band would decide are skipped (the documented differences, shown on hand-built numbers at the end):
none of the PB-mini runs, 5 of the 16 LLaDA 2 runs (the random model's mask id is a top-1 at a mask: in 3 of
them dInfer's loop would never end, in 2 the answers still agree).
"""

from __future__ import annotations

import functools
from typing import Optional

import pytest
import torch

import dllm
from dllm.samplers import make_sampler
from tests.reference.decoders.credit_generate import CreditDecoder, StalledError, credit_generate, credit_generate_bd
from tests.reference.decoders.hierarchy_generate import DInferLLaDA, logits_model
from tests.reference.decoders.llada_generate import AmbiguousTieError, MaskCommitError
from tests.samplers.test_hierarchy_upstream import (EXTRA, N_PROMPTS, assert_rows_match, llada2_pair, model,
                                                    prompts)

from builders import MASK, V, decode_state, log_probs, prob_row, step_input

SETTINGS = {  # ours -> dInfer's CreditThresholdParallelDecoder(credit_alpha, boost_gamma, decay_beta, threshold)
    "scripts": dict(alpha=0.7, gamma=0.2, beta=0.8, threshold=0.9),  # benchmarks/*.py, eval_dinfer.py
    "guide": dict(alpha=0.7, gamma=0.2, beta=0.8, threshold=0.8),  # evaluations/eval_guide.md
    "options": dict(alpha=1.5, gamma=0.5, beta=0.5, threshold=0.7),
}
SKIP = (MaskCommitError, AmbiguousTieError)
SLOW = pytest.mark.slow


def decoder(setting: str, temperature: float = 0.0, **kw) -> CreditDecoder:
    o = {**SETTINGS[setting], **kw}
    return CreditDecoder(temperature=temperature, threshold=o["threshold"], credit_alpha=o["alpha"],
                         boost_gamma=o["gamma"], decay_beta=o["beta"], forbid_ties=True)


@functools.lru_cache(maxsize=None)
def reference(name: str, cache: Optional[str], setting: str, block: int, temperature: float = 0.0,
              alpha: Optional[float] = None) -> tuple[tuple[int, list[int], int, Optional[tuple]], ...]:
    """Per prompt: (index, prompt, gen_length, (canvas, dInfer's forwards, forwards that found a mask) or
    None where skipped), one fresh decoder per prompt. Sampled runs draw from the global generator seeded
    with the prompt's index. ``alpha`` overrides the setting's."""
    m = model(name)
    net = DInferLLaDA(m) if cache else logits_model(lambda ids: m.raw_logits(ids))
    extra = {} if alpha is None else dict(alpha=alpha)
    rows = []
    for i, (prompt, answer) in enumerate(prompts(m)):
        g = answer + EXTRA
        torch.manual_seed(i)
        try:
            got = credit_generate(net, torch.tensor([prompt]), gen_length=g, block_length=min(block, g),
                                  mask_id=m.mask_id, eos_id=m.eos_id, decoder=decoder(setting, temperature, **extra),
                                  cache=cache, use_shift=bool(m.logit_shift), forbid_mask_commit=True)
        except SKIP:
            got = None
        rows.append((i, prompt, g, got))
    return tuple(rows)


def ours(name: str, prompt: list[int], g: int, block: int, setting: str, cache: Optional[str] = None,
         temperature: float = 0.0, seed: Optional[int] = None, **kw) -> dllm.GenerationOutput:
    return dllm.generate(model(name), [prompt], sampler="credit", gen_length=g, block_length=min(block, g),
                         cache=cache or "none", temperature=temperature, seed=seed, **SETTINGS[setting], **kw)


def check(name: str, cache: Optional[str], setting: str, block: int, temperature: float = 0.0) -> None:
    assert_rows_match(reference(name, cache, setting, block, temperature),
                      lambda i, prompt, g: ours(name, prompt, g, block, setting, cache, temperature, seed=i,
                                                stop_at_eos=True))


# ---- the block-wise loop (LLaDA, Dream) --------------------------------------------------------------
@pytest.mark.parametrize("name,cache,setting,block", [
    ("tiny-llada", None, "scripts", 4),
    ("tiny-llada", "dual", "scripts", 4),
    ("tiny-llada", "prefix", "guide", 8),
    ("tiny-dream", None, "scripts", 8),
    pytest.param("tiny-llada", None, "guide", 32, marks=SLOW),  # one block: up to 4 unrolled forwards
    pytest.param("tiny-llada", None, "options", 8, marks=SLOW),
    pytest.param("tiny-llada", "dual", "options", 8, marks=SLOW),
    pytest.param("tiny-llada", "prefix", "scripts", 4, marks=SLOW),
    pytest.param("tiny-dream", None, "guide", 4, marks=SLOW),
    pytest.param("tiny-dream", None, "options", 32, marks=SLOW),
])
def test_equals_dinfer(name, cache, setting, block):
    check(name, cache, setting, block)


@SLOW
@pytest.mark.parametrize("name,temperature", [("tiny-llada", 1.0), ("tiny-dream", 0.7)])
def test_sampled_equals_dinfer(name, temperature):
    """The same float64 Gumbel draws (over the fused logits): blocks under 16 masks, where dInfer unrolls no
    forward past a full block (each forward draws over its block, so a wasted one would shift the stream)."""
    check(name, None, "scripts", 8, temperature)


def test_the_comparison_is_not_vacuous():
    """On the fast case's prompts: steps commit several tokens; the credit changes dInfer's answers (the
    same decoder with alpha 0, the plain threshold rule, differs), and so plain ``threshold`` differs from
    the transcription where ``credit`` equals it."""
    name, setting, block = "tiny-llada", "scripts", 4
    m = model(name)
    forwards = generated = credit_decides = threshold_differs = 0
    plain_rows = reference(name, None, setting, block, alpha=0.0)
    for (i, prompt, g, got), (_, _, _, plain_ref) in zip(reference(name, None, setting, block), plain_rows):
        if got is None or plain_ref is None:
            continue
        ref, _, decoding = got
        forwards, generated = forwards + decoding, generated + g
        credit_decides += int(plain_ref[0].tolist() != ref.tolist() or plain_ref[2] != decoding)
        plain = dllm.generate(m, [prompt], sampler="threshold", gen_length=g, block_length=block,
                              threshold=SETTINGS[setting]["threshold"], stop_at_eos=True)
        threshold_differs += int(plain.sequences.tolist() != ref.tolist() or plain.nfe != decoding)
    assert forwards < generated and credit_decides >= 2 and threshold_differs >= 2


# ---- the block-diffusion loop (LLaDA 2 on its grid) ----------------------------------------------------
@pytest.mark.parametrize("cache", [pytest.param("none", marks=SLOW), "block"])
def test_llada2_block_grid_equals_dinfer(tmp_path_factory, cache):
    ref_model, m, eos, mask = llada2_pair(str(tmp_path_factory.getbasetemp() / "credit-llada2"))
    compared = stopped = forwards = generated = 0
    for i in range(N_PROMPTS):
        g = torch.Generator().manual_seed(100 + i)
        n = int(torch.randint(3, 15, (1,), generator=g))
        prompt = torch.randint(5, 90, (1, n), generator=g)
        gen = (-(n + 12)) % 4 + 12  # the canvas ends on the grid, as dInfer rounds it
        try:
            ref, _, decoding = credit_generate_bd(ref_model, prompt, gen_length=gen, block_length=4, mask_id=mask,
                                                  eos_id=eos, decoder=decoder("scripts"), forbid_mask_commit=True)
        except SKIP:
            continue
        out = dllm.generate(m, prompt, sampler="credit", gen_length=gen, cache=cache, stop_at_eos=True,
                            **SETTINGS["scripts"])
        assert out.sequences.tolist() == ref.tolist(), i
        assert out.nfe == decoding, (i, out.nfe, decoding)
        compared, forwards, generated = compared + 1, forwards + decoding, generated + gen
        stopped += int(bool((ref[0, n:] == eos).any()))
    assert compared >= N_PROMPTS - 6 and stopped >= 1 and forwards < generated


# ---- one block on random numbers, and the documented differences --------------------------------------
@pytest.mark.parametrize("setting", list(SETTINGS))
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_block_equals_dinfer_on_random_logits(setting, dtype):
    """Whole blocks (the credit carried from step to step) on fresh random logits each step, in float32
    and in bfloat16 (dInfer's model dtype: its fusion promotes to float32): the same canvas after every
    step, and the same fused confidences (dInfer's float32, ours float64)."""
    g = torch.Generator().manual_seed(7)
    compared = 0
    for t in range(60):
        w = 1 + t % 12
        sampler, ref = make_sampler("credit", **SETTINGS[setting]), decoder(setting)
        x = torch.full((1, w), MASK)  # [1, W] dInfer's canvas
        state = decode_state((1, w))
        sampler.begin_block(state)
        try:
            while bool((x == MASK).any()):
                logits = (torch.randn(1, w, V, generator=g) * (1 + t % 4)).to(dtype)  # [1, W, V]
                logits[..., MASK] = -1e4  # the mask id is never anyone's top-1
                mine = state.x.clone()
                out = sampler.step(step_input(logits, tokens=mine), state)
                state.x = torch.where(out.commit, out.tokens, mine)
                ref.decode(logits, x, 0, w, MASK, forbid_mask_commit=True)
                assert state.x.tolist() == x.tolist(), t
                active = mine == MASK  # [1, W]
                assert torch.allclose(out.score[active], ref.confidence[active].double(), atol=1e-6), t
        except SKIP:
            continue
        compared += 1
    assert compared >= 50


def test_documented_differences_band_and_the_mask_id():
    """Two positions tied at the block's top confidence, under the threshold: dInfer's 1e-5 band commits
    both, ``credit`` the first. A raw top-1 equal to the mask id: dInfer credits it and, the fused arg-max
    being the mask id, leaves the position masked, step after step (its loop never ends: the transcription
    stops it); ``credit`` credits and proposes the runner-up, committed at the next step."""
    rows = [[prob_row(0.6, 1, mask_id=MASK), prob_row(0.6, 2, mask_id=MASK), prob_row(0.3, 3, mask_id=MASK)]]
    logits = log_probs(rows)  # [1, 3, V]
    x = torch.full((1, 3), MASK)
    CreditDecoder().decode(logits, x, 0, 3, MASK)
    with pytest.raises(AmbiguousTieError):
        CreditDecoder(forbid_ties=True).decode(logits, torch.full((1, 3), MASK), 0, 3, MASK)
    sampler = make_sampler("credit")
    state = decode_state((1, 3))
    sampler.begin_block(state)
    out = sampler.step(step_input(logits), state)
    assert (x != MASK).tolist() == [[True, True, False]] and out.commit.tolist() == [[True, False, False]]

    row = prob_row(0.7, MASK)
    row[4] = 0.2
    logits = log_probs([[row, prob_row(0.95, 5)]])  # [1, 2, V]: position 0's arg-max is the mask id, then 4
    dinfer = CreditDecoder()
    x = torch.full((1, 2), MASK)
    dinfer.decode(logits, x, 0, 2, MASK)
    assert x.tolist() == [[MASK, 5]] and dinfer.mats[(0, 2)][0, 0, MASK] > 0
    for _ in range(3):
        assert dinfer.decode(logits, x, 0, 2, MASK) and x.tolist() == [[MASK, 5]]
    with pytest.raises(StalledError):
        credit_generate(logits_model(lambda ids: logits[:, [1, 0]]), torch.tensor([[5]]), gen_length=1, block_length=1,
                        mask_id=MASK, eos_id=3, decoder=CreditDecoder(max_decodes=50))
    with pytest.raises(MaskCommitError):
        CreditDecoder().decode(logits, torch.full((1, 2), MASK), 0, 2, MASK, forbid_mask_commit=True)
    state = decode_state((1, 2))
    sampler.begin_block(state)
    out = sampler.step(step_input(logits), state)
    assert out.tokens.tolist() == [[4, 5]] and out.commit.tolist() == [[False, True]]
    assert state.extras["credit"][0, 0, 4] > 0 and state.extras["credit"][0, 0, MASK] == 0
    out = sampler.step(step_input(logits, tokens=[[MASK, 5]]), state)
    assert out.tokens[0, 0] == 4 and out.commit.tolist() == [[True, False]]


def test_documented_difference_dinfer_keeps_credit_between_calls():
    """dInfer drops its credit only when a decode leaves no mask in the canvas: after a call that stopped on
    EOS before its last block, the credit of its blocks stays in the decoder, and its scripts' next prompt of
    the same length starts those blocks with it (``credit`` starts every block from zero: test_credit.py)."""
    eos, lp, g = 3, 2, 8

    def net(eos_at: int):
        def fn(ids: torch.Tensor) -> torch.Tensor:  # [1, L] -> [1, L, V]: token 1 at p 0.82 - 0.002 i, EOS at eos_at
            return log_probs([[prob_row(0.99, eos, mask_id=MASK) if i == eos_at else
                               prob_row(0.82 - 0.002 * i, 1, mask_id=MASK) for i in range(ids.shape[1])]])
        return logits_model(fn)

    run = functools.partial(credit_generate, prompt=torch.tensor([[5, 6]]), gen_length=g, block_length=4,
                            mask_id=MASK, eos_id=eos)
    kept = CreditDecoder()
    first, _, _ = run(net(lp), decoder=kept)
    assert first[0, lp:].tolist() == [eos, 1, 1, 1] + [eos] * 4 and list(kept.mats) == [(lp, lp + 4)]
    fresh, _, fresh_steps = run(net(-1))
    again, _, again_steps = run(net(-1), decoder=kept)
    assert fresh[0, lp:].tolist() == again[0, lp:].tolist() == [1] * g and kept.mats == {}
    assert again_steps < fresh_steps  # the first block started with the earlier prompt's credit on token 1
