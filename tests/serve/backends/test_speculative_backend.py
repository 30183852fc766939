"""SpeculativeBackend: concurrent speculative requests, each equal to speculative_generate alone."""

from __future__ import annotations

import pytest

import dllm
from dllm.serve.backends.base import BadRequest
from dllm.serve.backends.jobs import Delta, Done, Failed, JobRequest, SpeculativeSettings
from dllm.settings import DecodeSettings
from dllm.serve.backends.speculative import SpeculativeBackend

DRAFTER = "dflash:model=tiny-ar-dflash"
PROMPTS = ["[BOS] copy_long G N J M O G G M P I A P M G O N H O G N L B E N C I L N N I I K [SEP]",
           "[BOS] reverse_long J L D H C E E B A J O M N K G I H O F F C F O J D P P M O H L B [SEP]"]


@pytest.fixture(scope="module")
def pair():
    return dllm.load_target("tiny-ar")


@pytest.fixture(scope="module")
def engine(pair):
    target, tok = pair
    eng = SpeculativeBackend(target, tok, drafter=DRAFTER, name="tiny-ar", max_running=4)
    yield eng
    eng.close()


def test_concurrent_requests_equal_offline_and_stream_per_round(pair, engine):
    target, tok = pair
    spec = [(PROMPTS[i % 2], (12, 30)[i % 2]) for i in range(6)]
    jobs = [(p, n, engine.submit(JobRequest(engine.encode_prompt(p), n, SpeculativeSettings()))) for p, n in spec]
    for p, n, job in jobs:
        events = list(job.events(timeout=120))
        done = events[-1]
        assert isinstance(done, Done)
        offline = dllm.speculative_generate(target, DRAFTER, [p], max_new_tokens=n, tokenizer=tok)
        deltas = [e for e in events if isinstance(e, Delta)]
        assert done.text == offline.texts[0] == "".join(d.text for d in deltas)
        assert len(deltas) >= 2  # one per verification round, not one chunk at the end
        assert done.nfe == offline.target_forwards and done.acceptance > 1


def test_stop_and_cancel(pair, engine):
    target, tok = pair
    full = dllm.speculative_generate(target, DRAFTER, [PROMPTS[0]], max_new_tokens=30, tokenizer=tok).texts[0]
    stop = full.split()[5]
    done = engine.submit(JobRequest(engine.encode_prompt(PROMPTS[0]), 30, SpeculativeSettings(),
                                    stop=(stop,))).result(60)
    assert done.text == full[:full.index(stop)] and done.finish_reason == "stop"
    job = engine.submit(JobRequest(engine.encode_prompt(PROMPTS[1]), 60, SpeculativeSettings()))
    job.cancel()
    final = job.result(60)
    assert isinstance(final, Failed) and final.status == 499 or isinstance(final, Done)


def test_bad_requests(engine):
    ids = engine.encode_prompt(PROMPTS[0])
    for settings, n, param in [(SpeculativeSettings(temperature=-1.0), 5, "temperature"),
                               (SpeculativeSettings(top_p=1.5), 5, "top_p"), (SpeculativeSettings(top_k=-2), 5, "top_k"),
                               (SpeculativeSettings(), 0, "max_tokens"), (DecodeSettings(), 5, None)]:
        with pytest.raises(BadRequest) as err:
            engine.submit(JobRequest(ids, n, settings))
        assert err.value.param == param
    with pytest.raises(BadRequest) as err:
        engine.encode_prompt("[BOS] copy_long NOTAWORD [SEP]")
    assert err.value.param == "prompt"


