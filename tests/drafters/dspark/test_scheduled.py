"""The ``scheduled`` drafter: a verify-length policy over dflash and dlm drafters, lossless at T = 0
(greedy output = transformers' ``generate``), at batch 1 (fast path and general loop) and in ragged
batches, with rounds that really forward fewer drafts; bad options get the registry's errors."""

import pytest
import torch

from dllm import tasks as T
from dllm.drafters.base import make_drafter
from dllm.drafters.dflash.io import random_dflash
from dllm.drafters.loop import speculative_generate
from dllm.models import tiny
from tests.drafters.speculative_helpers import hf_greedy, tiny_target

NEW = 24
POLICIES = ["threshold:threshold=0.6", "survival:threshold=0.4", "threshold:threshold=0.9,min_length=2"]


@pytest.fixture(scope="module")
def tiny_ar(tiny_pair):
    target, tok, _ = tiny_pair
    vocab = tok.get_vocab()
    prompts = [[vocab[w] for w in T.prompt_words(ex)] for name in ("copy_long", "reverse_long", "double_long")
               for ex in T.test_split(name, None, n=2)]
    return target, prompts, [hf_greedy(target, p, NEW, eos=4) for p in prompts]


@pytest.mark.parametrize("policy", POLICIES)
def test_dflash_scheduled_equals_transformers_greedy(tiny_ar, policy):
    target, prompts, truth = tiny_ar
    spec = f"scheduled:inner=(dflash:model=tiny-ar-dflash),policy=({policy})"
    for fast in (True, False):
        for p, want in zip(prompts[:3], truth):
            assert speculative_generate(target, spec, [p], max_new_tokens=NEW, fast_path=fast).generated == [want]
    assert speculative_generate(target, spec, prompts, max_new_tokens=NEW).generated == truth


def test_a_cut_round_forwards_fewer_drafts(tiny_ar):
    """A strict policy verifies fewer tokens per round than plain dflash (the forward is narrower) and
    costs more rounds; the output is the same."""
    target, prompts, truth = tiny_ar
    widths = {}
    for name, spec in [("plain", "dflash:model=tiny-ar-dflash"),
                       ("cut", "scheduled:inner=(dflash:model=tiny-ar-dflash),policy=(threshold:threshold=0.999)")]:
        seen = []
        drafter = make_drafter(spec)
        begin = drafter.begin

        def recording_begin(setup, begin=begin, seen=seen):
            session = begin(setup)
            propose = session.propose

            def recorded(ctx):
                draft = propose(ctx)
                seen.append(draft.tokens.shape[1])  # the drafts the round forwards
                return draft

            session.propose = recorded
            return session

        drafter.begin = recording_begin
        out = speculative_generate(target, drafter, prompts[:2], max_new_tokens=NEW)
        assert out.generated == truth[:2]
        widths[name] = (sum(seen) / len(seen), out.rounds)
    assert widths["cut"][0] < widths["plain"][0]
    assert widths["cut"][1] >= widths["plain"][1]


@pytest.fixture(scope="module")
def random_pair():
    target = tiny_target(seed=2, vocab=64, hidden=64, layers=4, eos=3)
    return target, random_dflash(target.config, 1, 6, 63, seed=4, target_layer_ids=(1, 3))


@pytest.mark.parametrize("policy", ["threshold:threshold=0.3", "survival:threshold=0.05"])
def test_random_target_ragged_batch(random_pair, policy):
    target, body = random_pair
    prompts = [[5, 6, 7, 8, 9], [10, 11], [12, 13, 14, 15, 16, 17, 18, 19]]
    truth = [hf_greedy(target, p, NEW, eos=3) for p in prompts]
    drafter = make_drafter("scheduled", inner=make_drafter("dflash", model=body), policy=policy)
    assert speculative_generate(target, drafter, prompts, max_new_tokens=NEW).generated == truth
    assert speculative_generate(target, drafter, prompts[:1], max_new_tokens=NEW).generated == truth[:1]


def test_dlm_marginals_scheduled_equals_transformers_greedy():
    target = tiny_target(seed=1)
    llada = tiny("llada", seed=3)
    prompts = [[5, 6, 7, 8, 9], [10, 11]]
    truth = [hf_greedy(target, p, NEW) for p in prompts]
    drafter = make_drafter("scheduled", inner=make_drafter("dlm", model=llada, marginals=True),
                           policy="threshold:threshold=0.2")
    assert speculative_generate(target, drafter, prompts, max_new_tokens=NEW, plan=5).generated == truth
    assert speculative_generate(target, drafter, prompts[:1], max_new_tokens=NEW, plan=5).generated == truth[:1]


@pytest.mark.parametrize("kwargs, words", [
    ({"inner": "ngram", "policy": "sometimes"}, ["sometimes", "full", "survival", "threshold"]),
    ({"inner": "ngram", "policy": "threshold:threshold=2"}, ["threshold", "2"]),
    ({"inner": "ngram", "polcy": "full"}, ["polcy", "Valid options", "policy"]),
    ({"policy": "full"}, ["needs an inner drafter"]),
    ({"inner": "nodrafter"}, ["nodrafter", "dflash", "ngram"]),
])
def test_bad_options(kwargs, words):
    with pytest.raises((ValueError, TypeError, KeyError)) as err:
        make_drafter("scheduled", **kwargs)
    assert all(w in str(err.value) for w in words), str(err.value)


def test_a_drafter_without_distributions_is_refused_clearly():
    target = tiny_target(seed=1)
    with pytest.raises(ValueError, match="tokens only"):
        speculative_generate(target, "scheduled:inner=ngram,policy=(threshold:threshold=0.5)", [[5, 6, 7, 5, 6, 7]],
                             max_new_tokens=8)


def test_the_spec_string_and_the_inner_drafter():
    d = make_drafter("scheduled:inner=(dflash:model=tiny-ar-dflash),policy=(survival:threshold=0.5)")
    assert d.inner.name == "dflash" and d.policy.name == "survival" and d.policy.config.threshold == 0.5
    assert d.target_layers == d.inner.target_layers and d.block_size == d.inner.block_size
    assert d.trims_last_block == d.inner.trims_last_block
