"""``hierarchy`` against the transcription of dInfer's code (tests/reference/decoders/hierarchy_generate.py:
inclusionAI/dInfer ``HierarchyDecoder`` in ``python/dinfer/decoding/parallel_strategy.py``, driven by
``BlockWiseDiffusionLLM`` / ``BlockDiffusionLLMAttnmask`` of ``generate_uniform.py``).

``dllm.generate(model, prompt, sampler="hierarchy", stop_at_eos=True, ...)`` equals the authors' loop
(``early_stop=True``, as every dInfer script runs it) token for token, and its forwards equal the authors'
forwards that found a mask in their block (dInfer's unrolled loop also runs some on a full block), on 16
PB-mini prompts per setting: tiny-llada without a cache, with dInfer's ``dual`` and ``prefix`` caches (block
start refresh, ``cache_update_freq=None``) and tiny-dream (dInfer's ``use_shift``), greedy and sampled;
and on 16 random prompts a random tiny LLaDA 2 on its block grid (the block-diffusion path). The settings
are dInfer's: the decoder's defaults (``low_threshold=0.4``, no ``threshold``: here ``threshold=1.0``), its
scripts' (0.3 / 0.9), its evaluation guide's (0.62 / 0.92) and ours (0.4 / 0.9). Runs where the authors'
decoder would commit the mask id, or where a decision rests on tied confidences, are skipped (the documented
differences, shown on hand-built numbers at the end): none of the PB-mini runs, 2 of the 16 LLaDA 2 runs
(the mask id)."""

from __future__ import annotations

import functools
from typing import Callable, Optional

import pytest
import torch

import dllm
from dllm import tasks as T
from dllm.samplers import make_sampler
from tests.reference.decoders.hierarchy_generate import (DInferLLaDA, HierarchyRule, hierarchy_generate,
                                                         hierarchy_generate_bd, hierarchy_transfer_index, logits_model)
from tests.reference.decoders.llada_generate import AmbiguousTieError, MaskCommitError

from builders import MASK, decode_state, log_probs, prob_row, step_input

N_PROMPTS = 16
EXTRA = 12  # generated positions past each answer: the stop after the block holding EOS decides them
SETTINGS = {  # (low_threshold, threshold): None is dInfer's "no threshold"
    "ours": (0.4, 0.9),
    "decoder": (0.4, None),  # HierarchyDecoder's own defaults
    "scripts": (0.3, 0.9),  # benchmarks/*.py, evaluations/eval_dinfer.py
    "guide": (0.62, 0.92),  # evaluations/eval_guide.md
}
SKIP = (MaskCommitError, AmbiguousTieError)
SLOW = pytest.mark.slow


@functools.lru_cache(maxsize=None)
def model(name: str):
    return dllm.load(name)


