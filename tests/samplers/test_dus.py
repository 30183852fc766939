"""DUS (``dus``): the dilated round schedule, its step rule on hand-built logits, end to end on tiny
models (ceil(log2 B) forwards per block, odd and partial blocks), and on the exact-posterior oracle."""

import math

import pytest
import torch

import dllm
from dllm import tasks as T
from dllm.models import tiny
from dllm.models.oracle import OracleLM, oracle_prompts, score_generation
from dllm.samplers import make_sampler
from dllm.samplers.dus import dilated_rounds, num_rounds

from builders import MASK, V, ordinary_ids, step_input


def _paper_rounds(block):
    """The paper's rule for a power-of-two block, literally: round t = 1..log2 B has stride
    B / 2^t and reveals the unrevealed 1-indexed k with (k - 1) mod stride == 0."""
    out, revealed = [0] * block, set()
    for t in range(1, int(math.log2(block)) + 1):
        stride = block // 2**t
        for k in range(1, block + 1):
            if (k - 1) % stride == 0 and k not in revealed:
                out[k - 1] = t
                revealed.add(k)
    return out


@pytest.mark.parametrize("block", [2, 4, 8, 16, 32, 64])
def test_power_of_two_blocks_follow_the_paper(block):
    assert dilated_rounds(block).tolist() == _paper_rounds(block)
    counts = torch.bincount(dilated_rounds(block))[1:].tolist()
    assert counts == [2] + [2 ** (t - 1) for t in range(2, int(math.log2(block)) + 1)]  # 2, 2, 4, ..., B/2


@pytest.mark.parametrize("block,expected", [
    (1, [1]),
    (3, [1, 2, 1]),
    (6, [1, 3, 2, 3, 1, 3]),  # the schedule of 8 restricted to 6: {1, 5}, {3}, {2, 4, 6} (1-indexed)
    (8, [1, 3, 2, 3, 1, 3, 2, 3]),
])
def test_small_and_odd_blocks(block, expected):
    assert dilated_rounds(block).tolist() == expected


@pytest.mark.parametrize("block", range(1, 70))
def test_every_block_takes_ceil_log2_rounds_and_none_is_empty(block):
    r = dilated_rounds(block)
    assert num_rounds(block) == max(1, math.ceil(math.log2(block)))
    assert sorted(set(r.tolist())) == list(range(1, num_rounds(block) + 1))


def test_other_bases():
    assert dilated_rounds(9, 3).tolist() == [1, 2, 2, 1, 2, 2, 1, 2, 2]
    assert dilated_rounds(10, 3).tolist() == [1, 3, 3, 2, 3, 3, 2, 3, 3, 1]  # 27 restricted to 10


# ---- the rule -----------------------------------------------------------------------------------------
def _input(active, window=None):
    active = torch.tensor(active)
    bsz, width = active.shape
    logits = torch.randn(bsz, width, V, generator=torch.Generator().manual_seed(0))
    logits[..., MASK] = -10.0  # (the runner-up rule for the mask id is tested below)
    return step_input(logits, active, window=window)


def test_each_row_commits_its_earliest_unfinished_round():
    active = [[1, 1, 1, 1, 1, 1, 1, 1],  # fresh: round 1 = {0, 4}
              [0, 1, 1, 1, 0, 1, 1, 1],  # round 1 done: round 2 = {2, 6}
              [0, 1, 1, 1, 1, 1, 0, 1],  # round 1 half done: the rest of it, {4}
              [0, 0, 0, 0, 0, 0, 0, 0]]  # finished: nothing
    out = make_sampler("dus").step(_input([[bool(a) for a in row] for row in active]), None)
    assert out.commit.long().tolist() == [[1, 0, 0, 0, 1, 0, 0, 0], [0, 0, 1, 0, 0, 0, 1, 0],
                                          [0, 0, 0, 0, 1, 0, 0, 0], [0] * 8]
    assert torch.equal(out.tokens, _input(active).logits.argmax(-1))


def test_the_window_is_the_block_in_query_coordinates():
    # a query of 7 columns whose block is columns 2..6 (B = 5: rounds {0, 4}, {2}, {1, 3})
    active = [[False, False, True, True, True, True, True]]
    out = make_sampler("dus").step(_input(active, window=(2, 7)), None)
    assert out.commit[0].tolist() == [False, False, True, False, False, False, True]


