"""Prompt forms of ``dllm.generate`` (dllm/inputs.py): ragged rows as 1-D tensors, and errors that name
the prompt and the form they refuse."""

from __future__ import annotations

import pytest
import torch

import dllm
from dllm.inputs import encode_prompts
from dllm.models import tiny


def test_a_list_of_1d_tensors_is_ragged_token_id_rows():
    model = tiny("llada")
    rows = [torch.tensor([5, 6, 7]), torch.tensor([8, 9], dtype=torch.int32)]
    assert encode_prompts(model, rows) == [[5, 6, 7], [8, 9]]
    a = dllm.generate(model, rows, gen_length=4, seed=0)
    b = dllm.generate(model, [[5, 6, 7], [8, 9]], gen_length=4, seed=0)
    assert torch.equal(a.sequences, b.sequences)


@pytest.mark.parametrize("prompts,error,match", [
    ([torch.tensor([5.0, 6.0])], ValueError, "token ids must be integers"),  # never truncated
    ([torch.tensor([True, False])], ValueError, "token ids must be integers"),
    ([torch.tensor([[5, 6]])], TypeError, r"got a list of Tensor torch.int64 \[1, 2\]$"),
    ([5, 6], TypeError, r"got a list of int \(one prompt's token ids are a row: \[\[5, 6\]\]\)"),
    (["[BOS] copy A [SEP]", [2, 3]], TypeError, r"got a list mixing \['list', 'str'\]"),
])
def test_refused_forms_say_what_they_got(prompts, error, match):
    with pytest.raises(error, match=match):
        encode_prompts(tiny("llada"), prompts)


def test_an_empty_text_prompt_in_a_list_is_named():
    model = dllm.load("tiny-llada")
    with pytest.raises(ValueError, match=r"prompt 1 \(' '\) is empty"):
        dllm.generate(model, ["[BOS] sort D A C B [SEP]", " "], gen_length=4)
