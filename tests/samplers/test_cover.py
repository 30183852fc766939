"""COVER (``dllm.samplers.cover``) against the plain restatement of its rules
(``tests/reference/decoders/cover_generate.py``; no authors' code was found): the same tokens and
forwards on 20 PB-mini prompts x 3 settings on each embedded tiny model; caches, ragged batches,
options, the rules on hand-built numbers, and fewer flip-flops than ``wino``."""

from __future__ import annotations

import functools

import pytest
import torch

import dllm
from dllm import tasks as T
from dllm.samplers import make_sampler
from dllm.samplers.cover import CoverRecords, choose_seeds, draft, revoke, stability_score
from tests.reference.decoders.cover_generate import cover_generate

SETTINGS = [
    dict(),
    dict(threshold=0.3, block_length=4),
    dict(same_argmax_passes=False, seed_ratio=2.0, verify_threshold=0.99, max_seeds=3, drift_weight=1.0,
         influence_weight=0.0),
]
MODELS = ["tiny-llada", "tiny-dream"]


@functools.lru_cache(maxsize=None)
def model(name: str):
    return dllm.load(name)


def prompts(m, n: int = 20) -> list[tuple[list[int], int]]:
    """(prompt ids, answer length) of ``n`` test-split instances across the suite."""
    out = []
    for name in T.suite_task_names():
        for ex in T.test_split(name, n=1):
            out.append((m.generation_prompt(" ".join(T.prompt_words(ex))), T.answer_length(name, ex.size)))
    return out[:: max(1, len(out) // n)][:n]


def raw_forward(m):
    def forward(x, pos, mask):
        with torch.no_grad():
            return m._raw_forward(x, pos, mask, (), ())[0]
    return forward


# ---- against the reference -----------------------------------------------------------------------
@pytest.mark.parametrize("setting", SETTINGS, ids=["defaults", "aggressive-blocks", "strict-verify"])
@pytest.mark.parametrize("name", MODELS)
def test_equals_the_reference(name, setting):
    m = model(name)
    opts = {k: v for k, v in setting.items() if k != "block_length"}
    revocations = 0
    for i, (prompt, g) in enumerate(prompts(m)):
        block = min(setting.get("block_length", g), g)
        ref, ref_nfe, revoked = cover_generate(raw_forward(m), torch.tensor([prompt]), gen_length=g,
                                               block_length=block, mask_id=m.mask_id, shift=m.logit_shift, **opts)
        out = dllm.generate(m, [prompt], sampler="cover", gen_length=g, block_length=block, **opts)
        assert out.sequences.tolist() == ref.tolist(), (i, prompt)
        assert out.nfe == ref_nfe, (i, prompt)
        revocations += revoked
    assert revocations > 0  # the cases exercise the revocation path


# ---- caches, batches, accounting -------------------------------------------------------------------
@pytest.mark.parametrize("name", MODELS)
def test_caches_and_ragged_batches(name):
    """``dual:refresh=1`` is ``none`` exactly; under ``none``, ``dual`` and ``auto`` a ragged batch
    decodes each row as it decodes alone and leaves no mask."""
    m = model(name)
    rows = [p for p, _ in prompts(m, 5)]
    g = 8
    none = dllm.generate(m, rows, sampler="cover", gen_length=g, threshold=0.3)
    every = dllm.generate(m, rows, sampler="cover", gen_length=g, threshold=0.3, cache="dual:refresh=1")
    assert torch.equal(none.generated, every.generated) and none.nfe == every.nfe
    for cache in ("none", "dual", "auto"):
        batch = dllm.generate(m, rows, sampler="cover", gen_length=g, block_length=4, threshold=0.3, cache=cache)
        assert (batch.generated != m.mask_id).all(), cache
        for j, p in enumerate(rows):
            alone = dllm.generate(m, [p], sampler="cover", gen_length=g, block_length=4, threshold=0.3, cache=cache)
            assert batch.generated[j].tolist() == alone.generated[0].tolist(), (cache, j)


def test_one_forward_per_step_with_a_shadow_block():
    m = model("tiny-llada")
    prompt, _ = prompts(m, 1)[0]
    out = dllm.generate(m, [prompt], sampler="cover", gen_length=8, block_length=4)
    assert out.nfe == out.steps
    assert out.forwarded_tokens == out.nfe * (len(prompt) + 8 + 4)  # canvas + shadow block per forward


# ---- the flip-flop ---------------------------------------------------------------------------------
def flip_flops(m, spec: str, rows) -> tuple[int, int, int]:
    """(forwards, re-masks, re-masked tokens later restored unchanged) over ``rows``."""
    nfe = remasks = restored = 0
    for prompt, g in rows:
        canvases = []
        out = dllm.generate(m, [prompt], sampler=spec, gen_length=g,
                            callback=lambda s: canvases.append(s.generated[0].tolist()))
        nfe += out.nfe
        lost: dict[int, int] = {}
        for before, after in zip(canvases, canvases[1:]):
            for j, (a, b) in enumerate(zip(before, after)):
                if a != m.mask_id and b == m.mask_id:
                    remasks += 1
                    lost[j] = a
                elif a == m.mask_id and b != m.mask_id and j in lost:
                    restored += int(lost.pop(j) == b)
    return nfe, remasks, restored


def test_fewer_flip_flops_than_wino():
    """On tiny-llada wino restores nearly every token it re-masks (the flip-flop); cover re-masks a
    fraction as often, restores fewer than a quarter as many, and needs no more forwards."""
    m = model("tiny-llada")
    rows = prompts(m, 20)
    w_nfe, w_remasks, w_restored = flip_flops(m, "wino", rows)
    c_nfe, c_remasks, c_restored = flip_flops(m, "cover", rows)
    assert w_restored >= 0.9 * w_remasks > 0  # the flip-flop is there to stop
    assert c_remasks * 3 <= w_remasks and c_restored * 4 <= w_restored
    assert c_nfe <= w_nfe


# ---- the rules on hand-built numbers ---------------------------------------------------------------
def test_draft_threshold_cap_and_top1():
    conf = torch.tensor([[0.7, 0.65, 0.9, 0.2, 0.99], [0.1, 0.2, 0.3, 0.4, 0.5], [0.9, 0.8, 0.7, 0.95, 0.61]],
                        dtype=torch.float64)
    active = torch.tensor([[True, True, True, True, False]] + [[True] * 5] * 2)
    out = draft(conf, active, 0.6, torch.tensor([5, 5, 2]))
    assert out[0].tolist() == [True, True, True, False, False]  # the inactive 0.99 is never taken
    assert out[1].tolist() == [False] * 4 + [True]  # none above the threshold: the top-1
    assert out[2].tolist() == [True, False, False, True, False]  # 5 qualify, cap 2: the two best


def test_stability_score_terms():
    # row: position 0 committed at step 0 (p 0.9, saw 0 others), 1 at step 1 (p 0.6, saw 1), 2 masked,
    # 3 at step 1 (p 0.99, saw 1); 3 committed now, 2 others each
    rec = CoverRecords(p=torch.tensor([[0.9, 0.6, 0.0, 0.99]], dtype=torch.float64),
                       seen=torch.tensor([[0, 1, 0, 1]]), order=torch.tensor([[0, 1, -1, 1]]),
                       last_accept=torch.tensor([2]))
    committed = torch.tensor([[True, True, False, True]])
    score = stability_score(rec, committed, influence_weight=0.5, drift_weight=0.5)
    w = 4
    assert score[0, 0].item() == pytest.approx(0.1 + 0.5 * 2 / w + 0.5 * 2 / w)  # 2 later, 2 new
    assert score[0, 1].item() == pytest.approx(0.4 + 0.5 * 0 / w + 0.5 * 1 / w)  # a sibling is not later
    assert score[0, 3].item() == pytest.approx(0.01 + 0.5 * 1 / w)
    # the budget: ceil(seed_ratio * last_accept) of the highest scores >= seed_threshold
    pick = lambda **kw: choose_seeds(rec, committed, make_sampler("cover", **kw).config)[0].tolist()
    assert pick() == [True, True, False, False]  # 2 seeds: positions 0 (0.6) and 1 (0.525)
    assert pick(seed_ratio=0.5) == [True, False, False, False]
    assert pick(seed_ratio=2.0, max_seeds=3) == [True, True, False, True]
    assert pick(seed_ratio=2.0, seed_threshold=0.2) == [True, True, False, False]  # 3's score is 0.135
    assert pick(seed_ratio=0.0) == [False] * 4


def test_revoke_least_likely_first_and_capped():
    q = torch.tensor([[0.5, 0.1, 0.3, 0.2]], dtype=torch.float64).repeat(3, 1)
    fail = torch.tensor([[True, True, True, False]] * 3)
    out = revoke(q, fail, torch.tensor([2, 0, -1]))
    assert out.tolist() == [[False, True, True, False], [False] * 4, [False] * 4]


@pytest.mark.parametrize("bad, match", [
    (dict(threshold=1.0), r"threshold must be a number in \(0, 1\), got 1.0"),
    (dict(verify_threshold=0.0), "verify_threshold"), (dict(accept_ratio=0), "accept_ratio"),
    (dict(min_accept=9, max_accept=3), "min_accept"), (dict(seed_ratio=-1.0), "seed_ratio"),
    (dict(max_seeds=-1), "max_seeds"), (dict(seed_threshold=float("inf")), "seed_threshold"),
    (dict(influence_weight=-0.5), "influence_weight"), (dict(drift_weight=float("nan")), "drift_weight"),
    (dict(same_argmax_passes="no"), "same_argmax_passes"),
])
def test_bad_options(bad, match):
    with pytest.raises(ValueError, match=match):
        make_sampler("cover", **bad)
    with pytest.raises(ValueError, match=match):  # through generate, as a spec string too
        dllm.generate(model("tiny-llada"), [[7, 8, 9]], sampler="cover", gen_length=4, **bad)


def test_unknown_option_lists_the_valid_ones():
    with pytest.raises(TypeError, match="Unknown option.*'seeds'.*Valid options: threshold"):
        make_sampler("cover:seeds=3")
