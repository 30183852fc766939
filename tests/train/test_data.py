"""The task mixer: determinism, layout, test-prompt rejection, configuration checks."""

from __future__ import annotations

import random

import pytest
import torch

from dllm import tasks as T
from dllm.models.text.task_tokenizer import task_tokenizer
from dllm.train import MixtureConfig, TaskMixture
from .helpers import FEW_TASKS


def test_default_mixture_is_every_task_at_full_range():
    cfg = MixtureConfig()
    assert cfg.task_names() == T.suite_task_names() and len(cfg.task_names()) == 31
    assert set(cfg.task_weights()) == {1 / 31}
    for name, sizes in zip(cfg.task_names(), cfg.task_sizes()):
        assert sizes == tuple(T.get_task(name).sizes)
    assert cfg.max_sequence_length() <= 64


def test_batches_are_deterministic_and_order_free():
    a, b = TaskMixture(MixtureConfig(), seed=3), TaskMixture(MixtureConfig(), seed=3)
    forward = [a.batch(s, 16) for s in range(6)]
    backward = [b.batch(s, 16) for s in reversed(range(6))][::-1]  # resume-style random access
    for x, y in zip(forward, backward):
        assert torch.equal(x.input_ids, y.input_ids) and torch.equal(x.answer_mask, y.answer_mask)
        assert torch.equal(x.key_padding_mask, y.key_padding_mask) and x.tasks == y.tasks
    other = TaskMixture(MixtureConfig(), seed=4).batch(0, 16)
    assert not (other.input_ids.shape == forward[0].input_ids.shape
                and torch.equal(other.input_ids, forward[0].input_ids))


def test_batch_layout_matches_sequences_and_tokenizer():
    mix = TaskMixture(MixtureConfig(), seed=0)
    exs = mix.examples(5, 32)
    batch = mix.batch(5, 32)
    ids, answer, real = batch  # (input_ids, answer_mask, key_padding_mask)
    tok = task_tokenizer()
    for j, ex in enumerate(exs):
        n = int(real[j].sum())
        assert bool(real[j, :n].all()) and not bool(real[j, n:].any())  # right padding
        assert tok.convert_ids_to_tokens(ids[j, :n].tolist()) == list(T.sequence_words(ex))
        assert (ids[j, n:] == tok.pad_token_id).all()
        lp = len(T.prompt_words(ex))
        assert answer[j].nonzero().flatten().tolist() == list(range(lp, n))
        assert batch.positions[j, :n].tolist() == list(range(n))  # first real token at position 0
    assert batch.answer_len.tolist() == [len(T.target_words(ex)) for ex in exs]
    assert batch.tasks == tuple(ex.task for ex in exs)


def test_length_buckets_keep_examples_and_shrink_width():
    bucketed = TaskMixture(MixtureConfig(length_bucket=4), seed=1)
    plain = TaskMixture(MixtureConfig(length_bucket=1), seed=1)
    group = sorted((ex for s in range(4) for ex in bucketed.examples(s, 16)), key=repr)
    assert len(group) == 64 and len(set(map(repr, group))) > 32
    width_b = sum(bucketed.batch(s, 64).input_ids.shape[1] for s in range(8))
    width_p = sum(plain.batch(s, 64).input_ids.shape[1] for s in range(8))
    assert width_b < width_p


def test_test_prompts_are_rejected():
    # copy at n = 3 has 16*15*14 = 3360 prompts, 50 of them held out: ~1.5% of draws are redrawn
    mix = TaskMixture(MixtureConfig(tasks=("copy",), sizes=((3,),), length_bucket=1), seed=0)
    exs = [ex for s in range(12) for ex in mix.examples(s, 128)]
    assert mix.rejected > 0
    assert not any(T.is_test_prompt(ex) for ex in exs)
    held_out = T.test_split("copy", 3, n=50)
    raw_rng = random.Random(0)
    raw = [T.generate("copy", raw_rng, 3) for _ in range(3000)]
    assert any(T.is_test_prompt(ex) for ex in raw)  # the raw generator does produce them
    assert {ex.prompt for ex in held_out}.isdisjoint({ex.prompt for ex in exs})


def test_weights_and_sizes_are_respected():
    cfg = MixtureConfig(tasks=("copy", "sort"), weights=(1.0, 0.0), sizes=((4,), (5,)))
    exs = TaskMixture(cfg, seed=0).examples(0, 40)
    assert {(ex.task, ex.size) for ex in exs} == {("copy", 4)}
    assert FEW_TASKS.task_names() == ("copy", "reverse", "sort", "add_lsb")


@pytest.mark.parametrize("kwargs, match", [
    (dict(tasks=("copy",), weights=(1.0, 2.0)), "weights"),
    (dict(tasks=("copy",), weights=(-1.0,)), "weights"),
    (dict(tasks=("copy",), sizes=((99,),)), "size"),
    (dict(tasks=("nope",)), "nope"),
    (dict(length_bucket=0), "length_bucket"),
])
def test_bad_mixture_configs(kwargs, match):
    with pytest.raises((ValueError, KeyError), match=match):
        MixtureConfig(**kwargs)


def test_a_count_curriculum_variant_never_trains_on_a_count_long_test_prompt(monkeypatch):
    """count_c16 draws from count_long's distribution and its prompts carry count_long's word: test
    instance 0 of count_long at 251 is a count_c16 prompt of the same words (same generator, same seed).
    Training redraws it (is_held_out; the old check read count_c16's own split, which holds nothing)."""
    from dllm.train.recipes.narrow_tasks import narrow_count

    name = narrow_count(16)
    held = {h.prompt for h in T.test_split("count_long", 251, n=T.TEST_SPLIT_SIZE)}
    leaked = T.generate(name, random.Random(T.instance_seed("count_long", 251, 0)), 251)
    assert leaked.prompt in held and not T.is_test_prompt(leaked)  # the task's own check misses it

    real = T.generate
    draws = iter([leaked])  # the mixture's first draw is the test prompt, then the generator's own
    monkeypatch.setattr(T, "generate", lambda task, rng, size: next(draws, None) or real(task, rng, size))
    mix = TaskMixture(MixtureConfig(tasks=(name,), sizes=((251,),), length_bucket=1), seed=0)
    ex = mix.sample(random.Random(1))
    assert mix.rejected == 1 and ex.prompt not in held

    from dllm.train.data import is_held_out

    assert is_held_out(leaked) and not is_held_out(ex)
    assert not is_held_out(real(name, random.Random(0), 16))  # below count_long's sizes: nothing to meet
