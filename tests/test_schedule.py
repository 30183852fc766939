import pytest
import torch

from dllm.samplers._ops import transfer_schedule
from dllm.schedule import plan_blocks


@pytest.mark.parametrize("masks,steps,expected", [
    (32, 8, [4] * 8), (32, 5, [7, 7, 6, 6, 6]), (32, 32, [1] * 32), (3, 3, [1, 1, 1]), (7, 2, [4, 3]),
])
def test_llada_transfer_schedule(masks, steps, expected):
    n = transfer_schedule(torch.tensor([masks, masks]), steps)
    assert n.tolist() == [expected, expected]
    assert int(n.sum(1)[0]) == masks


def test_blocks_and_steps_split():
    plan = plan_blocks(16, 4, 8, fixed_steps=True)
    assert plan.blocks == ((0, 4, 2), (4, 8, 2), (8, 12, 2), (12, 16, 2))


def test_default_steps_is_one_token_per_step_with_partial_last_block():
    plan = plan_blocks(10, 4, None, fixed_steps=True)
    assert plan.blocks == ((0, 4, 4), (4, 8, 4), (8, 10, 2))


def test_partial_last_block_gets_at_most_its_length():
    plan = plan_blocks(10, 4, 9, fixed_steps=True)
    assert plan.blocks == ((0, 4, 3), (4, 8, 3), (8, 10, 2))


def test_adaptive_blocks_have_no_budget():
    assert plan_blocks(8, 4, None, fixed_steps=False).blocks == ((0, 4, None), (4, 8, None))


def test_block_longer_than_generation_is_an_error():
    # it used to be clamped to one block silently, although the message said it must not be
    assert plan_blocks(8, 8, None, fixed_steps=True).blocks == ((0, 8, 8),)
    with pytest.raises(ValueError, match=r"block_length must be a positive integer <= gen_length=8 .*got 100"):
        plan_blocks(8, 100, None, fixed_steps=True)


@pytest.mark.parametrize("kwargs,match", [
    (dict(gen_length=0, block_length=4, steps=None), r"gen_length must be a positive integer, got 0"),
    (dict(gen_length=8, block_length=0, steps=None), r"block_length must be a positive integer .* got 0"),
    (dict(gen_length=8, block_length=-2, steps=None), r"got -2"),
    (dict(gen_length=16, block_length=4, steps=6), r"steps=6 cannot be split evenly over 4 blocks.*multiples of 4"),
    (dict(gen_length=16, block_length=4, steps=32), r"8 steps per block but a block holds only 4"),
    (dict(gen_length=16, block_length=4, steps=0), r"steps must be a positive integer, got 0"),
])
def test_bad_block_settings(kwargs, match):
    with pytest.raises(ValueError, match=match):
        plan_blocks(fixed_steps=True, **kwargs)
