"""KLASS (``klass``): KL stability over H steps plus confidence, on hand-built step sequences, end to
end on tiny models, and on the exact-posterior oracle."""

import math
from types import SimpleNamespace

import pytest
import torch

import dllm
import dllm.samplers.klass  # noqa: F401  (registers "klass")
from dllm import tasks as T
from dllm.models import tiny
from dllm.models.oracle import OracleLM, oracle_prompts, score_generation
from dllm.samplers import make_sampler
from dllm.samplers.klass import EXTRAS_KEY, kl_divergence
from dllm.state import StepInput

MASK, V = 9, 10


def _dist(top, tok):
    row = [(1 - top) / (V - 2)] * V
    row[tok], row[MASK] = top, 1e-30
    return row


def _logits(rows):
    return torch.log(torch.tensor(rows, dtype=torch.float64)).float()[None]  # [1, W, V]


def _input(logits, active=None, step=0):
    bsz, width, _ = logits.shape
    active = torch.ones(bsz, width, dtype=torch.bool) if active is None else torch.tensor(active)
    return StepInput(logits=logits, tokens=torch.full((bsz, width), MASK), active=active, query_start=0,
                     window=(0, width), step=step, steps=None, mask_id=MASK, temperature=0.0, generator=None)


def _run(sampler, logit_seq, active_seq=None):
    """Feed a sequence of steps to one block; return the commit rows."""
    state = SimpleNamespace(extras={})
    sampler.begin_block(state)
    commits = []
    for i, logits in enumerate(logit_seq):
        active = None if active_seq is None else active_seq[i]
        commits.append(sampler.step(_input(logits, active, i), state).commit[0].tolist())
    return commits


def test_kl_divergence():
    p = torch.tensor([0.5, 0.25, 0.25, 0.0], dtype=torch.float64)
    q = torch.tensor([0.25, 0.25, 0.25, 0.25], dtype=torch.float64)
    assert kl_divergence(p.log(), q.log()).item() == pytest.approx(0.5 * math.log(2))
    assert kl_divergence(p.log(), p.log()).item() == 0  # p = 0 terms count 0, not nan
    assert kl_divergence(q.log(), p.log()).item() == math.inf  # q > 0 where p = 0


# ---- the rule -----------------------------------------------------------------------------------------
def test_stable_confident_positions_wait_h_steps_then_commit_together():
    logits = _logits([_dist(0.95, 1), _dist(0.9, 2), _dist(0.5, 3), _dist(0.7, 4)])
    sampler = make_sampler("klass")  # tau_conf 0.6, kappa 0.015, H 2
    commits = _run(sampler, [logits] * 3)
    # steps 0 and 1: no KL history yet -> the most confident one (the fallback); step 2: every
    # position stable for 2 steps with c > 0.6 (not 0.5)
    assert commits[0] == [True, False, False, False]
    assert commits[1] == [True, False, False, False]
    assert commits[2] == [True, True, False, True]


def test_history_one_is_ready_one_step_earlier():
    logits = _logits([_dist(0.95, 1), _dist(0.9, 2), _dist(0.7, 3)])
    commits = _run(make_sampler("klass", history=1), [logits] * 2)
    assert commits == [[True, False, False], [True, True, True]]


def test_a_moving_distribution_is_not_ready_and_the_fallback_is_the_top_one():
    a = _logits([_dist(0.9, 1), _dist(0.95, 2), _dist(0.8, 3)])
    b = _logits([_dist(0.9, 1), _dist(0.95, 2), _dist(0.8, 5)])  # position 2 changes its mind
    commits = _run(make_sampler("klass"), [a, a, b], active_seq=[None, None, [[True, False, True]]])
    assert commits[2] == [True, False, False]  # 0 is stable and confident; 2 moved; 1 is not active
    commits = _run(make_sampler("klass"), [a, a, b], active_seq=[None, None, [[False, False, True]]])
    assert commits[2] == [False, False, True]  # nothing ready: the fallback commits the top-1


def test_confidence_threshold_is_strict():
    logits = _logits([_dist(0.95, 1), _dist(0.7, 2)])
    c = torch.softmax(logits.double(), -1)[0, 1].max().item()
    commits = _run(make_sampler("klass", conf_threshold=c), [logits] * 3)
    assert commits[2] == [True, False]


def test_begin_block_forgets_the_previous_distributions():
    logits = _logits([_dist(0.95, 1), _dist(0.9, 2)])
    sampler = make_sampler("klass", history=1)
    state = SimpleNamespace(extras={})
    sampler.begin_block(state)
    sampler.step(_input(logits), state)
    assert state.extras[EXTRAS_KEY][0].shape == (1, 2, V)
    sampler.begin_block(state)
    assert state.extras[EXTRAS_KEY] is None
    assert sampler.step(_input(logits), state).commit[0].tolist() == [True, False]  # a first step again


@pytest.mark.parametrize("unmask,expected", [("all", [True, True, True]), ("max_conf", [False, True, False]),
                                             ("min_kl", [True, False, False])])
