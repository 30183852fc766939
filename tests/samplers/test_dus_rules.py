"""DUS's decode step in few ATen calls (``dllm.samplers.dus``): the round table and its scores made once per
block width (``chunked.constant``) (its calls per cached step: ``tests/samplers/test_step_calls.py``)."""

from __future__ import annotations

import pytest
import torch

from dllm.samplers.dus import dilated_rounds, round_tables


@pytest.mark.parametrize("block,base", [(1, 2), (6, 2), (8, 2), (10, 3), (32, 2)])
def test_round_tables_are_the_rounds(block, base):
    rounds, score = round_tables(block, base, torch.device("cpu"))
    assert torch.equal(rounds, dilated_rounds(block, base))
    assert score.shape == (1, block) and score.dtype == torch.float32
    assert torch.equal(score[0], -rounds.float())
    assert round_tables(block, base, torch.device("cpu"))[0] is rounds  # made once
