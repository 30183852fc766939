"""``dawn`` against the transcription of DAWN's decoder (tests/reference/decoders/dawn_generate.py: lizhuo-luo/DAWN
``llada/generate.py`` ``generate(dawn=True)`` / ``get_transfer_index_dawn``, ``llada/gdllm_utils.py``, and
``dream/model/generation_utils.py`` ``_sample_block(alg='dawn')``; the maps of ``attn_avg`` over the last 4 layers).

``dllm.generate(model, prompt, sampler="dawn", ...)`` equals DAWN's loop token for token and forward for forward on 16
suite prompts (those of APD's and Prophet's tests) per setting, greedy: tiny-llada at ``generate()``'s defaults (ours)
and at the LLaDA script's ``tau_low=0.75``, blocks of 8 and of 32 (DAWN's); tiny-dream at the Dream script's
settings. The tiny models attend almost evenly (column means about 0.025 to 0.07, above tau_sink 0.01: every column is a
sink), so at those settings the graph is empty; the ``graph`` setting (tau_sink 0.045, tau_edge 0.06) keeps most
columns, and there induction, blocking and conflicts decide steps. There DAWN's greedy loop overflows: it makes as
many picks as it had candidates, the extra ones at position 0, which it overwrites with the proposal there (the
prompt's first token changes); ``dawn`` does not. Prompts where that changes position 0 differ (shown), the others are
equal, and all are equal to the transcription without the overflow. Sampled (T = 1, LLaDA) runs are equal too,
seeded alike: ``dllm`` draws DAWN's Gumbel uniforms over the whole canvas (its stream, under cache none).
"""

from __future__ import annotations

import functools
from typing import Optional

import pytest
import torch

import dllm
from dllm.engine.progress import guarantee_progress
from dllm.samplers import make_sampler
from dllm.schedule import LOGIT_SHIFT_KEY
from tests.reference.decoders.dawn_generate import (PromptWriteError, attention_model_fn, conflict_mis, dawn_generate,
                                                    dawn_transfer)
from tests.reference.decoders.llada_generate import MaskCommitError
from tests.samplers.test_apd import prompts  # the 20 suite prompts of APD's, Learn2PD's and Prophet's tests

from builders import MASK, decode_state, log_probs, prob_row, step_input

N_PROMPTS = 16
SLOW = pytest.mark.slow
SETTINGS = {  # (tau_sink, tau_edge, tau_induce, tau_low)
    "generate": (0.01, 0.07, 0.7, 0.7),  # llada/generate.py generate()'s defaults; dllm's defaults
    "llada": (0.01, 0.07, 0.7, 0.75),  # llada/eval_instruct.sh (GSM8K, MATH)
    "dream": (0.03, 0.10, 0.75, 0.8),  # dream/eval_instruct.sh (conf_threshold is tau_low)
    "graph": (0.045, 0.06, 0.5, 0.5),  # keeps most columns of the tiny models: a graph that decides
}


@functools.lru_cache(maxsize=None)
def model(name: str):
    return dllm.load(name)


def options(setting: str) -> dict:
    return dict(zip(("tau_sink", "tau_edge", "tau_induce", "tau_low"), SETTINGS[setting]))


@functools.lru_cache(maxsize=None)
def reference(name: str, gen: int, block: int, setting: str, overflow: bool = True,
              temperature: float = 0.0) -> tuple[tuple[int, list[int], Optional[tuple[torch.Tensor, int]]], ...]:
    """Per prompt: (index, prompt, (DAWN's canvas, its forwards) or None where it rewrites position 0). Sampled runs
    draw from a generator seeded with the prompt's index."""
    m = model(name)
    fn = attention_model_fn(m)
    rows = []
    for i, (prompt, _) in enumerate(prompts(m, N_PROMPTS)):
        try:
            got = dawn_generate(fn, torch.tensor([prompt]), gen_length=gen, block_length=block, mask_id=m.mask_id,
                                family="dream" if m.logit_shift else "llada", temperature=temperature,
                                generator=torch.Generator().manual_seed(i), forbid_mask_commit=True,
                                forbid_prompt_write=True, overflow=overflow, **options(setting))
        except PromptWriteError:
            got = None
        rows.append((i, prompt, got))
    return tuple(rows)


