"""``dus`` against the transcription of the DUS authors' scheduler (tests/reference/decoders/dus_generate.py:
omerlux/DUS ``generate.py`` ``generate_scheduled(scheduler='dilated')``, ``dilated_unmask_levels``,
``merge_last_level``).

Where the schedules must agree -- blocks of a power of the base (the README's ``base=2, base_skip=1``) and the authors'
remasking off (``remasking='none'``; ``dus`` has none) -- ``dllm.generate(model, prompt, sampler="dus", ...)`` equals
the authors' loop token for token and forward for forward on 16 suite prompts (those of APD's and Prophet's tests) per
setting, greedy: tiny-llada with blocks of 8, 16 and 32 (the README's), tiny-dream with the harness's logit shift
(``eval_mdlm.py`` ``logits_shift_fix``). Sampled (T = 1) runs are equal too, seeded alike: ``dllm`` draws the authors'
Gumbel uniforms over the whole canvas (their stream). The documented differences are checked too: the authors' default
remasking (``< 0.3``, README) changes some answers and leaves masks in them, the harness's default
``confidence_threshold=0.0`` never remasks; other blocks get other schedules (``floor(log2 B)`` or fewer authors' rounds
against our ``ceil(log2 B)``).
"""

from __future__ import annotations

import functools
import math
from typing import Callable, Optional

import pytest
import torch

import dllm
from dllm.samplers.dus import dilated_rounds, num_rounds
from tests.reference.decoders.dus_generate import dilated_levels, dus_generate, merge_last_level
from tests.reference.decoders.llada_generate import MaskCommitError
from tests.samplers.test_apd import prompts  # the 20 suite prompts of APD's, Learn2PD's and Prophet's tests

N_PROMPTS = 16
SLOW = pytest.mark.slow


@functools.lru_cache(maxsize=None)
def model(name: str):
    return dllm.load(name)


def forward(m) -> Callable[[torch.Tensor], torch.Tensor]:
    """The authors' ``model(x).logits`` [1, L, V]: shifted by one for Dream, as their harness wraps it."""
    if not m.logit_shift:
        return lambda x: m.raw_logits(x)
    return lambda x: (lambda logits: torch.cat([logits[:, :1], logits[:, :-1]], dim=1))(m.raw_logits(x))


@functools.lru_cache(maxsize=None)
def reference(name: str, gen: int, block: int, remasking: str = "none", threshold: float = 0.3,
              temperature: float = 0.0) -> tuple[tuple[int, list[int], Optional[tuple]], ...]:
    """Per prompt: (index, prompt, (the authors' canvas, forwards) or None where they would commit the mask id).
    Sampled runs draw from a generator seeded with the prompt's index."""
    m = model(name)
    rows = []
    for i, (prompt, _) in enumerate(prompts(m, N_PROMPTS)):
        try:
            got = dus_generate(forward(m), torch.tensor([prompt]), gen_length=gen, block_length=block,
                               mask_id=m.mask_id, remasking=remasking, confidence_threshold=threshold,
                               temperature=temperature, generator=torch.Generator().manual_seed(i),
                               forbid_mask_commit=True)
        except MaskCommitError:
            got = None
        rows.append((i, prompt, got))
    return tuple(rows)


def ours(name: str, prompt: list[int], gen: int, block: int, temperature: float = 0.0,
         seed: Optional[int] = None) -> dllm.GenerationOutput:
    return dllm.generate(model(name), [prompt], sampler="dus", gen_length=gen, block_length=block,
                         temperature=temperature, seed=seed)


def check(name: str, gen: int, block: int, temperature: float = 0.0) -> None:
    rows = reference(name, gen, block, temperature=temperature)
    compared = 0
    for i, prompt, got in rows:
        if got is None:
            continue
        ref, forwards = got
        out = ours(name, prompt, gen, block, temperature, seed=i)
        assert out.sequences.tolist() == ref.tolist(), (i, prompt)
        assert out.nfe == forwards == gen // block * num_rounds(block), (i, out.nfe, forwards)
        compared += 1
    assert compared >= len(rows) - 2


