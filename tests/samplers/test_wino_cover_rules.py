"""The revocable samplers' decode steps in few ATen calls (``dllm.samplers.wino``,
``dllm.samplers.cover``), the same decisions: their rules read off one confidence order against the
rules as written (``take_top_k`` / ``top1`` per rule) on random numbers with ties, the count tables
against the formulas (their calls per cached step: ``tests/samplers/test_step_calls.py``)."""

from __future__ import annotations

import pytest
import torch

from dllm.samplers import make_sampler
from dllm.samplers._ops import take_top_k, top1
from dllm.samplers.cover import CoverRecords, choose_seeds, draft, revoke, stability_score
from dllm.samplers.wino import draft_cap, draft_caps, narrow_out, wide_in


# ---- the rules as written ----------------------------------------------------------------------------
def wide_in_as_written(conf, active, tau1, cap):
    want = active & (conf > tau1)
    over = want.sum(dim=1) > cap
    return torch.where(over[:, None], take_top_k(conf, cap, active), want)


def narrow_out_as_written(conf_back, committed, tau2, accepted, last_accept):
    low = committed & (conf_back < tau2) & (accepted > 1)[:, None]
    too_many = low.sum(dim=1) >= last_accept
    lowest = low & take_top_k(-conf_back, last_accept - 1, committed)
    return torch.where(too_many[:, None], lowest, low)


def draft_as_written(conf, active, tau, cap):
    want = wide_in_as_written(conf, active, tau, cap)
    return want | (top1(conf, active) & ~want.any(dim=1, keepdim=True))


def stability_as_written(rec, committed, iw, dw):
    width = committed.shape[1]
    later = (rec.order[:, None, :] > rec.order[:, :, None]) & committed[:, None, :]
    others = (committed.sum(dim=1, keepdim=True) - 1).clamp(min=0)
    n_new = (others - rec.seen).clamp(min=0)
    return (1 - rec.p) + iw * (later.sum(dim=2).double() / width) + dw * (n_new.double() / width)


def seeds_as_written(rec, committed, cfg):
    score = stability_as_written(rec, committed, cfg.influence_weight, cfg.drift_weight)
    budget = (rec.last_accept.double() * cfg.seed_ratio).ceil().long().clamp(max=cfg.max_seeds)
    return take_top_k(score, budget, committed & (score >= cfg.seed_threshold))


def coarse(g, *shape):
    """float64 values on a grid of tenths: many ties."""
    return torch.randint(0, 11, shape, generator=g).double() / 10


def test_wide_in_narrow_out_and_draft_are_the_rules_as_written():
    g = torch.Generator().manual_seed(0)
    for _ in range(300):
        b, w = int(torch.randint(1, 5, (1,), generator=g)), int(torch.randint(1, 12, (1,), generator=g))
        conf, active = coarse(g, b, w), torch.rand(b, w, generator=g) < 0.6
        cap = torch.randint(0, w + 2, (b,), generator=g)
        tau = float(torch.randint(0, 10, (1,), generator=g)) / 10 + 0.05
        assert torch.equal(wide_in(conf, active, tau, cap), wide_in_as_written(conf, active, tau, cap))
        assert torch.equal(draft(conf, active, tau, cap), draft_as_written(conf, active, tau, cap))
        accepted, last = torch.randint(0, w + 1, (b,), generator=g), torch.randint(1, w + 2, (b,), generator=g)
        assert torch.equal(narrow_out(conf, ~active, tau, accepted, last),
                           narrow_out_as_written(conf, ~active, tau, accepted, last))
        limit = torch.randint(-1, w + 1, (b,), generator=g)
        fail = ~active & (conf < tau)
        assert torch.equal(revoke(conf, fail, limit), take_top_k(-conf, limit.clamp(min=0), fail))


@pytest.mark.parametrize("options", [{}, dict(seed_ratio=0.7, max_seeds=3, seed_threshold=0.3),
                                     dict(seed_ratio=2.5, influence_weight=0.0, drift_weight=1.5)])
def test_the_seeds_are_the_rule_as_written(options):
    cfg = make_sampler("cover", **options).config
    g = torch.Generator().manual_seed(1)
    for _ in range(200):
        b, w = int(torch.randint(1, 5, (1,), generator=g)), int(torch.randint(1, 12, (1,), generator=g))
        order = torch.randint(-1, 4, (b, w), generator=g)
        rec = CoverRecords(p=coarse(g, b, w), seen=torch.randint(0, w, (b, w), generator=g), order=order,
                           last_accept=torch.randint(0, w + 1, (b,), generator=g))
        committed = order >= 0
        want = stability_as_written(rec, committed, cfg.influence_weight, cfg.drift_weight)
        got = stability_score(rec, committed, cfg.influence_weight, cfg.drift_weight)
        assert torch.equal(got[committed], want[committed])  # the same bits where read
        assert torch.equal(choose_seeds(rec, committed, cfg), seeds_as_written(rec, committed, cfg))


def test_the_cap_table_is_draft_cap():
    for ratio, low, high in [(0.7, 5, 20), (0.3, 1, 4), (1.0, 1, 1), (0.95, 2, 64)]:
        counts = torch.arange(65)
        assert torch.equal(draft_caps(64, ratio, low, high, counts.device), draft_cap(counts, ratio, low, high))