def ours(name: str, prompt: list[int], gen: int, block: int, setting: str, temperature: float = 0.0,
         seed: Optional[int] = None, **extra) -> dllm.GenerationOutput:
    opts = {} if setting == "generate" else options(setting)  # the defaults themselves
    return dllm.generate(model(name), [prompt], sampler="dawn", gen_length=gen, block_length=block,
                         temperature=temperature, seed=seed, **{**opts, **extra})


def check(name: str, gen: int, block: int, setting: str, overflow: bool = True, temperature: float = 0.0) -> int:
    """Asserts equality on every compared prompt; returns how many were compared."""
    compared = 0
    for i, prompt, got in reference(name, gen, block, setting, overflow, temperature):
        if got is None:
            continue
        ref, forwards = got
        out = ours(name, prompt, gen, block, setting, temperature, seed=i)
        assert out.sequences.tolist() == ref.tolist(), (i, prompt)
        assert out.nfe == forwards, (i, out.nfe, forwards)
        compared += 1
    return compared


@pytest.mark.parametrize("name,gen,block,setting", [
    ("tiny-llada", 16, 8, "generate"),
    pytest.param("tiny-llada", 16, 8, "llada", marks=SLOW),
    pytest.param("tiny-llada", 32, 32, "generate", marks=SLOW),  # DAWN's block of 32, one block
    ("tiny-dream", 16, 8, "dream"),
    pytest.param("tiny-dream", 32, 32, "dream", marks=SLOW),
])
def test_equals_dawn(name, gen, block, setting):
    assert check(name, gen, block, setting) == N_PROMPTS  # the overflow never rewrites position 0 here


@pytest.mark.parametrize("name", ["tiny-llada", pytest.param("tiny-dream", marks=SLOW)])
def test_equals_dawn_where_a_graph_decides_but_for_its_overflow(name):
    """With a graph, equal wherever DAWN's overflow leaves position 0 as it was, and on every prompt without the
    overflow; where it rewrites position 0 the canvases differ (the documented difference)."""
    gen, block = 16, 8
    kept = check(name, gen, block, "graph")
    assert 4 <= kept < N_PROMPTS
    assert check(name, gen, block, "graph", overflow=False) == N_PROMPTS
    rewritten = [(i, p) for (i, p, got) in reference(name, gen, block, "graph") if got is None]
    fn, m = attention_model_fn(model(name)), model(name)
    for i, prompt in rewritten[:2]:
        canvas, _ = dawn_generate(fn, torch.tensor([prompt]), gen_length=gen, block_length=block, mask_id=m.mask_id,
                                  family="dream" if m.logit_shift else "llada", **options("graph"))
        assert canvas[0, 0] != prompt[0] and ours(name, prompt, gen, block, "graph").sequences[0, 0] == prompt[0]


@SLOW
def test_sampled_equals_dawn():
    """T = 1, seeded alike: equal to DAWN's own draw over the whole canvas. Not vacuous: the sampled answers are
    not the greedy ones on some prompts."""
    name, gen, block = "tiny-llada", 16, 4
    assert check(name, gen, block, "generate", temperature=1.0) == N_PROMPTS
    assert check(name, gen, block, "graph", overflow=False, temperature=1.0) == N_PROMPTS
    differs = sum(got[0].tolist() != greedy[0].tolist()
                  for (_, _, got), (_, _, greedy) in zip(reference(name, gen, block, "generate", True, 1.0),
                                                         reference(name, gen, block, "generate")))
    assert differs >= 1


def test_the_comparison_is_not_vacuous():
    """Steps commit several tokens; Fast-dLLM's ``threshold`` at tau_high and ``localleap`` differ from DAWN on some
    prompts; in the graph setting ``dawn`` without edges (tau_edge 1) differs from DAWN too."""
    name, gen, block = "tiny-llada", 16, 8
    forwards = generated = threshold_differs = localleap_differs = 0
    for i, prompt, (ref, nfe) in reference(name, gen, block, "generate"):
        forwards, generated = forwards + nfe, generated + gen
        for sampler, extra in (("threshold", dict(threshold=0.9)), ("localleap", {})):
            other = dllm.generate(model(name), [prompt], sampler=sampler, gen_length=gen, block_length=block, **extra)
            differs = int(other.sequences.tolist() != ref.tolist() or other.nfe != nfe)
            threshold_differs += differs * (sampler == "threshold")
            localleap_differs += differs * (sampler == "localleap")
    assert forwards < generated and threshold_differs >= 2 and localleap_differs >= 2
    no_edges = sum(ours(name, prompt, gen, block, "graph", tau_edge=1.0).sequences.tolist() != got[0].tolist()
                   for _, prompt, got in reference(name, gen, block, "graph", False))
    assert no_edges >= 2


