"""WINO (``dllm/samplers/wino.py``) and the shadow-block forward it reads (``dllm/models/core/shadow.py``)."""

import pytest
import torch

import dllm
from dllm.models import tiny
from dllm.models.base import DiffusionLM
from dllm.samplers import make_sampler
from dllm.samplers._ops import ranks_of
from dllm.samplers.wino import narrow_out, wide_in
from tests.reference.decoders.llada_generate import MaskCommitError
from tests.reference.decoders.wino_generate import wino_generate


# ---- the shadow forward ----------------------------------------------------------------------
@pytest.mark.parametrize("family", ["llada", "dream"])
@pytest.mark.parametrize("padded", [False, True], ids=["plain", "left-padded"])
def test_shadow_forward_contract(family, padded):
    """Real rows equal the plain forward; with one layer, shadow k does not depend on the token it
    predicts (and does depend on its neighbours); the masked-copy reference path has the same
    leave-one-out property on any model."""
    m = tiny(family, seed=3, n_layers=1).eval()
    m.packs_padded_rows = False  # the shadow forward is never packed: its plain twin is the padded forward
    g = torch.Generator().manual_seed(0)
    x = torch.randint(5, 50, (2, 12), generator=g)
    x[:, 8:] = m.mask_id
    x[0, 9] = 7
    kpm = None
    if padded:
        kpm = torch.ones_like(x, dtype=torch.bool)
        kpm[1, :2] = False
    with torch.no_grad():
        plain = m(x, key_padding_mask=kpm).logits
        for path in (m.shadow_forward, lambda *a, **k: DiffusionLM.shadow_forward(m, *a, **k)):
            logits, loo = path(x, start=6, end=12, key_padding_mask=kpm)
            assert loo.shape == (2, 6, m.vocab_size)
            torch.testing.assert_close(logits, plain, atol=1e-5, rtol=1e-5)
            for j in range(6):
                y = x.clone()
                y[:, 6 + j] = 33
                _, loo2 = path(y, start=6, end=12, key_padding_mask=kpm)
                torch.testing.assert_close(loo2[:, j], loo[:, j], atol=1e-5, rtol=1e-5)
                assert (loo2[:, (j + 1) % 6] - loo[:, (j + 1) % 6]).abs().max() > 1e-4


def test_shadow_span_errors():
    m = tiny("dream", seed=0)
    x = torch.randint(5, 50, (1, 8))
    with pytest.raises(ValueError, match=r"shadow span \[0, 4\)"):
        m.shadow_forward(x, start=0, end=4)  # Dream's shift needs a column before the span
    with pytest.raises(ValueError, match="not a non-empty span"):
        m.shadow_forward(x, start=5, end=5)


# ---- the rules on hand-built numbers ---------------------------------------------------------
def test_ranks_stable():
    s = torch.tensor([[0.5, 0.9, 0.5, 0.1]])
    assert ranks_of(s.sort(dim=1, descending=True, stable=True).indices).tolist() == [[1, 0, 2, 3]]
    assert ranks_of(s.sort(dim=1, descending=False, stable=True).indices).tolist() == [[1, 3, 2, 0]]


def test_wide_in_threshold_cap_and_none():
    conf = torch.tensor([[0.7, 0.65, 0.9, 0.2, 0.99], [0.1, 0.2, 0.3, 0.4, 0.5], [0.9, 0.8, 0.7, 0.95, 0.61]],
                        dtype=torch.float64)
    active = torch.tensor([[True, True, True, True, False]] + [[True] * 5] * 2)
    out = wide_in(conf, active, 0.6, torch.tensor([5, 5, 2]))
    assert out[0].tolist() == [True, True, True, False, False]  # inactive 0.99 never taken
    assert not out[1].any()  # none above tau1: the engine's fallback commits the top-1
    assert out[2].tolist() == [True, False, False, True, False]  # 5 qualify, cap 2: the two best


def test_narrow_out_rules():
    back = torch.tensor([[0.5, 0.95, 0.1, 0.3], [0.5, 0.95, 0.1, 0.3], [0.5, 0.95, 0.1, 0.3]],
                        dtype=torch.float64)
    committed = torch.tensor([[True, True, True, False]] * 3)
    # row 0: accepted 3, last_accept 30 -> every committed token below 0.9 (not the uncommitted 0.3)
    # row 1: accepted 1 -> no re-masking
    # row 2: accepted 2, last_accept 2 -> 2 qualify >= 2, so only the 1 lowest
    out = narrow_out(back, committed, 0.9, torch.tensor([3, 1, 2]), torch.tensor([30, 30, 2]))
    assert out.tolist() == [[True, False, True, False], [False] * 4, [False, False, True, False]]


def test_config_ranges():
    for bad, match in [(dict(threshold=0.0), r"threshold must be a number in \(0, 1\), got 0.0"),
                       (dict(threshold=1.0), r"threshold must be a number in \(0, 1\), got 1.0"),
                       (dict(threshold_back=1.5), "threshold_back"), (dict(accept_ratio=0), "accept_ratio"),
                       (dict(min_accept=0), "min_accept"), (dict(min_accept=9, max_accept=3), "min_accept")]:
        with pytest.raises(ValueError, match=match):
            make_sampler("wino", **bad)


