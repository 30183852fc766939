"""KLASS's decode step in few ATen calls (``dllm.samplers.klass``), the same decisions: the run of KLs below
kappa kept as the step where it starts, against the literal window of the last H KLs (its calls per
cached step: ``tests/samplers/test_step_calls.py``)."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

from dllm.samplers import make_sampler
from dllm.samplers._ops import top1
from dllm.samplers.klass import kl_divergence

from builders import MASK, V, step_input


def _literal_commits(logit_seq, active_seq, kappa, tau, history, unmask):
    """The rule as written: the last H KLs of each position (inf before the block's first step)."""
    out, prev, window = [], None, None
    for logits, active in zip(logit_seq, active_seq):
        logp = torch.log_softmax(logits, dim=-1, dtype=torch.float64)
        masked = logits.masked_fill(torch.arange(V) == MASK, float("-inf"))
        conf = logp.exp().gather(-1, masked.argmax(dim=-1, keepdim=True)).squeeze(-1)
        kl = torch.full_like(conf, float("inf")) if prev is None else kl_divergence(logp, prev)
        window = torch.full((*conf.shape, history), float("inf"), dtype=conf.dtype) if window is None else window
        window = torch.cat([window[..., 1:], kl[..., None]], dim=-1)
        prev = logp
        ready = active & (window < kappa).all(dim=-1) & (conf > tau)
        if unmask == "max_conf":
            ready = top1(conf, ready)
        elif unmask == "min_kl":
            ready = top1(-kl, ready)
        out.append(ready | (top1(conf, active) & ~ready.any(dim=1, keepdim=True)))
    return out


@pytest.mark.parametrize("history", [1, 2, 3])
@pytest.mark.parametrize("unmask", ["all", "max_conf", "min_kl"])
def test_steps_are_the_literal_kl_window(history, unmask):
    kappa, tau = 0.05, 0.3
    sampler = make_sampler("klass", history=history, unmask=unmask, kl_threshold=kappa, conf_threshold=tau,
                           reset_each_block=True)
    g = torch.Generator().manual_seed(history)
    base = torch.randn(4, 8, V, generator=g) * 3
    logit_seq, active_seq = [], []
    for _ in range(7):  # some positions keep their distribution (KL 0), others move
        moving = (torch.rand(4, 8, 1, generator=g) < 0.4) * torch.randn(4, 8, V, generator=g)
        logit_seq.append(base + moving)
        active_seq.append(torch.rand(4, 8, generator=g) < 0.8)
    state = SimpleNamespace(extras={})
    sampler.begin_block(state)
    got = [sampler.step(step_input(lg, a, mask_id=MASK, step=i), state).commit
           for i, (lg, a) in enumerate(zip(logit_seq, active_seq))]
    want = _literal_commits(logit_seq, active_seq, kappa, tau, history, unmask)
    assert all(torch.equal(a, b) for a, b in zip(got, want))
    assert any(c.sum() > c.any(dim=1).sum() for c in got) or unmask != "all"  # some parallel commits