# ---- one step on random and on hand-built numbers ----------------------------------------------------------
def dawn_step(logits: torch.Tensor, tokens: torch.Tensor, attn: torch.Tensor, end: int, taus: dict,
              overflow: bool = False) -> tuple[torch.Tensor, torch.Tensor]:
    """DAWN's greedy LLaDA step on logits [1, L, V], canvas tokens [1, L] and attention [1, L, L] (block ending at
    ``end``): (x0 [1, L], transfer [1, L] bool)."""
    x0 = logits.argmax(dim=-1)  # [1, L]
    x0_p = torch.softmax(logits.double(), dim=-1).gather(-1, x0[..., None])[..., 0]  # [1, L] float64
    mask_index = tokens == MASK
    mask_index[:, end:] = False
    return x0, dawn_transfer(x0_p, mask_index, attn, end, overflow=overflow, **taus)


def our_step(logits: torch.Tensor, tokens: torch.Tensor, attn: torch.Tensor, window: tuple[int, int], shift: int = 0,
             **taus):
    """``dawn``'s step (one layer, one head) and the engine's progress rule: (StepOutput, commit [1, L])."""
    inp = step_input(logits, tokens=tokens, active=(tokens == MASK) & (torch.arange(tokens.shape[1]) < window[1]),
                     window=window, attn={0: attn[:, None]})
    state = decode_state(tokens.clone(), prompt_length=window[0], extras={LOGIT_SHIFT_KEY: shift})
    out = make_sampler("dawn", **taus).step(inp, state)
    return out, guarantee_progress(out, inp.active, last=False, adaptive=True)


def random_case(g: torch.Generator, t: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, tuple[int, int]]:
    """(logits [1, L, V], tokens [1, L], attention [1, L, L], block window): a prompt, a block partly decoded, masks
    after it; confidences spread over [0, 1]; attention rows peaked on a few keys."""
    n, lp = 8 + t % 12, 1 + t % 4
    ws, we = lp, min(n, lp + 4 + t % 6)
    logits = torch.randn(1, n, 10, generator=g) * (1 + t % 4)  # [1, L, V]
    logits[..., MASK] = -1e4  # the mask id is never anyone's arg-max
    tokens = torch.full((1, n), MASK)
    decoded = torch.rand(n, generator=g) < 0.3
    decoded[:lp] = True
    decoded[we - 1:] = False  # the block keeps a mask (DAWN never steps a full block)
    tokens[0, decoded] = logits[0, decoded].argmax(dim=-1)
    attn = torch.softmax(torch.randn(1, n, n, generator=g) * 2.5, dim=-1)  # [1, L, L] rows sum to 1
    return logits, tokens, attn, (ws, we)


@pytest.mark.parametrize("setting", ["graph", "random"])
def test_one_step_equals_dawn_on_random_numbers(setting):
    """The commit (with the progress rule's top-1) and the proposals equal DAWN's step without its overflow; the
    graph decides some steps (not the confidences alone)."""
    taus = options(setting) if setting != "random" else dict(tau_sink=0.1, tau_edge=0.12, tau_induce=0.6, tau_low=0.4)
    g = torch.Generator().manual_seed(3)
    decided = 0
    for t in range(150):
        logits, tokens, attn, window = random_case(g, t)
        x0, transfer = dawn_step(logits, tokens, attn, window[1], taus)
        out, commit = our_step(logits, tokens, attn, window, **taus)
        assert commit[0].tolist() == transfer[0].tolist(), t
        assert out.tokens[commit].tolist() == x0[commit].tolist(), t
        _, plain = our_step(logits, tokens, attn, window, **{**taus, "tau_edge": 1.0})
        decided += int(plain.tolist() != commit.tolist())
    assert decided >= 10


