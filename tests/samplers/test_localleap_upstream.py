"""``localleap`` against the transcription of DAWN's LocalLeap decoder (tests/reference/decoders/localleap_generate.py:
lizhuo-luo/DAWN ``llada/generate.py`` ``generate(local_leap=True)`` / ``get_transfer_index_localleap`` and
``dream/model/generation_utils.py`` ``_sample_block(alg='local_leap')``).

``dllm.generate(model, prompt, sampler="localleap", ...)`` equals DAWN's loop token for token and forward for forward on
16 suite prompts (those of APD's and Prophet's tests) per setting, greedy: tiny-llada at DAWN's LLaDA settings
(``threshold=0.9, relaxed_threshold=0.75, radius=4``: our defaults) with blocks of 8 and of 32 (DAWN's), and other
options; tiny-dream at DAWN's Dream settings (0.9 / 0.8 / 4). Sampled (T = 1) runs are equal too, seeded alike: ``dllm``
draws DAWN's Gumbel uniforms over the whole canvas (its stream, under cache none). Prompts where DAWN's loop would
commit the mask id, or where its result rests on ``topk``'s order among tied confidences, are skipped (none here); both
differences are shown on hand-built numbers at the end, next to the one-step rule on random logits.
"""

from __future__ import annotations

import functools
from typing import Optional

import pytest
import torch

import dllm
from dllm.samplers import make_sampler
from tests.reference.decoders.llada_generate import AmbiguousTieError, MaskCommitError
from tests.reference.decoders.localleap_generate import localleap_generate, localleap_transfer
from tests.samplers.test_apd import prompts  # the 20 suite prompts of APD's, Learn2PD's and Prophet's tests

from builders import log_probs, prob_row, step_input

N_PROMPTS = 16
SKIP = (MaskCommitError, AmbiguousTieError)
SLOW = pytest.mark.slow
SETTINGS = {  # (threshold, relaxed_threshold, radius)
    "llada": (0.9, 0.75, 4),  # llada/eval_*.sh; dllm's defaults
    "dream": (0.9, 0.8, 4),  # dream/eval_*.sh (conf_threshold, relaxed_threshold, radius)
    "wide": (0.8, 0.4, 2),
}


@functools.lru_cache(maxsize=None)
def model(name: str):
    return dllm.load(name)


def family(m) -> str:
    return "dream" if m.logit_shift else "llada"


def options(setting: str) -> dict:
    tau, relaxed, radius = SETTINGS[setting]
    return dict(threshold=tau, relaxed_threshold=relaxed, radius=radius)


@functools.lru_cache(maxsize=None)
def reference(name: str, gen: int, block: int, setting: str,
              temperature: float = 0.0) -> tuple[tuple[int, list[int], Optional[tuple[torch.Tensor, int]]], ...]:
    """Per prompt: (index, prompt, (DAWN's canvas, its forwards) or None where skipped). Sampled runs draw from
    a generator seeded with the prompt's index."""
    m = model(name)
    rows = []
    for i, (prompt, _) in enumerate(prompts(m, N_PROMPTS)):
        try:
            got = localleap_generate(lambda x: m.raw_logits(x), torch.tensor([prompt]), gen_length=gen,
                                     block_length=block, mask_id=m.mask_id, family=family(m), temperature=temperature,
                                     generator=torch.Generator().manual_seed(i), forbid_mask_commit=True,
                                     forbid_ties=True, **options(setting))
        except SKIP:
            got = None
        rows.append((i, prompt, got))
    return tuple(rows)


def ours(name: str, prompt: list[int], gen: int, block: int, setting: str, temperature: float = 0.0,
         seed: Optional[int] = None) -> dllm.GenerationOutput:
    return dllm.generate(model(name), [prompt], sampler="localleap", gen_length=gen, block_length=block,
                         temperature=temperature, seed=seed, **options(setting))


def check(name: str, gen: int, block: int, setting: str, temperature: float = 0.0) -> int:
    """Asserts equality on every compared prompt; returns how many were compared."""
    rows = reference(name, gen, block, setting, temperature)
    compared = 0
    for i, prompt, got in rows:
        if got is None:
            continue
        ref, forwards = got
        out = ours(name, prompt, gen, block, setting, temperature, seed=i)
        assert out.sequences.tolist() == ref.tolist(), (i, prompt)
        assert out.nfe == forwards, (i, out.nfe, forwards)
        compared += 1
    assert compared >= len(rows) - 2
    return compared


@pytest.mark.parametrize("name,gen,block,setting", [
    ("tiny-llada", 16, 8, "llada"),
    pytest.param("tiny-llada", 32, 32, "llada", marks=SLOW),  # DAWN's block of 32, one block
    pytest.param("tiny-llada", 24, 4, "wide", marks=SLOW),
    ("tiny-dream", 16, 8, "dream"),
    pytest.param("tiny-dream", 32, 32, "dream", marks=SLOW),
])
def test_equals_dawn(name, gen, block, setting):
    check(name, gen, block, setting)


@SLOW
def test_sampled_equals_dawn():
    """T = 1, seeded alike: equal to DAWN's own draw over the whole canvas. Not vacuous: the sampled answers
    are not the greedy ones on some prompts."""
    name, gen, block, setting = "tiny-llada", 16, 4, "llada"
    check(name, gen, block, setting, temperature=1.0)
    differs = sum(got is not None and greedy is not None and got[0].tolist() != greedy[0].tolist()
                  for (_, _, got), (_, _, greedy) in zip(reference(name, gen, block, setting, 1.0),
                                                         reference(name, gen, block, setting)))
    assert differs >= 1


