"""Prophet (``dllm.samplers.prophet``) against the transcription of the authors' loop
(``tests/reference/decoders/prophet_generate.py``: pixeli99/Prophet ``generate_earlyexit.py`` ``generate``).

The authors' settings: thresholds 7.5 / 5.0 / 2.5, ``answer_length`` 5, ``steps = gen_length`` (one token
per step), greedy; their answer position ``answer_start_pos`` is our ``span=(start, start + 5)`` in generated
coordinates (theirs never exits without one, so ``span=None`` has no counterpart). The same tokens and the
same forwards on the 20 suite prompts of APD's test on tiny-llada (the authors' code is LLaDA-only), prompts
where their loop would commit the mask id or break a ``torch.topk`` tie skipped; then the two roundings of
their gap (each gap in the logits dtype, their mean in float64) on hand-built logits at the threshold.
"""

from __future__ import annotations

import pytest
import torch

import dllm
from dllm.samplers import make_sampler
from tests.reference.decoders.llada_generate import AmbiguousTieError, MaskCommitError
from tests.reference.decoders.prophet_generate import _answer_gap, prophet_generate, should_early_exit
from tests.samplers.test_apd import prompts  # the same 20 suite prompts as APD's and Learn2PD's tests

from builders import decode_state, step_input

ANSWER_LENGTH = 5  # the authors' default
# (gen_length = steps, block_length, answer start in generated coordinates, temperature)
SETTINGS = [
    (16, 8, 0, 0.0),  # the answer of the tasks opens the generated region
    (16, 8, 8, 0.0),  # the answer span is the second block
    (16, 4, 12, 0.0),  # a span clipped at the canvas end (12..16)
    pytest.param(32, 8, 0, 0.0, marks=pytest.mark.slow),
    pytest.param(32, 32, 20, 0.0, marks=pytest.mark.slow),  # one block, the span late (the authors' 200 / 256)
    pytest.param(16, 8, 0, 1.0, marks=pytest.mark.slow),  # sampled: the same float64 uniforms
    pytest.param(16, 4, 12, 1.0, marks=pytest.mark.slow),
]


@pytest.fixture(scope="module")
def model():
    return dllm.load("tiny-llada", dtype=torch.float32)


@pytest.mark.parametrize("gen,block,start,temperature", SETTINGS)
def test_equals_the_authors_loop(model, gen, block, start, temperature):
    forward = lambda x: model.raw_logits(x)  # noqa: E731
    exits, compared = [], 0
    for i, (prompt, _) in enumerate(prompts(model)):
        try:
            ref, forwards, exit_step = prophet_generate(
                forward, torch.tensor([prompt]), steps=gen, gen_length=gen, block_length=block, mask_id=model.mask_id,
                temperature=temperature, answer_start_pos=len(prompt) + start, answer_length=ANSWER_LENGTH,
                generator=torch.Generator().manual_seed(i))
        except (MaskCommitError, AmbiguousTieError):
            continue
        out = dllm.generate(model, [prompt], sampler="prophet", gen_length=gen, block_length=block,
                            span=(start, start + ANSWER_LENGTH), temperature=temperature, seed=i)
        assert torch.equal(out.sequences, ref), (i, prompt, exit_step)
        assert out.nfe == forwards, (i, prompt, exit_step)
        exits.append(exit_step)
        compared += 1
    assert compared >= 15
    # not vacuous: some prompts exit before the last step, and not all at the same step (None: never)
    assert any(e is not None and e < gen for e in exits) and len(set(exits)) > 1, exits


# ---- the roundings of the gap, at the threshold ----------------------------------------------------------
LP, G, V, MASK = 2, 10, 16, 15  # prompt, generated positions, vocabulary, mask id of the hand-built logits


def _logits(tops: list[tuple[float, float]], dtype: torch.dtype) -> torch.Tensor:
    """[1, LP + G, V]: generated offset j has top-2 logits ``tops[j]`` (on tokens j % 8, (j + 1) % 8), the rest
    at -20; the prompt columns a large gap (never monitored here)."""
    logits = torch.full((1, LP + G, V), -20.0, dtype=torch.float64)
    for col in range(LP + G):
        l1, l2 = tops[col - LP] if col >= LP else (30.0, 0.0)
        logits[0, col, col % 8], logits[0, col, (col + 1) % 8] = l1, l2
    return logits.to(dtype)


def _both_fire(logits: torch.Tensor, span: tuple[int, int]) -> tuple[bool, bool]:
    """(ours fires, the authors' rule fires) at the first step of a fresh canvas (progress 1 / G: early)."""
    state = decode_state((1, LP + G), prompt_length=LP, mask_id=MASK)
    state.x[0, :LP] = torch.tensor([1, 2])
    active = torch.zeros(1, LP + G, dtype=torch.bool)
    active[0, LP:LP + 5] = True  # the first block of 5
    inp = step_input(logits, active, tokens=state.x.clone(), window=(LP, LP + 5), mask_id=MASK)
    make_sampler("prophet", span=span).step(inp, state)
    gap = _answer_gap(logits, LP, LP + span[0], span[1] - span[0])
    return bool(state.extras["prophet_fired"].all()), should_early_exit(1, G, gap)


def test_the_gap_is_rounded_to_bfloat16_as_the_authors_subtraction():
    """10 - 2.515625 = 7.484375 exactly, 7.5 once rounded to bfloat16 (a tie, to even): theirs fires, and so must
    ours (a float32 gap did not)."""
    tops = [(10.0, 2.515625)] * 5 + [(1.0, 0.0)] * 5
    logits = _logits(tops, torch.bfloat16)
    top2 = logits[0, LP].topk(2).values  # bfloat16
    assert (top2[0] - top2[1]).item() == 7.5 and 10.0 - 2.515625 < 7.5
    assert _both_fire(logits, (0, 5)) == (True, True)
    # one bfloat16 step below: neither fires
    assert _both_fire(_logits([(10.0, 2.53125)] * 5 + [(1.0, 0.0)] * 5, torch.bfloat16), (0, 5)) == (False, False)


def test_the_mean_gap_is_float64_as_the_authors_python_mean():
    """Float32 gaps of 7.5, 7.5, 7.5, 7.5 and 7.5 - 2**-20: the float64 mean is below 7.5 (theirs does not fire),
    a float32 sum rounds up to 37.5 (a float32 mean fired)."""
    low = 7.5 - 2 ** -20
    for j in range(5):
        tops = [(7.5, 0.0)] * 5 + [(1.0, 0.0)] * 5
        tops[j] = (low, 0.0)
        assert _both_fire(_logits(tops, torch.float32), (0, 5)) == (False, False), j
    assert _both_fire(_logits([(7.5, 0.0)] * 5 + [(1.0, 0.0)] * 5, torch.float32), (0, 5)) == (True, True)
