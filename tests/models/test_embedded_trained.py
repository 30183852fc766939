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


@pytest.fixture(scope="module", params=["tiny-llada-long", "tiny-dream-long"])
def long_model(request):
    return request.param, load(request.param)


def test_long_prompt_models_read_every_task_word(long_model):
    name, model = long_model
    assert model.vocab_size == 88 and len(model.tokenizer) == len(T.vocabulary())
    assert model.family == name.split("-")[1] and model.max_positions == 2048
    ids = T.prompt_ids(T.test_split("lookup_long", 42, n=1)[0])  # its task token is past the PB-mini 80
    assert max(ids) >= T.PB_MINI_VOCAB_SIZE


@pytest.mark.slow
def test_long_prompt_models_copy_a_span_from_far_back(long_model):
    """span_copy_far at the 256- and 512-word test prompts, one token per step: the answer sits at
    least half a prompt before it, so a model that did not learn to read far back fails."""
    _, long_model = long_model
    words = T.vocabulary()
    for size in (252, 508):
        exs = T.test_split("span_copy_far", size, n=3)
        la = T.answer_length("span_copy_far", size)
        out = dllm.generate(long_model, [T.prompt_ids(ex) for ex in exs], gen_length=la, block_length=la, steps=la)
        for ex, row in zip(exs, out.generated.tolist()):
            assert T.score(ex, [words[t] for t in row]), (size, [words[t] for t in row])


def _right_at_one_token_per_step(name: str, task: str, size: int, n: int) -> int:
    """How many of ``task``'s first ``n`` test examples at ``size`` model ``name`` gets exactly right,
    one token per step, the answer as one block."""
    model = load(name)
    words = T.vocabulary()
    exs = T.test_split(task, size, n=n)
    la = T.answer_length(task, size)
    out = dllm.generate(model, [T.prompt_ids(ex) for ex in exs], gen_length=la, block_length=la, steps=la)
    return sum(T.score(ex, [words[t] for t in row]) for ex, row in zip(exs, out.generated.tolist()))


def test_long_llada_model_finds_a_three_item_key_in_a_long_table():
    """tiny-llada-long (trained with the key-width curriculum, then the count curriculum: the
    stages of the ``tiny-llada-long`` recipe, dllm/train/recipes/llada_long.py) reads the value of a three-item key out of a 42-row
    table (258-word prompt) at one token per step. The first training was at chance here (a random
    row's value is right 1 time in 42)."""
    right = _right_at_one_token_per_step("tiny-llada-long", "lookup_long", 42, n=8)
    assert right >= 6, right


def test_long_llada_model_counts_over_a_list():
    """tiny-llada-long's third training (the count curriculum of the ``tiny-llada-long`` recipe: lists of
    4-12 items first, then a doubling at a time) counts an item's occurrences in a 127-item list at
    one token per step: 7 of these 16 right when it was shipped; the model before it got 1."""
    right = _right_at_one_token_per_step("tiny-llada-long", "count_long", 127, n=16)
    assert right >= 4, right


# ---- tiny-sdar: the trained block-diffusion model (SDAR layout, block 4) -----------------------------


@pytest.fixture(scope="module")
def sdar():
    return load("tiny-sdar")


def test_tiny_sdar_loads_in_the_sdar_layout(sdar):
    assert sdar.family == "sdar" and sdar.config.block_causal and sdar.config.block_size == 4
    assert sdar.config.qk_norm and sdar.vocab_size == 80 and sdar.logit_shift == 0
    assert 1.0e6 < sum(p.numel() for p in sdar.parameters()) < 1.3e6


@pytest.mark.parametrize("task", ["copy", "reverse", "sort", "add_lsb", "cumsum", "sudoku4"])
def test_tiny_sdar_solves_zero_tc_tasks_on_its_grid_and_the_block_cache_is_exact(sdar, task):
    """One token per step on the model's grid (a block-causal batch must share its offset in the block,
    so each prompt decodes alone); the exact block cache gives the same tokens with fewer rows."""
    words = T.vocabulary()
    size = T.get_task(task).default_sizes[-1]
    solved = 0
    for ex in T.test_split(task, size, n=4):
        la = T.answer_length(task, size)
        plain = dllm.generate(sdar, [T.prompt_ids(ex)], "low_confidence", gen_length=la, cache="none")
        cached = dllm.generate(sdar, [T.prompt_ids(ex)], "low_confidence", gen_length=la, cache="block")
        assert torch.equal(plain.sequences, cached.sequences) and cached.forwarded_tokens < plain.forwarded_tokens
        solved += bool(T.score(ex, [words[t] for t in plain.generated[0].tolist()]))
    assert solved >= 3, (task, solved)


def test_the_untrained_conversion_does_not_solve_what_training_taught(sdar):
    """tiny-llada's weights with tiny-sdar's switches (the recipe's untrained start) copy worse than the
    trained tiny-sdar: the accuracy comes from the block-diffusion training, not from the conversion."""
    from dllm.train import build_model, get_recipe
    from dllm.scoring.exact_match import decode_and_score, eval_examples

    start = build_model(get_recipe("tiny-sdar")).eval()
    examples = eval_examples(["copy", "sort"], 2)
    assert decode_and_score(start, examples).accuracy["copy"] < decode_and_score(sdar, examples).accuracy["copy"]