def test_the_mask_token_is_never_proposed():
    inp = _input([[True, True]])
    inp.logits[0, 0, MASK] = 100.0
    out = make_sampler("dus").step(inp, None)
    assert out.tokens[0, 0] != MASK and out.commit[0].tolist() == [True, True]


@pytest.mark.parametrize("options,match", [
    (dict(base=1), r"base must be an integer >= 2, got 1"),
    (dict(base=2.0), r"base must be an integer >= 2, got 2.0"),
])
def test_out_of_range(options, match):
    with pytest.raises(ValueError, match=match):
        make_sampler("dus", **options)


# ---- end to end -------------------------------------------------------------------------------------
@pytest.fixture(scope="module", params=["llada", "dream"])
def model(request):
    return tiny(request.param, seed=0)


@pytest.mark.parametrize("gen_length,block_length", [(16, 8), (16, 16), (11, 6), (7, 7), (10, 3), (5, 1)])
def test_nfe_per_block_is_ceil_log2_and_the_trace_is_the_schedule(model, gen_length, block_length):
    out = dllm.generate(model, [ordinary_ids(model, 4, 0)], sampler="dus", gen_length=gen_length,
                        block_length=block_length, steps=gen_length, return_trace=True)  # steps: ignored
    assert (out.generated != model.mask_id).all()
    blocks = [(s, min(s + block_length, gen_length)) for s in range(0, gen_length, block_length)]
    assert out.nfe == sum(num_rounds(e - s) for s, e in blocks)
    step0 = 0
    for s, e in blocks:
        assert (out.trace[0, s:e] - step0 + 1).tolist() == dilated_rounds(e - s).tolist()
        step0 += num_rounds(e - s)


def test_batch_of_ragged_prompts_equals_each_prompt_alone(model):
    prompts = [ordinary_ids(model, 3, 1), ordinary_ids(model, 8, 2), ordinary_ids(model, 5, 3)]
    kw = dict(sampler="dus", gen_length=12, block_length=6)
    batch = dllm.generate(model, prompts, **kw)
    assert batch.nfe == 6 and (batch.generated != model.mask_id).all()
    for j, p in enumerate(prompts):
        assert torch.equal(batch.generated[j], dllm.generate(model, [p], **kw).generated[0]), j


def test_sampling_is_reproducible_under_a_seed(model):
    kw = dict(sampler="dus", gen_length=8, temperature=1.0)
    a = dllm.generate(model, [ordinary_ids(model, 4, 0)], seed=5, **kw)
    b = dllm.generate(model, [ordinary_ids(model, 4, 0)], seed=5, **kw)
    assert torch.equal(a.sequences, b.sequences) and a.nfe == 3


# ---- the exact-posterior oracle ------------------------------------------------------------------------
@pytest.fixture(scope="module")
def oracle():
    return OracleLM()


@pytest.mark.parametrize("task", ["copy", "reverse"])
def test_single_answer_tasks_are_solved_in_log2_forwards_per_block(oracle, task):
    exs = T.test_split(task, 8, 6)
    g = T.answer_length(task, 8)  # 9: eight words and the EOS
    out = dllm.generate(oracle, oracle_prompts(exs), sampler="dus", gen_length=g, block_length=8)
    assert all(score_generation(exs, out))
    assert out.nfe == 3 + 1 < g  # blocks of 8 and 1


def test_the_dilated_order_keeps_shuffle_slots_apart_but_not_independent(oracle):
    # shuffle of 4 at T = 0 with exact (tied) marginals: round 1 reveals slots 1 and 3 together
    # from independent marginals, picking the same item for both (the tie breaks the same way),
    # so the answer is never a permutation; one token per step is always valid.
    exs = T.test_split("shuffle", 4, 4)
    out = dllm.generate(oracle, oracle_prompts(exs), sampler="dus", gen_length=4)
    assert out.nfe == 2 and not any(score_generation(exs, out))
    ref = dllm.generate(oracle, oracle_prompts(exs), sampler="low_confidence", gen_length=4, steps=4)
    assert all(score_generation(exs, ref))