def test_running_requests_take_turns_round_by_round(pair):
    """Requests are jobs of the one scheduler: each yields its turn after every round, so two long
    requests started together alternate rounds (first come, first served) and equal offline."""
    import greenlet

    target, tok = pair
    engine = SpeculativeBackend(target, tok, drafter=DRAFTER, name="tiny-ar", max_running=2)
    turns, yield_turn = [], engine.yield_turn

    def recorded() -> None:
        turns.append(id(greenlet.getcurrent()))
        yield_turn()

    engine.yield_turn = recorded
    try:
        with engine._cond:  # both queued before the loop takes either
            jobs = [engine.submit(JobRequest(engine.encode_prompt(p), 40, SpeculativeSettings())) for p in PROMPTS]
        for p, job in zip(PROMPTS, jobs):
            offline = dllm.speculative_generate(target, DRAFTER, [p], max_new_tokens=40, tokenizer=tok)
            assert job.result(120).text == offline.texts[0]
    finally:
        engine.close()
    both = min(turns.count(t) for t in set(turns))  # rounds while both ran
    assert len(set(turns)) == 2 and both >= 2
    assert all(a != b for a, b in zip(turns[:2 * both], turns[1:2 * both]))  # strictly alternating


def test_seeded_sampled_requests_equal_offline_under_load(pair, engine):
    """Sampled speculative requests with seeds (repeated across requests), sent together: each
    equals speculative_generate of its prompt alone with its seed."""
    target, tok = pair
    spec = [(PROMPTS[i % 2], (3, 5, 3)[i % 3]) for i in range(6)]
    with engine._cond:
        jobs = [engine.submit(JobRequest(engine.encode_prompt(p), 20, SpeculativeSettings(temperature=1.0, seed=seed)))
                for p, seed in spec]
    for (p, seed), job in zip(spec, jobs):
        offline = dllm.speculative_generate(target, DRAFTER, [p], max_new_tokens=20, tokenizer=tok,
                                            temperature=1.0, seed=seed)
        assert job.result(120).text == offline.texts[0]


def test_a_request_whose_tree_would_not_fit_the_targets_positions_is_refused(pair):
    """A tree plan's rounds need prompt + max_tokens + 1 + budget positions: a request that leaves no
    room for the tree is a 400 naming max_tokens, not a decode that fails with a 500."""
    from dllm.drafters.plan import Plan

    target, tok = pair
    plan = Plan(block_size=4, tree="ddtree:budget=8")
    engine = SpeculativeBackend(target, tok, drafter=DRAFTER, name="tiny-ar", plan=plan)
    try:
        ids = engine.encode_prompt(PROMPTS[0])
        room = engine.max_positions - len(ids) - 1 - 8  # the most max_tokens that leaves room for the tree
        with pytest.raises(BadRequest) as err:
            engine.submit(JobRequest(ids, room + 1, SpeculativeSettings()))
        assert err.value.param == "max_tokens" and "max_position_embeddings" in str(err.value)
        done = engine.submit(JobRequest(ids, 12, SpeculativeSettings())).result(60)
        offline = dllm.speculative_generate(target, DRAFTER, [PROMPTS[0]], max_new_tokens=12, tokenizer=tok,
                                            plan=plan)
        assert isinstance(done, Done) and done.text == offline.texts[0]
    finally:
        engine.close()


def test_a_tree_plan_on_a_sliding_window_target_is_refused_at_start(pair):
    """Such a target cannot verify a draft tree (``Target.check_tree``): the server refuses to start
    with that plan, instead of failing every request."""
    from dllm.drafters.dflash.io import random_dflash
    from dllm.drafters.plan import Plan
    from tests.drafters.speculative_helpers import tiny_target

    _, tok = pair
    target = tiny_target("qwen3", seed=2, use_sliding_window=True, sliding_window=5, max_window_layers=0)
    drafter = dllm.make_drafter("dflash", model=random_dflash(target.config, 1, 4, 100, seed=5))
    with pytest.raises(ValueError, match="sliding-window layers, which cannot verify the draft trees of 'ddtree:budget=6'"):
        SpeculativeBackend(target, tok, drafter=drafter, name="sw", plan=Plan(block_size=4, tree="ddtree:budget=6"))