# ---- against the transcription of the release ------------------------------------------------
def _reference_forward(m):
    def forward(x, mask, pos):
        with torch.no_grad():
            return m._raw_forward(x, pos[None].expand_as(x), mask, (), ())[0]
    return forward


CASES = [  # (seed, prompt length, gen, block, threshold, threshold_back)
    (0, 6, 16, 8, 0.6, 0.9), (1, 5, 16, 16, 0.6, 0.9), (2, 7, 24, 8, 0.3, 0.9), (3, 4, 16, 4, 0.2, 0.99),
    (4, 6, 32, 16, 0.1, 0.95), (5, 9, 16, 8, 0.05, 0.9), (6, 3, 24, 12, 0.4, 0.8), (7, 5, 32, 32, 0.02, 0.99),
]


@pytest.mark.parametrize("case", CASES, ids=[f"s{c[0]}-g{c[2]}-b{c[3]}-t{c[4]}-tb{c[5]}" for c in CASES])
def test_equals_release_transcription(case):
    seed, plen, gen, block, tau1, tau2 = case
    m = tiny("llada", seed=seed).eval()
    g = torch.Generator().manual_seed(seed)
    prompt = torch.randint(5, m.vocab_size - 8, (1, plen), generator=g)
    prompt[prompt == m.mask_id] = 5
    try:
        ref, ref_nfe = wino_generate(_reference_forward(m), prompt, gen_length=gen, block_length=block,
                                     mask_id=m.mask_id, threshold=tau1, threshold_back=tau2,
                                     max_block_steps=block)
    except MaskCommitError:
        pytest.skip("the release would commit the mask id here")
    out = dllm.generate(m, prompt, sampler="wino", gen_length=gen, block_length=block,
                        threshold=tau1, threshold_back=tau2)
    assert out.sequences.tolist() == ref.tolist()
    assert out.nfe == ref_nfe


def test_some_release_case_remasks():
    """The equality cases above must exercise narrow-out: in at least one, a step leaves more masks
    than the step before it."""
    seen = 0
    for seed, plen, gen, block, tau1, tau2 in CASES:
        m = tiny("llada", seed=seed).eval()
        g = torch.Generator().manual_seed(seed)
        prompt = torch.randint(5, m.vocab_size - 8, (1, plen), generator=g)
        prompt[prompt == m.mask_id] = 5
        left = []
        dllm.generate(m, prompt, sampler="wino", gen_length=gen, block_length=block, threshold=tau1,
                      threshold_back=tau2, callback=lambda s: left.append(int((s.generated == m.mask_id).sum())))
        seen += sum(b > a for a, b in zip(left, left[1:]))
    assert seen > 0


# ---- engine integration ------------------------------------------------------------------------
def test_progress_bound_with_aggressive_remasking():
    """threshold_back = 1 re-masks nearly every earlier commit: the block still ends within
    2 * block_length steps and leaves no masks."""
    m = tiny("llada", seed=1)
    out = dllm.generate(m, [[7, 8, 9]], sampler="wino", gen_length=16, block_length=8, threshold=0.05,
                        threshold_back=1.0)
    assert (out.generated != m.mask_id).all()
    assert out.nfe <= 2 * 16


@pytest.mark.parametrize("family", ["llada", "dream"])
def test_forward_accounting_and_cfg(family):
    m = tiny(family, seed=2)
    out = dllm.generate(m, [[7, 8, 9, 10]], sampler="wino", gen_length=8, block_length=4)
    assert out.forwarded_tokens == out.nfe * (4 + 8 + 4)  # canvas + shadow block per forward
    cfg = dllm.generate(m, [[7, 8, 9, 10]], sampler="wino", gen_length=8, block_length=4, cfg_scale=1.0)
    assert (cfg.generated != m.mask_id).all() and cfg.forwarded_tokens == cfg.nfe * 2 * 16


def test_on_the_oracle_reference_shadow_path():
    """A model without attention layers gets exact leave-one-out views from masked copies; on the
    oracle every re-check is certain, so WINO keeps 100% on C = 0 tasks and never re-masks them."""
    from dllm import tasks as T
    from dllm.models import load

    oracle = load("oracle")
    words = T.vocabulary()
    for task in ("copy", "sort"):
        exs = T.test_split(task, 6, n=3)
        prompts = [T.prompt_ids(ex) for ex in exs]
        la = T.answer_length(task, 6)
        left = []
        out = dllm.generate(oracle, prompts, sampler="wino", gen_length=la, block_length=la,
                            callback=lambda s: left.append(int((s.generated == oracle.mask_id).sum())))
        assert all(b <= a for a, b in zip(left, left[1:]))  # never more masks than before
        for ex, row in zip(exs, out.generated.tolist()):
            assert T.score(ex, [words[t] for t in row]), task
