"""The ``failfast`` drafter (FailFast, arXiv 2512.20573): lossless at T = 0 (equal to transformers'
``generate`` on the 18 long-answer prompts of the shipped tiny target, 3 settings, and on random
Qwen3 / Llama targets, batch 1 and ragged batches) and at T > 0 (the end-to-end distribution test of
``test_distribution.py`` with ragged per-row draft lengths); its per-round draft lengths, tokens and
forwards equal the transcription of the authors' rule (``tests/reference/decoders/failfast_rule.py``)
on the same drafter logits; a draft is only as wide as its longest row; bad options are named."""

from __future__ import annotations

import itertools

import pytest
import torch

from dllm import tasks as T
from dllm.drafters.base import list_drafters, make_drafter
from dllm.drafters.failfast import extend_step
from dllm.drafters.loop import speculative_generate
from dllm.drafters.verify import SamplingParams
from dllm.models import tiny
from tests.drafters.test_distribution import E2E_N, E2E_NEW, E2E_TV, E2E_V, PROMPT, exact_target_distribution
from tests.drafters.speculative_helpers import hf_greedy, long_answer_prompts, null_tv, tiny_target, tv_distance
from tests.reference.decoders.failfast_rule import MASK, failfast_round

SETTINGS = {  # name -> (drafter options, plan)
    "paper": ({}, None),  # N = 10, N_max = 60, tau = 0.45 (the authors' defaults)
    "short-chunks": ({"first": 4, "chunk": 4, "max_draft": 12, "tau": 0.3}, None),
    "win-big-capped": ({"first": 1, "chunk": 6, "tau": 0.0}, 8),  # always extends, capped by the plan's B - 1
}


@pytest.fixture(scope="module")
def pair():
    """The shipped tiny target, its tokenizer and the tiny LLaDA drafter model."""
    from dllm.models import load
    from dllm.models.targets import load_target

    target, tok = load_target("tiny-ar")
    return target, tok, load("tiny-llada")


@pytest.fixture(scope="module")
def long_prompts(pair):
    """18 long-answer prompts (2 per task size), their budgets and transformers' greedy answers."""
    target, tok, _ = pair
    exs, prompts = long_answer_prompts(tok, per_size=2)
    budgets = [T.answer_length(ex.task, ex.size) for ex in exs]
    eos = target.generation_config.eos_token_id
    return prompts, budgets, [hf_greedy(target, p, n, eos=eos) for p, n in zip(prompts, budgets)]


def _record(drafter) -> list[dict]:
    """Every round's context and draft, recorded from the drafter's ``draft``."""
    rounds: list[dict] = []
    inner = drafter.draft

    def draft(ctx, eos):
        out = inner(ctx, eos)
        rounds.append({"tokens": [list(t) for t in ctx.tokens], "caps": drafter.caps(ctx), "width": out.tokens.shape[1],
                       "drafts": out.tokens.tolist(), "lengths": out.lengths.tolist(), "forwards": out.forwards})
        return out

    drafter.draft = draft
    return rounds


# ---- lossless at T = 0 ------------------------------------------------------------------------------
@pytest.mark.slow
@pytest.mark.parametrize("setting", list(SETTINGS))
def test_greedy_equals_transformers_on_the_long_answer_prompts(pair, long_prompts, setting):
    target, tok, model = pair
    options, plan = SETTINGS[setting]
    drafter = make_drafter("failfast", model=model, **options)
    rounds = _record(drafter)
    prompts, budgets, truth = long_prompts
    assert len(prompts) >= 15
    for p, n, want in zip(prompts, budgets, truth):
        out = speculative_generate(target, drafter, [p], max_new_tokens=n, tokenizer=tok, plan=plan)
        assert out.generated == [want]
    lengths = {n for r in rounds for n in r["lengths"]}
    assert len(lengths) > 2, f"the rule never varied the draft length: {lengths}"


@pytest.mark.slow
def test_ragged_batch_equals_each_prompt_alone(pair, long_prompts):
    target, tok, model = pair
    prompts, budgets, truth = long_prompts
    drafter = make_drafter("failfast", model=model, **SETTINGS["short-chunks"][0])
    rounds = _record(drafter)
    out = speculative_generate(target, drafter, prompts[::3], max_new_tokens=max(budgets), tokenizer=tok)
    for got, want in zip(out.generated, truth[::3]):
        assert got[:len(want)] == want
    assert any(len(set(r["lengths"])) > 1 for r in rounds), "rows of a round never drafted different lengths"


PROMPTS = [[5, 6, 7, 8, 9], [10, 11], [12, 13, 14, 15, 16, 17, 18, 19]]