@pytest.mark.parametrize("name,gen,block", [
    ("tiny-llada", 16, 8),
    ("tiny-llada", 32, 16),
    ("tiny-dream", 16, 8),
    pytest.param("tiny-llada", 64, 32, marks=SLOW),  # the README's block of 32
    pytest.param("tiny-llada", 16, 2, marks=SLOW),  # one round a block
    pytest.param("tiny-dream", 32, 32, marks=SLOW),
])
def test_equals_the_authors_schedule(name, gen, block):
    check(name, gen, block)


@SLOW
def test_sampled_equals_the_authors():
    """T = 1, seeded alike: equal to the authors' own draw over the whole canvas. Not vacuous: the sampled
    answers are not the greedy ones on some prompts."""
    name, gen, block = "tiny-llada", 16, 4
    check(name, gen, block, temperature=1.0)
    differs = sum(got is not None and greedy is not None and got[0].tolist() != greedy[0].tolist()
                  for (_, _, got), (_, _, greedy) in zip(reference(name, gen, block, temperature=1.0),
                                                         reference(name, gen, block)))
    assert differs >= 1


def test_the_comparison_is_not_vacuous():
    """On the fast case's prompts: LLaDA's ``low_confidence`` with as many steps (the same forwards, another
    order) differs from the authors' schedule on most prompts."""
    name, gen, block = "tiny-llada", 16, 8
    differs = 0
    for i, prompt, got in reference(name, gen, block):
        out = dllm.generate(model(name), [prompt], sampler="low_confidence", gen_length=gen, block_length=block,
                            steps=gen // block * num_rounds(block))
        differs += int(out.sequences.tolist() != got[0].tolist())
    assert differs >= N_PROMPTS // 2


def test_the_authors_default_remasking_is_the_documented_difference():
    """``remasking='low_confidence'`` below 0.3 (the function's default, the README's setting) changes some
    answers and leaves their remasked positions masked; below 0.0 (the harness's default threshold) it never
    fires: the answers are ours."""
    name, gen, block = "tiny-llada", 16, 8
    m = model(name)
    changed = 0
    for (i, prompt, got), (_, _, remasked), (_, _, never) in zip(
            reference(name, gen, block), reference(name, gen, block, "low_confidence", 0.3),
            reference(name, gen, block, "low_confidence", 0.0)):
        assert never[0].tolist() == got[0].tolist(), i
        if remasked[0].tolist() != got[0].tolist():
            changed += 1
            assert bool((remasked[0][0, len(prompt):] == m.mask_id).any()), i
    assert changed >= 2


# ---- the schedules -----------------------------------------------------------------------------------------
def authors_rounds(block: int, base: int) -> list[int]:
    """The authors' round (1-based) of each position of a block of ``block`` at 0."""
    out = [0] * block
    for t, level in enumerate(merge_last_level(dilated_levels(0, block - 1, base)), start=1):
        for pos in level:
            out[pos] = t
    return out


@pytest.mark.parametrize("base,powers", [(2, range(0, 8)), (3, range(0, 5)), (4, range(0, 4))])
def test_blocks_of_a_power_of_the_base_get_the_authors_schedule(base, powers):
    for j in powers:
        assert dilated_rounds(base**j, base).tolist() == authors_rounds(base**j, base), base**j


@pytest.mark.parametrize("block,theirs", [(5, [1, 1, 1, 1, 1]), (6, [1, 2, 2, 1, 2, 2])])
def test_other_blocks_get_another_schedule_as_documented(block, theirs):
    """B = 5: the authors' one round of all five; B = 6: {1, 4}, {2, 3, 5, 6} (1-indexed), ours {1, 5}, {3},
    {2, 4, 6}. Every block that is not a power of two: ``ceil(log2 B)`` rounds of ours, at most
    ``floor(log2 B)`` of theirs."""
    assert authors_rounds(block, 2) == theirs and dilated_rounds(block).tolist() != theirs
    for b in range(3, 130):
        if b & (b - 1):
            assert max(authors_rounds(b, 2)) <= math.floor(math.log2(b)) < num_rounds(b), b
