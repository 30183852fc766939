"""dInfer's hierarchy rule (``hierarchy``): the per-run arg-max, the rule on hand-built logits, option
checks, and the exact-posterior oracle."""

import pytest
import torch

import dllm
from dllm import tasks as T
from dllm.models.oracle import OracleLM, oracle_prompts, score_generation
from dllm.samplers import make_sampler
from dllm.samplers.hierarchy import run_argmax

from builders import decode_state, log_probs, prob_row, step_input


def test_run_argmax_one_per_run_leftmost_on_ties():
    score = torch.tensor([[0.1, 0.5, 0.3, 0.9, 0.7, 0.7, 0.2, 0.6]])
    active = torch.tensor([[True, True, False, True, False, True, True, True]])
    # runs {0, 1} -> 1, {3} -> 3, {5, 6, 7} -> 5
    assert run_argmax(score, active)[0].tolist() == [False, True, False, True, False, True, False, False]
    tie = torch.tensor([[0.4, 0.4, 0.4]])
    assert run_argmax(tie, torch.ones(1, 3, dtype=torch.bool))[0].tolist() == [True, False, False]


def test_hierarchy_rule_run_bests_confident_masks_or_only_the_top1():
    sampler = make_sampler("hierarchy")  # low 0.4, threshold 0.9
    rows = [
        # one run of 4: its best (0.6) only; 0.5 is not the run's best; nothing > 0.9
        [prob_row(0.5, 1), prob_row(0.6, 2), prob_row(0.45, 3), prob_row(0.3, 4), prob_row(0.99, 5)],
        # runs {0, 1} and {3, 4}: best of each (0.5, 0.97); plus 0.95 (> threshold, not a run best)
        [prob_row(0.5, 1), prob_row(0.45, 2), prob_row(0.99, 3), prob_row(0.95, 4), prob_row(0.97, 5)],
        # every confidence <= 0.4: only the global top-1
        [prob_row(0.2, 1), prob_row(0.3, 2), prob_row(0.4, 3), prob_row(0.35, 4), prob_row(0.15, 5)],
    ]
    active = [
        [True, True, True, True, False],
        [True, True, False, True, True],
        [True, True, True, True, True],
    ]
    out = sampler.step(step_input(log_probs(rows), active), decode_state((3, 5)))
    assert out.commit.tolist() == [
        [False, True, False, False, False],
        [True, False, False, True, True],
        [False, False, True, False, False],
    ]
    assert out.tokens.tolist() == [[1, 2, 3, 4, 5]] * 3


def test_hierarchy_spreads_commits_over_runs_and_keeps_the_top1():
    rows = [[prob_row(0.8, 1), prob_row(0.3, 2), prob_row(0.6, 3)]]
    inp = step_input(log_probs(rows), [[True, False, True]])  # two runs: {0}, {2}

    def commits(**options):
        return make_sampler("hierarchy", **options).step(inp, decode_state((1, 3))).commit[0].tolist()

    assert commits() == [True, False, True]  # the best of each run
    assert commits(low_threshold=0.7) == [True, False, False]
    assert commits(low_threshold=0.85) == [True, False, False]  # nothing passes: the top-1 alone
    assert commits(low_threshold=0.7, threshold=0.5) == [True, False, True]


@pytest.mark.parametrize("options,match", [
    (dict(low_threshold=-0.1), r"low_threshold must be a number in \[0, 1\], got -0.1"),
    (dict(threshold=1.5), r"threshold must be a number in \[0, 1\], got 1.5"),
])
def test_out_of_range(options, match):
    with pytest.raises(ValueError, match=match):
        make_sampler("hierarchy", **options)


def test_oracle_copy_is_exact_in_one_forward_per_block():
    exs = T.test_split("copy", 8, 4)
    out = dllm.generate(OracleLM(), oracle_prompts(exs), sampler="hierarchy", gen_length=8, block_length=4)
    assert all(score_generation(exs, out))
    assert out.nfe == 2 < 8  # C = 0: every position is certain, each block in one step