def test_the_comparison_is_not_vacuous():
    """On the fast case's prompts: steps commit several tokens; Fast-dLLM's ``threshold`` rule at the same
    tau (no relaxation) differs from DAWN's LocalLeap on some of them."""
    name, gen, block, setting = "tiny-llada", 16, 8, "llada"
    forwards = generated = threshold_differs = 0
    for i, prompt, got in reference(name, gen, block, setting):
        if got is None:
            continue
        ref, nfe = got
        forwards, generated = forwards + nfe, generated + gen
        plain = dllm.generate(model(name), [prompt], sampler="threshold", threshold=0.9, gen_length=gen,
                              block_length=block)
        threshold_differs += int(plain.sequences.tolist() != ref.tolist() or plain.nfe != nfe)
    assert forwards < generated and threshold_differs >= 2


# ---- one step on random numbers, and the documented differences -------------------------------------------
def one_step(sampler, logits: torch.Tensor, active: torch.Tensor):
    """``sampler``'s step on logits [1, W, V] (mask id 0) at the active masks [1, W]."""
    return sampler.step(step_input(logits, active, mask_id=0), None)


def dawn_step(logits: torch.Tensor, active: torch.Tensor, tau: float, relaxed: Optional[float], radius: int,
              forbid_ties: bool = False) -> tuple[torch.Tensor, torch.Tensor]:
    """DAWN's greedy LLaDA step on logits [1, W, V]: (x0 [W], transfer [W] bool)."""
    x0 = logits[0].argmax(dim=-1)  # [W]
    p = torch.softmax(logits[0].double(), dim=-1).gather(-1, x0[:, None])[:, 0]  # [W] float64
    conf = torch.where(active[0], p, torch.tensor(float("-inf"), dtype=p.dtype))
    return x0, localleap_transfer(conf, active[0], tau, relaxed, radius, forbid_ties)


@pytest.mark.parametrize("tau,relaxed,radius", [*SETTINGS.values(), (0.9, None, 4), (0.6, 0.6, 0), (0.5, 0.2, 9)])
def test_one_step_equals_dawn_on_random_logits(tau, relaxed, radius):
    """DAWN's ``relaxed_threshold=None`` (no relaxation) is ours with ``relaxed_threshold=threshold``; where the
    relaxed bar is lower the neighbourhood decides some steps (not the threshold rule alone)."""
    sampler = make_sampler("localleap", threshold=tau, relaxed_threshold=tau if relaxed is None else relaxed,
                           radius=radius)
    plain = make_sampler("threshold", threshold=tau)
    g = torch.Generator().manual_seed(5)
    compared = relaxed_decides = 0
    for t in range(200):
        w = 1 + t % 16
        logits = torch.randn(1, w, 16, generator=g) * (1 + t % 5)  # [1, W, V] float32
        logits[..., 0] = -1e4  # the mask id (0) is never anyone's arg-max
        active = torch.rand(1, w, generator=g) < 0.7  # [1, W]
        if not active.any():
            continue
        try:
            x0, transfer = dawn_step(logits, active, tau, relaxed, radius, forbid_ties=True)
        except AmbiguousTieError:
            continue
        out = one_step(sampler, logits, active)
        assert out.commit[0].tolist() == transfer.tolist(), t
        assert out.tokens[active].tolist() == x0[active[0]].tolist(), t
        compared += 1
        relaxed_decides += int(one_step(plain, logits, active).commit[0].tolist() != transfer.tolist())
    assert compared >= 150
    assert (relaxed_decides >= 10) == (relaxed is not None and relaxed < tau and radius > 0), relaxed_decides


def test_documented_differences_ties_and_the_mask_id():
    """Two masks tied at the top below tau: DAWN commits the one ``torch.topk`` ranks first (an order
    ``forbid_ties`` reports), ``localleap`` the lower index. A proposal equal to the mask id: DAWN commits it
    (the position stays masked), ``localleap`` proposes the runner-up."""
    rows = [[prob_row(p, tok, mask_id=0, v=16) for p, tok in ((0.3, 1), (0.6, 2), (0.6, 3))]]
    logits, active = log_probs(rows), torch.ones(1, 3, dtype=torch.bool)  # [1, 3, V]
    assert int(dawn_step(logits, active, 0.9, 0.75, 4)[1].sum()) == 1  # position 1 or 2: topk's order
    with pytest.raises(AmbiguousTieError):
        dawn_step(logits, active, 0.9, 0.75, 4, forbid_ties=True)
    assert one_step(make_sampler("localleap"), logits, active).commit[0].tolist() == [False, True, False]

    row = prob_row(0.7, 0, v=16)  # the arg-max is the mask id (0), then 5
    row[5] = 0.2
    logits, active = log_probs([[row]]), torch.ones(1, 1, dtype=torch.bool)
    x0, transfer = dawn_step(logits, active, 0.9, 0.75, 4)
    assert x0.tolist() == [0] and transfer.tolist() == [True]
    out = one_step(make_sampler("localleap"), logits, active)
    assert out.tokens.tolist() == [[5]] and out.commit.tolist() == [[True]]
