"""dInfer's hierarchy step in few ATen calls (``dllm.samplers.hierarchy``), the same decisions: the per-run
arg-max and the commit rule against loops over the runs (its calls per cached step:
``tests/samplers/test_step_calls.py``)."""

from __future__ import annotations

import pytest
import torch

from dllm.samplers import make_sampler
from dllm.samplers.hierarchy import run_argmax

from builders import decode_state, step_input


def _runs(active: list[bool]) -> list[list[int]]:
    runs, cur = [], []
    for i, a in enumerate(active + [False]):
        if a:
            cur.append(i)
        elif cur:
            runs, cur = runs + [cur], []
    return runs


def _run_argmax_loop(score: torch.Tensor, active: torch.Tensor) -> torch.Tensor:
    out = torch.zeros_like(active)
    for r in range(score.shape[0]):
        for run in _runs(active[r].tolist()):
            best = max(score[r, i].item() for i in run)
            out[r, next(i for i in run if score[r, i].item() == best)] = True  # leftmost on ties
    return out


def _random(g: torch.Generator, b: int, q: int) -> tuple[torch.Tensor, torch.Tensor]:
    score = torch.randint(0, 4, (b, q), generator=g).double() / 4  # ties
    return score, torch.rand(b, q, generator=g) < 0.6


def test_run_argmax_is_the_loop_over_runs():
    g = torch.Generator().manual_seed(0)
    for t in range(300):
        score, active = _random(g, 3, 1 + t % 12)
        score[torch.rand(score.shape, generator=g) < 0.2] = float("-inf")  # a run may be all -inf
        assert torch.equal(run_argmax(score, active), _run_argmax_loop(score, active))


@pytest.mark.parametrize("low,high", [(0.4, 0.9), (0.7, 0.3), (0.0, 1.0), (0.25, 0.25)])
def test_the_commit_rule_is_the_loop_over_runs(low, high):
    sampler = make_sampler("hierarchy", low_threshold=low, threshold=high)
    g = torch.Generator().manual_seed(1)
    for t in range(100):
        q = 1 + t % 9
        logits = (torch.randn(3, q, 12, generator=g) * 2).round()  # tied confidences
        active = torch.rand(3, q, generator=g) < 0.7
        out = sampler.step(step_input(logits, active), decode_state((3, q)))
        conf = out.score
        want = torch.zeros_like(active)
        for r in range(3):
            if not active[r].any():
                continue
            keep = [i for i in range(q) if active[r, i] and conf[r, i] > high]
            keep += [i for i in _run_argmax_loop(conf[r:r + 1], active[r:r + 1])[0].nonzero().flatten().tolist()
                     if conf[r, i] > low]
            masked = conf[r].masked_fill(~active[r], float("-inf"))
            keep.append(int(masked.argmax()))
            want[r, keep] = True
        assert torch.equal(out.commit, want), (t, out.commit, want)
