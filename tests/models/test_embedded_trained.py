"""The trained embedded models ``tiny-llada`` / ``tiny-dream``: offline loading through the official
formats, and behaviour that only a trained model has (a broken loader, shift or tokenizer shows)."""

import pytest
import torch

import dllm
from dllm import tasks as T
from dllm.models import load


@pytest.fixture(scope="module", params=["tiny-llada", "tiny-dream"])
def model(request):
    return load(request.param)


def _prompts(task, n):
    exs = T.test_split(task, 5, n=n)
    return exs, [T.prompt_ids(ex) for ex in exs], T.answer_length(task, 5)


def test_loads_offline_in_its_family_format(model):
    fam = "llada" if model.family == "llada" else "dream"
    assert model.tokenizer is not None and len(model.tokenizer) == T.PB_MINI_VOCAB_SIZE
    assert model.dtype == torch.float32 and model.vocab_size == 80
    assert model.logit_shift == (1 if fam == "dream" else 0)
    assert 1.0e6 < sum(p.numel() for p in model.parameters()) < 1.3e6


@pytest.mark.parametrize("task", ["copy", "reverse", "sort", "copy_2tok", "reverse_2tok", "add_lsb", "add_msb",
                                  "cumsum"])
def test_solves_zero_tc_tasks_one_token_per_step(model, task):
    exs, prompts, la = _prompts(task, 4)
    out = dllm.generate(model, prompts, gen_length=la, block_length=la, steps=la)
    words = T.vocabulary()
    for ex, row in zip(exs, out.generated.tolist()):
        assert T.score(ex, [words[t] for t in row]), (task, T.prompt_words(ex), [words[t] for t in row])


def test_ssd_is_lossless_on_the_trained_model(model):
    _, prompts, la = _prompts("sort", 3)
    ref = dllm.generate(model, prompts, sampler="low_confidence", gen_length=la, block_length=la, steps=la)
    ssd = dllm.generate(model, prompts, sampler="ssd", gen_length=la, block_length=la)
    assert torch.equal(ref.sequences, ssd.sequences) and ssd.nfe <= ref.nfe