def prompts(m, n: int = N_PROMPTS) -> list[tuple[list[int], int]]:
    """(prompt ids, answer length) of ``n`` test-split instances spread over the suite."""
    out = []
    for name in T.suite_task_names():
        for ex in T.test_split(name, n=1):
            out.append((m.generation_prompt(" ".join(T.prompt_words(ex))), T.answer_length(name, ex.size)))
    return out[:: max(1, len(out) // n)][:n]


def options(setting: str) -> dict:
    low, high = SETTINGS[setting]
    return dict(low_threshold=low, threshold=1.0 if high is None else high)  # c > 1 never: no threshold


@functools.lru_cache(maxsize=None)
def reference(name: str, cache: Optional[str], setting: str, block: int,
              temperature: float = 0.0) -> tuple[tuple[int, list[int], int, Optional[tuple]], ...]:
    """Per prompt: (index, prompt, gen_length, (canvas, dInfer's forwards, forwards that found a mask) or
    None where skipped). Sampled runs draw from the global generator seeded with the prompt's index."""
    m = model(name)
    low, high = SETTINGS[setting]
    rule = HierarchyRule(temperature=temperature, threshold=high, low_threshold=low, forbid_ties=True)
    net = DInferLLaDA(m) if cache else logits_model(lambda ids: m.raw_logits(ids))
    rows = []
    for i, (prompt, answer) in enumerate(prompts(m)):
        g = answer + EXTRA
        torch.manual_seed(i)
        try:
            got = hierarchy_generate(net, torch.tensor([prompt]), gen_length=g, block_length=min(block, g),
                                     mask_id=m.mask_id, eos_id=m.eos_id, rule=rule, cache=cache,
                                     use_shift=bool(m.logit_shift), forbid_mask_commit=True)
        except SKIP:
            got = None
        rows.append((i, prompt, g, got))
    return tuple(rows)


def ours(name: str, prompt: list[int], g: int, block: int, setting: str, cache: Optional[str] = None,
         temperature: float = 0.0, seed: Optional[int] = None, **kw) -> dllm.GenerationOutput:
    return dllm.generate(model(name), [prompt], sampler="hierarchy", gen_length=g, block_length=min(block, g),
                         cache=cache or "none", temperature=temperature, seed=seed, **options(setting), **kw)


def assert_rows_match(rows, run: Callable[[int, list[int], int], dllm.GenerationOutput]) -> None:
    """Each of ``reference``'s rows (index, prompt, gen_length, (canvas, forwards, forwards that found a
    mask) or None) equals ``run(index, prompt, gen_length)`` in tokens and in the forwards that found a
    mask; at most two rows skipped (a mask-id commit or a tie the comparison cannot decide)."""
    compared = 0
    for i, prompt, g, got in rows:
        if got is None:
            continue
        ref, _, decoding = got
        out = run(i, prompt, g)
        assert out.sequences.tolist() == ref.tolist(), (i, prompt)
        assert out.nfe == decoding, (i, out.nfe, decoding)
        compared += 1
    assert compared >= len(rows) - 2


def check(name: str, cache: Optional[str], setting: str, block: int, temperature: float = 0.0) -> None:
    assert_rows_match(reference(name, cache, setting, block, temperature),
                      lambda i, prompt, g: ours(name, prompt, g, block, setting, cache, temperature, seed=i,
                                                stop_at_eos=True))


# ---- the block-wise loop (LLaDA, Dream) --------------------------------------------------------------
@pytest.mark.parametrize("name,cache,setting,block", [
    ("tiny-llada", None, "ours", 4),
    ("tiny-llada", "dual", "ours", 4),
    ("tiny-dream", None, "scripts", 8),
    pytest.param("tiny-llada", None, "decoder", 32, marks=SLOW),  # one block: up to 2 unrolled forwards
    pytest.param("tiny-llada", None, "guide", 8, marks=SLOW),
    pytest.param("tiny-llada", "dual", "scripts", 8, marks=SLOW),
    ("tiny-llada", "prefix", "ours", 4),
    pytest.param("tiny-llada", "prefix", "decoder", 8, marks=SLOW),
    pytest.param("tiny-dream", None, "decoder", 4, marks=SLOW),
    pytest.param("tiny-dream", None, "guide", 32, marks=SLOW),
])
def test_equals_dinfer(name, cache, setting, block):
    check(name, cache, setting, block)


@SLOW
@pytest.mark.parametrize("name,temperature", [("tiny-llada", 1.0), ("tiny-dream", 0.7)])
def test_sampled_equals_dinfer(name, temperature):
    """The same float64 Gumbel draws: blocks under 16 masks, where dInfer unrolls no forward past a full
    block (each forward draws over its block, so a wasted one would shift the stream)."""
    check(name, None, "ours", 8, temperature)


def test_the_comparison_is_not_vacuous():
    """On the fast case's prompts: steps commit several tokens; the ``threshold`` rule alone (no run rule)
    differs from dInfer's decoder; dInfer's stop after the block holding EOS decides later positions
    (without ``stop_at_eos`` dllm decodes them, equal up to that block's end)."""
    name, setting, block = "tiny-llada", "ours", 4
    m = model(name)
    forwards = generated = threshold_differs = stop_decides = 0
    for i, prompt, g, got in reference(name, None, setting, block):
        if got is None:
            continue
        ref, _, decoding = got
        forwards, generated = forwards + decoding, generated + g
        plain = dllm.generate(m, [prompt], sampler="threshold", gen_length=g, block_length=block, threshold=0.9,
                              stop_at_eos=True)
        threshold_differs += int(plain.sequences.tolist() != ref.tolist() or plain.nfe != decoding)
        free = ours(name, prompt, g, block, setting).sequences  # no stop_at_eos
        answer = ref[0, len(prompt):].tolist()
        stop = len(prompt) + (answer.index(m.eos_id) // block + 1) * block if m.eos_id in answer else ref.shape[1]
        assert free[:, :stop].tolist() == ref[:, :stop].tolist(), i
        stop_decides += int(free.tolist() != ref.tolist())
    assert forwards < generated and threshold_differs >= 2 and stop_decides >= 1


# ---- the block-diffusion loop (LLaDA 2 on its grid) ----------------------------------------------------
@functools.lru_cache(maxsize=None)
def llada2_pair(tmp: str):
    """The transcribed LLaDA 2 modelling (random, block 4, sharpened head) and dllm's load of its files."""
    from tests.models.families.test_llada2 import TINY
    from tests.reference.modelling.llada2_modeling import RefLLaDA2MoeModelLM

    ref = RefLLaDA2MoeModelLM.random({**TINY, "block_size": 4}, seed=11)
    with torch.no_grad():
        ref.lm_head.weight.mul_(3.0)  # confident enough that runs and thresholds decide
        ref.lm_head.weight[TINY["eos_token_id"]] *= 1.5  # some answers end before the canvas does
    ref.save_official(tmp)
    return ref, dllm.load(tmp), TINY["eos_token_id"], TINY["mask_token_id"]


@pytest.mark.parametrize("cache", [pytest.param("none", marks=SLOW), "block"])
def test_llada2_block_grid_equals_dinfer(tmp_path_factory, cache):
    ref_model, m, eos, mask = llada2_pair(str(tmp_path_factory.getbasetemp() / "hierarchy-llada2"))
    low, high = SETTINGS["ours"]
    compared = stopped = forwards = generated = 0
    for i in range(N_PROMPTS):
        g = torch.Generator().manual_seed(100 + i)
        n = int(torch.randint(3, 15, (1,), generator=g))
        prompt = torch.randint(5, 90, (1, n), generator=g)
        gen = (-(n + 12)) % 4 + 12  # the canvas ends on the grid, as dInfer rounds it
        try:
            ref, _, decoding = hierarchy_generate_bd(ref_model, prompt, gen_length=gen, block_length=4, mask_id=mask,
                                                     eos_id=eos, rule=HierarchyRule(threshold=high, low_threshold=low,
                                                                                    forbid_ties=True),
                                                     forbid_mask_commit=True)
        except SKIP:
            continue
        out = dllm.generate(m, prompt, sampler="hierarchy", gen_length=gen, cache=cache, stop_at_eos=True,
                            **options("ours"))
        assert out.sequences.tolist() == ref.tolist(), i
        assert out.nfe == decoding, (i, out.nfe, decoding)
        compared, forwards, generated = compared + 1, forwards + decoding, generated + gen
        stopped += int(bool((ref[0, n:] == eos).any()))
    assert compared >= N_PROMPTS - 4 and stopped >= 1 and forwards < generated


# ---- one step on random numbers, and the documented differences ----------------------------------------
@pytest.mark.parametrize("low,high", [*SETTINGS.values(), (0.7, 0.3)])
def test_one_step_equals_dinfer_on_random_logits(low, high):
    sampler = make_sampler("hierarchy", low_threshold=low, threshold=1.0 if high is None else high)
    g = torch.Generator().manual_seed(7)
    compared = 0
    for t in range(200):
        w = 1 + t % 12
        logits = torch.randn(1, w, 16, generator=g) * (1 + t % 4)  # [1, W, V] float32, as dInfer reads them
        logits[..., 0] = -1e4  # the mask id (0) is never anyone's arg-max
        active = torch.rand(1, w, generator=g) < 0.7  # [1, W]
        if not active.any():
            continue
        try:
            x0, transfer = hierarchy_transfer_index(logits, active, HierarchyRule(threshold=high, low_threshold=low,
                                                                                  forbid_ties=True))
        except AmbiguousTieError:
            continue
        out = sampler.step(step_input(logits, active, mask_id=0), decode_state((1, w), mask_id=0))
        assert out.commit.tolist() == (transfer & active).tolist(), t
        assert out.tokens[active].tolist() == x0[active].tolist(), t
        compared += 1
    assert compared >= 150


def test_documented_differences_ties_and_the_mask_id():
    """A run whose two positions tie at its maximum: dInfer keeps both, ``hierarchy`` its leftmost. A
    proposal equal to the mask id: dInfer commits it (the position stays masked), ``hierarchy`` proposes
    the runner-up."""
    mask = MASK
    rows = [[prob_row(0.6, 1, mask_id=mask), prob_row(0.6, 2, mask_id=mask), prob_row(0.3, 3, mask_id=mask)]]
    logits, active = log_probs(rows), torch.ones(1, 3, dtype=torch.bool)  # [1, 3, V], one run
    _, dinfer = hierarchy_transfer_index(logits, active, HierarchyRule(threshold=0.9, low_threshold=0.4))
    with pytest.raises(AmbiguousTieError):
        hierarchy_transfer_index(logits, active, HierarchyRule(threshold=0.9, low_threshold=0.4, forbid_ties=True))
    out = make_sampler("hierarchy").step(step_input(logits, active, mask_id=mask), decode_state((1, 3), mask_id=mask))
    assert dinfer.tolist() == [[True, True, False]] and out.commit.tolist() == [[True, False, False]]

    row = prob_row(0.7, mask)
    row[4] = 0.2
    logits = log_probs([[row]])  # [1, 1, V]: the arg-max is the mask id, then 4
    x0, dinfer = hierarchy_transfer_index(logits, torch.ones(1, 1, dtype=torch.bool), HierarchyRule())
    out = make_sampler("hierarchy").step(step_input(logits, mask_id=mask), decode_state((1, 1), mask_id=mask))
    assert x0.tolist() == [[mask]] and dinfer.tolist() == [[True]]
    assert out.tokens.tolist() == [[4]] and out.commit.tolist() == [[True]]