@pytest.mark.parametrize("kind", ["qwen3", "llama"])
@pytest.mark.parametrize("fast_path", [True, False], ids=["fast", "general"])
def test_random_targets_batch_one_and_ragged(kind, fast_path):
    target = tiny_target(kind, seed=1)
    truth = [hf_greedy(target, p, 24) for p in PROMPTS]
    drafter = make_drafter("failfast", model=tiny("llada", seed=3), first=2, chunk=3, max_draft=8, tau=0.05)
    for p, want in zip(PROMPTS, truth):
        out = speculative_generate(target, drafter, [p], max_new_tokens=24, fast_path=fast_path)
        assert out.generated == [want]
        assert out.target_forwards == out.rounds + 1
    assert speculative_generate(target, drafter, PROMPTS, max_new_tokens=24).generated == truth


def test_fast_path_equals_the_general_loop_round_by_round(pair, long_prompts):
    target, tok, model = pair
    prompts, budgets, _ = long_prompts
    drafter = make_drafter("failfast", model=model, first=4, chunk=4, max_draft=12, tau=0.3)
    for p, n in list(zip(prompts, budgets))[::9]:
        a, b = (speculative_generate(target, drafter, [p], max_new_tokens=n, tokenizer=tok, fast_path=f)
                for f in (True, False))
        assert (a.generated, a.acceptance, a.drafter_forwards) == (b.generated, b.acceptance, b.drafter_forwards)


def test_the_round_forwards_only_what_was_drafted():
    target = tiny_target("qwen3", seed=1)
    drafter = make_drafter("failfast", model=tiny("llada", seed=3), first=2, chunk=2, max_draft=10, tau=0.05)
    rounds = _record(drafter)
    widths: list[int] = []
    hook = target.register_forward_pre_hook(lambda m, a, kw: widths.append(kw["input_ids"].shape[1]), with_kwargs=True)
    try:
        out = speculative_generate(target, drafter, PROMPTS, max_new_tokens=24, fast_path=False)
    finally:
        hook.remove()
    assert widths[1:] == [1 + r["width"] for r in rounds]  # after the prefill: the anchor + the widest row
    assert all(r["width"] == max(r["lengths"]) for r in rounds)
    assert out.drafter_forwards == sum(r["forwards"] for r in rounds)


# ---- the rule against the authors' ------------------------------------------------------------------
def _oracle(drafter, committed: list[int]):
    """``step_logits`` of the transcription: the drafter model's logits of a unit after the committed
    tokens and the drafted prefix (one forward, as the drafter's, the mask id excluded)."""
    model = drafter.model

    @torch.no_grad()
    def step_logits(prefix: list[int], unit: list[int]) -> torch.Tensor:
        ids = drafter.context(committed + prefix, len(unit)) + [model.mask_id if t == MASK else t for t in unit]
        x = torch.tensor([ids])
        logits = model(x, key_padding_mask=torch.ones_like(x, dtype=torch.bool)).logits[0, -len(unit):].float()
        logits[:, model.mask_id] = float("-inf")
        return logits

    return step_logits


RULES = [{}, {"first": 4, "chunk": 4, "max_draft": 12, "tau": 0.3},
         {"first": 2, "chunk": 2, "max_draft": 6, "tau": 0.6}]


@pytest.mark.parametrize("options", RULES, ids=["paper", "n4-max12", "n2-max6"])
def test_round_lengths_equal_the_transcription(pair, long_prompts, options):
    """Each round's draft (length, tokens, forwards) equals the authors' rule on the same logits, with
    one forward per chunk (their Fast-dLLM threshold at 0: every position committed by its forward)."""
    target, tok, model = pair
    drafter = make_drafter("failfast", model=model, **options)
    cfg = drafter.config
    rounds = _record(drafter)
    prompts, _, _ = long_prompts
    for p in prompts[::6]:
        speculative_generate(target, drafter, [p], max_new_tokens=150, tokenizer=tok)
    eos = target.generation_config.eos_token_id
    # near max_new_tokens a round's cap is the tokens left; the authors' cap is reached in whole chunks
    # (it may overshoot one that is not), so compare the rounds whose cap is first + a whole number of chunks
    full = [r for r in rounds if r["caps"][0] >= cfg.first and (r["caps"][0] - cfg.first) % cfg.chunk == 0]
    assert len(full) >= 0.5 * len(rounds)
    for r in full:
        want, spec_len, forwards = failfast_round(
            _oracle(drafter, r["tokens"][0]), spec_len=cfg.first, incr_len=cfg.chunk, max_spec_len=r["caps"][0],
            lowconf_threshold=cfg.tau, threshold=0.0, stop_token=eos)
        n = r["lengths"][0]
        assert (r["drafts"][0][:n], n, r["forwards"]) == (want, len(want), forwards)
    assert len({r["lengths"][0] for r in full}) > 1, "the rule never varied the draft length"