def hand_built(confs: list[float], decoded: int, links: dict[tuple[int, int], float]):
    """A canvas of len(confs) columns: tokens 1, 2, ... with those confidences; columns < ``decoded`` hold their
    token, the rest are masks (the block: columns 2 ..). Attention: ``links`` (i, j): i attends to j, 0.03 (below
    tau_edge) on the other keys, the rest of the row on the diagonal."""
    n = len(confs)
    logits = log_probs([[prob_row(c, 1 + i % 8, mask_id=MASK) for i, c in enumerate(confs)]])  # [1, L, V]
    tokens = torch.tensor([[1 + i % 8 if i < decoded else MASK for i in range(n)]])
    attn = torch.full((1, n, n), 0.03)
    for (i, j), w in links.items():
        attn[0, i, j] = w
    eye = torch.eye(n, dtype=torch.bool)[None]
    attn = attn.masked_fill(eye, 0.0)
    return logits, tokens, attn + eye * (1 - attn.sum(dim=-1, keepdim=True))  # [1, L, L] rows sum to 1


TAUS = dict(tau_sink=0.5, tau_edge=0.07, tau_induce=0.7, tau_low=0.85)


def test_the_first_position_is_an_anchor_unless_the_logits_are_shifted():
    """Position 0 (the prompt's first token, confidence 0.95, no sink at tau_sink 0.5) is an anchor for DAWN: mask 2
    attends to it and is induced. ``dawn`` agrees (it used to skip the first real position everywhere); under Dream's
    shift it still skips it, as its logits are a placeholder (a pad's output in a padded batch): the documented
    difference."""
    logits, tokens, attn = hand_built([0.95, 0.3, 0.8, 0.95, 0.5, 0.5], 2, {(2, 0): 0.3})
    _, transfer = dawn_step(logits, tokens, attn, 6, TAUS)
    assert transfer[0].nonzero().flatten().tolist() == [2, 3]
    assert our_step(logits, tokens, attn, (2, 6), **TAUS)[1][0].nonzero().flatten().tolist() == [2, 3]
    assert our_step(logits, tokens, attn, (2, 6), shift=1, **TAUS)[1][0].nonzero().flatten().tolist() == [3]


def test_documented_difference_the_overflow_rewrites_position_0():
    """Candidates 2 and 3 conflict (2 attends to 3): both keep 2; DAWN's loop makes its second pick at position 0 and
    writes the proposal there over the prompt, ``dawn`` stops."""
    logits, tokens, attn = hand_built([0.3, 0.3, 0.88, 0.86, 0.5, 0.5], 2, {(2, 3): 0.3})
    x0, transfer = dawn_step(logits, tokens, attn, 6, TAUS, overflow=True)
    assert transfer[0].nonzero().flatten().tolist() == [0, 2]
    assert int(x0[0, 0]) == int(tokens[0, 0])  # here the arg-max is the prompt's token; the model's need not be
    assert dawn_step(logits, tokens, attn, 6, TAUS)[1][0].nonzero().flatten().tolist() == [2]
    assert our_step(logits, tokens, attn, (2, 6), **TAUS)[1][0].nonzero().flatten().tolist() == [2]
    node = torch.tensor([False, False, True, True])
    edge = torch.zeros(4, 4, dtype=torch.bool)
    edge[2, 3] = True
    conf = torch.tensor([float("-inf"), float("-inf"), 0.88, 0.86], dtype=torch.float64)
    assert conflict_mis(edge, node.clone(), conf.clone()) == [2, 0]
    assert conflict_mis(edge, node.clone(), conf.clone(), overflow=False) == [2]


def test_mask_id_anchor_is_flagged():
    """DAWN's LLaDA proposals may be the mask id; a decoded position whose arg-max is the mask id at >= 0.9 is an
    anchor for DAWN and never for ``dawn`` (the runner-up's probability is below 0.5): the transcription raises."""
    m = model("tiny-llada")
    fn = attention_model_fn(m)

    def masky(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        logits, attn = fn(x)
        logits[:, :2, m.mask_id] = 50.0  # the prompt's first two columns predict the mask id
        return logits, attn

    with pytest.raises(MaskCommitError):
        dawn_generate(masky, torch.tensor([[5, 6, 7]]), gen_length=4, block_length=4, mask_id=m.mask_id,
                      forbid_mask_commit=True)