def test_unmask_modes(unmask, expected):
    a = _logits([_dist(0.90, 1), _dist(0.99, 2), _dist(0.8, 3)])
    b = _logits([_dist(0.90, 1), _dist(0.98, 2), _dist(0.79, 3)])  # 0 unchanged (KL 0), 1 and 2 drift a little
    commits = _run(make_sampler("klass", unmask=unmask, history=1), [a, b])
    assert commits[1] == expected


def test_inactive_rows_commit_nothing_and_the_mask_is_never_proposed():
    row = _dist(0.8, MASK)
    row[4] = 0.15
    logits = _logits([row, _dist(0.9, 2)]).repeat(2, 1, 1)
    state = SimpleNamespace(extras={})
    sampler = make_sampler("klass")
    sampler.begin_block(state)
    inp = _input(logits)
    inp.active = torch.tensor([[True, True], [False, False]])
    out = sampler.step(inp, state)
    assert out.tokens[0].tolist() == [4, 2]
    assert out.commit.tolist() == [[False, True], [False, False]]


@pytest.mark.parametrize("options,match", [
    (dict(conf_threshold=1.0), r"conf_threshold must be in \[0, 1\), got 1.0"),
    (dict(conf_threshold=-0.1), r"conf_threshold must be in \[0, 1\), got -0.1"),
    (dict(kl_threshold=0), r"kl_threshold must be > 0, got 0"),
    (dict(history=0), r"history must be an integer >= 1, got 0"),
    (dict(history=2.0), r"history must be an integer >= 1, got 2.0"),
    (dict(unmask="random"), r"unmask must be one of 'all', 'max_conf', 'min_kl', got 'random'"),
])
def test_out_of_range(options, match):
    with pytest.raises(ValueError, match=match):
        make_sampler("klass", **options)


# ---- end to end -------------------------------------------------------------------------------------
@pytest.fixture(scope="module", params=["llada", "dream"])
def model(request):
    return tiny(request.param, seed=0)


def _ids(model, n, offset):
    special = {model.mask_id, model.eos_id, model.eot_id, model.pad_id, model.bos_id}
    pool = [t for t in range(model.config.vocab_size) if t not in special]
    return [pool[(offset + 7 * i) % len(pool)] for i in range(n)]


@pytest.mark.parametrize("options", [{}, dict(conf_threshold=0.0, kl_threshold=1.0, history=1)])
def test_batch_of_ragged_prompts_finishes_and_equals_each_prompt_alone(model, options):
    prompts = [_ids(model, 3, 1), _ids(model, 8, 2), _ids(model, 5, 3)]
    kw = dict(sampler="klass", gen_length=8, block_length=4, **options)
    batch = dllm.generate(model, prompts, **kw)
    assert (batch.generated != model.mask_id).all() and batch.nfe <= 8
    for j, p in enumerate(prompts):
        assert torch.equal(batch.generated[j], dllm.generate(model, [p], **kw).generated[0]), j


@pytest.mark.parametrize("history", [1, 2, 3])
def test_with_no_bar_every_block_takes_h_plus_one_forwards(model, history):
    # kappa huge, tau_conf 0: every position is ready as soon as it has H KLs, i.e. at block step H
    out = dllm.generate(model, [_ids(model, 4, 0)], sampler="klass", conf_threshold=0.0, kl_threshold=1e9,
                        history=history, gen_length=12, block_length=6, return_trace=True)
    assert out.nfe == 2 * (history + 1)
    first = out.trace[0, :6].tolist()
    assert sorted(first) == list(range(history)) + [history] * (6 - history)


def test_sampling_is_reproducible_under_a_seed(model):
    kw = dict(sampler="klass", gen_length=8, temperature=1.0)
    a = dllm.generate(model, [_ids(model, 4, 0)], seed=5, **kw)
    b = dllm.generate(model, [_ids(model, 4, 0)], seed=5, **kw)
    assert torch.equal(a.sequences, b.sequences) and (a.generated != model.mask_id).all()


# ---- the exact-posterior oracle ------------------------------------------------------------------------
@pytest.fixture(scope="module")
def oracle():
    return OracleLM()


@pytest.mark.parametrize("task", ["copy", "reverse"])
def test_single_answer_tasks_need_h_plus_one_forwards_per_block(oracle, task):
    # one valid answer: every marginal is one-hot and never moves (KL = 0, c = 1), so each block
    # commits one token at steps 0 .. H-1 and the rest at step H
    exs = T.test_split(task, 8, 6)
    g = T.answer_length(task, 8)  # 9: eight words and the EOS
    out = dllm.generate(oracle, oracle_prompts(exs), sampler="klass", gen_length=g, block_length=5,
                        return_trace=True)
    assert all(score_generation(exs, out))
    assert out.nfe == 3 + 3 < g
    assert sorted(out.trace[0, :5].tolist()) == [0, 1, 2, 2, 2]