def test_one_forward_per_chunk_decides_as_the_authors_threshold(pair, long_prompts):
    """With the authors' Fast-dLLM threshold 0.05 a position left masked has confidence <= 0.05 < tau,
    so every round stops at the same length as with one forward per chunk (no stop token involved)."""
    target, tok, model = pair
    drafter = make_drafter("failfast", model=model, first=4, chunk=4, max_draft=12, tau=0.3)
    rounds = _record(drafter)
    speculative_generate(target, drafter, [long_prompts[0][4]], max_new_tokens=60, tokenizer=tok)
    for r in rounds:
        oracle = _oracle(drafter, r["tokens"][0])
        lengths = [failfast_round(oracle, spec_len=4, incr_len=4, max_spec_len=12, lowconf_threshold=0.3,
                                  threshold=t)[1] for t in (0.0, 0.05)]
        assert lengths[0] == lengths[1]


def test_extend_step():
    eos = frozenset({2})
    assert extend_step([5, 6], [0.9, 0.5], 0, 10, 0.5, eos) == (2, True)  # a confidence equal to tau extends
    assert extend_step([5, 6], [0.9, 0.49], 0, 10, 0.5, eos) == (2, False)  # fail fast
    assert extend_step([5, 6], [0.9, 0.9], 8, 10, 0.5, eos) == (2, False)  # the cap
    assert extend_step([5, 2, 6], [0.9, 0.9, 0.9], 0, 10, 0.5, eos) == (2, False)  # cut after the EOS


# ---- T > 0 ------------------------------------------------------------------------------------------
@pytest.mark.slow
def test_sampling_distribution_matches_the_target():
    """As ``test_distribution.py``'s end-to-end test (TV < 0.03 over the 512 outputs of 4e4 rows),
    with per-row draft lengths 1 or 2 decided by the rule (tau at the drafter's median confidence)."""
    target = tiny_target(vocab=E2E_V, hidden=32, eos=None, init=0.1, seed=3)
    model = tiny("llada", tokenizer=False, vocab_size=E2E_V, mask_id=E2E_V - 1, pad_id=0, eos_id=1, eot_id=1, bos_id=2,
                 seed=5)
    drafter = make_drafter("failfast", model=model, first=1, chunk=1, max_draft=2, tau=0.8)
    rounds = _record(drafter)
    params = SamplingParams(0.9, top_k=6, top_p=0.95)
    out = speculative_generate(target, drafter, [PROMPT] * E2E_N, max_new_tokens=E2E_NEW, temperature=0.9, top_k=6,
                               top_p=0.95, seed=11)
    gen = torch.tensor(out.generated)  # [N, 3]
    index = (gen * torch.tensor([E2E_V ** 2, E2E_V, 1])).sum(1)
    exact = exact_target_distribution(target, params)
    tv = tv_distance(torch.bincount(index, minlength=E2E_V ** E2E_NEW), exact)
    assert null_tv(exact, E2E_N) < 0.75 * E2E_TV
    assert tv < E2E_TV, f"TV {tv:.4f} >= {E2E_TV} (noise alone ~{null_tv(exact, E2E_N):.4f})"
    assert out.tau > 1.0
    assert {1, 2} <= set(itertools.chain.from_iterable(r["lengths"] for r in rounds))


# ---- options ----------------------------------------------------------------------------------------
def test_registered_with_the_paper_defaults():
    assert "failfast" in dict(list_drafters())
    drafter = make_drafter("failfast", model=tiny("llada", seed=3))
    cfg = drafter.config
    assert (cfg.first, cfg.chunk, cfg.max_draft, cfg.tau) == (10, 10, 60, 0.45)
    assert drafter.block_size == 61


@pytest.mark.parametrize("options, error, match", [
    ({"nope": 1}, TypeError, r"Unknown option\(s\) 'nope' for drafter 'failfast'. Valid options: model, first, chunk"),
    ({"chunk": 0}, ValueError, r"chunk must be an integer >= 1"),
    ({"first": 1.5}, ValueError, r"first must be an integer >= 1"),
    ({"max_draft": 4}, ValueError, r"first \(10\) must not exceed max_draft \(4\)"),
    ({"tau": 1.5}, ValueError, r"tau must be a number in \[0, 1\]"),
    ({"quantization": "int3"}, ValueError, r"int3"),
])
def test_bad_options_are_named(options, error, match):
    with pytest.raises(error, match=match):
        make_drafter("failfast", model=tiny("llada", seed=3), **options)


def test_needs_a_diffusion_model():
    with pytest.raises(ValueError, match="the failfast drafter needs a diffusion model"):
        make_drafter("failfast")
    with pytest.raises(TypeError, match="the failfast drafter's model must be a dllm DiffusionLM"):
        make_drafter("failfast", model=torch.nn.Linear(2, 2))
    with pytest.raises(KeyError, match="Unknown drafter 'fail_fast'. Valid drafters: .*failfast"):
        make_drafter("fail_fast")
