"""``dllm.eval.harness.likelihood`` and the harness's ``loglikelihood``: LLaDA's Monte-Carlo estimate."""

import pytest
import torch

pytest.importorskip("lm_eval")

from lm_eval.api.instance import Instance  # noqa: E402

from dllm import tasks as T  # noqa: E402
from dllm.eval.harness import DllmLM  # noqa: E402
from dllm.eval.harness.likelihood import (  # noqa: E402
    LikelihoodConfig, MonteCarloLikelihood, mask_counts, request_seed, rolling_windows,
)
from dllm.models import load  # noqa: E402


@pytest.fixture(scope="module")
def llada():
    return load("tiny-llada", dtype="float32")


@torch.no_grad()
def direct_estimate(model, ctx, ans, mc_num, b, seed, cfg_scale=0.0) -> float:
    """The estimator written out copy by copy, as upstream's loop reads (ML-GSAI/LLaDA
    ``get_log_likelihood.py``), drawing the same random numbers in the same order."""
    g = torch.Generator().manual_seed(request_seed(seed, ctx, ans))
    t, total = len(ans), 0.0
    for _ in range(mc_num // b):
        k = int(torch.randint(1, t + 1, (), generator=g))
        counts = [(round(k + j * t / b) - 1) % t + 1 for j in range(b)]
        order = torch.rand(b, t, generator=g).argsort(dim=1)
        batch = 0.0
        for j in range(b):
            x = torch.tensor([ctx + ans])
            masked = order[j, :counts[j]] + len(ctx)
            x[0, masked] = model.mask_id
            logits = model(x).logits[0]
            if cfg_scale > 0:
                un = x.clone()
                un[0, :len(ctx)] = model.mask_id
                un_logits = model(un).logits[0]
                logits = un_logits + (cfg_scale + 1) * (logits - un_logits)
            logp = torch.log_softmax(logits, dim=-1)
            nll = -sum(float(logp[i, x0]) for i, x0 in enumerate(ctx + ans) if i in set(masked.tolist()))
            batch += nll * t / counts[j]
        total += batch / b
    return -total / (mc_num // b)


@pytest.mark.parametrize("cfg_scale", [0.0, 0.5])
def test_estimate_matches_the_direct_computation(llada, cfg_scale):
    ex = T.test_split("reverse", 4, n=1)[0]
    ctx, ans = T.prompt_ids(ex), [T.word_id(w) for w in T.target_words(ex)]
    est = MonteCarloLikelihood(LikelihoodConfig(mc_num=8, batch_size=4, cfg_scale=cfg_scale, seed=3))
    got = est.estimate(llada, ctx, ans)
    assert got == pytest.approx(direct_estimate(llada, ctx, ans, 8, 4, 3, cfg_scale), abs=1e-4)
    assert got < 0


def test_one_token_answers_are_exact(llada):
    ex = T.test_split("copy", 4, n=1)[0]
    ctx, tok = T.prompt_ids(ex), T.word_id(ex.answer[0])
    x = torch.tensor([ctx + [llada.mask_id]])
    with torch.no_grad():
        exact = float(torch.log_softmax(llada(x).logits[0, -1], dim=-1)[tok])
    for mc_num in (1, 128):
        got = MonteCarloLikelihood(LikelihoodConfig(mc_num=mc_num)).estimate(llada, ctx, [tok])
        assert got == pytest.approx(exact, abs=1e-5)


def test_mask_counts_cover_the_answer_evenly():
    assert mask_counts(1, 4, 8).tolist() == [1, 3, 5, 7]
    assert mask_counts(7, 4, 8).tolist() == [7, 1, 3, 5]  # wrapped into [1, t]
    assert mask_counts(3, 1, 5).tolist() == [3]
    for k in range(1, 6):
        assert set(mask_counts(k, 5, 5).tolist()) == {1, 2, 3, 4, 5}
    assert LikelihoodConfig(mc_num=128, batch_size=5).mc_batch == 4
    assert LikelihoodConfig(mc_num=1, batch_size=8).mc_batch == 1


def _ll(ctx: str, cont: str) -> Instance:
    return Instance("loglikelihood", {}, (ctx, cont), 0)


def _answer_pairs(tasks=("copy", "reverse")) -> list[Instance]:
    """(correct, wrong) continuations: the EOS-padded answer, and the same with two items swapped."""
    reqs = []
    for task in tasks:
        for ex in T.test_split(task, None, n=1):
            good = list(T.target_words(ex))
            bad = [good[1], good[0], *good[2:]]
            ctx = " ".join(T.prompt_words(ex))
            reqs += [_ll(ctx, " " + " ".join(good)), _ll(ctx, " " + " ".join(bad))]
    return reqs


@pytest.mark.parametrize("name", ["tiny-llada", "tiny-dream"])
def test_trained_model_ranks_the_correct_answer_first(name):
    """A C = 0 task has one answer; the trained model must prefer it to a near miss, and find it greedy.
    Dream reads position i from the hidden state at i - 1: the same estimator holds for it."""
    lm = DllmLM(pretrained=name, dtype="float32", device="cpu", mc_num=16, batch_size=8)
    res = lm.loglikelihood(_answer_pairs())
    for (good, good_greedy), (bad, bad_greedy) in zip(res[::2], res[1::2]):
        assert good > bad + 1.0
        assert good_greedy and not bad_greedy


def test_estimates_are_reproducible_and_order_free(llada):
    reqs = _answer_pairs(("sort",))
    lm = DllmLM(pretrained="tiny-llada", dtype="float32", device="cpu", mc_num=8, batch_size=4, seed=1,
                check_greedy=False)
    first = lm.loglikelihood(reqs)
    assert lm.loglikelihood(reqs) == first
    assert lm.loglikelihood(reqs[::-1]) == first[::-1]  # per-request seeds: order and sharding do not matter
    assert all(greedy is False for _, greedy in first)
    other = DllmLM(pretrained="tiny-llada", dtype="float32", device="cpu", mc_num=8, batch_size=4, seed=2,
                   check_greedy=False).loglikelihood(reqs)
    assert [a for a, _ in other] != [a for a, _ in first]


def test_encoding_empty_context_and_rolling(llada):
    lm = DllmLM(pretrained="tiny-llada", dtype="float32", device="cpu", mc_num=4, batch_size=4, max_length=6)
    assert lm.encode_pair("", "A B") == ([T.word_id(T.BOS)], [T.word_id("A"), T.word_id("B")])
    assert lm.encode_pair("copy A ", "B") == ([T.word_id(T.BOS), T.word_id("copy"), T.word_id("A")],
                                               [T.word_id("B")])
    text = "A B C D E F G H I J"
    ids = lm.tok_encode(text)
    windows = rolling_windows(ids, lm.prefix_token_id, 6)
    assert [t for _, a in windows for t in a] == ids and all(len(c) + len(a) <= 6 and c for c, a in windows)
    (rolled,) = lm.loglikelihood_rolling([Instance("loglikelihood_rolling", {}, (text,), 0)])
    assert rolled == pytest.approx(sum(lm.likelihood.estimate(llada, c, a) for c, a in windows))
    assert rolling_windows(ids[:3], 2, 6) == [([2], ids[:3])]  # a text that fits is one window


def test_shifted_family_needs_a_context_token():
    dream = load("tiny-dream", dtype="float32")
    with pytest.raises(ValueError, match="needs at least one context token"):
        MonteCarloLikelihood(LikelihoodConfig(mc_num=1)).estimate(dream, [], [T.word_id("A")])


@torch.no_grad()
def test_a_block_causal_estimate_is_the_block_diffusion_bound():
    """SDAR-style block-causal model: the bound sums each grid block given the clean blocks before it.
    With blocks of one token it is exact, the chain rule: log p(a_i | c, a_<i) from one forward of the
    sequence up to a_i with a_i masked. (Masking the whole answer at once, as for LLaDA, let each
    token be predicted from masked earlier answer tokens instead.)"""
    from dllm.models import tiny

    model = tiny("sdar", block_size=1, seed=3)
    ctx, ans = [5, 9, 12], [20, 21, 22, 23]
    want = 0.0
    for i, tok in enumerate(ans):
        x = torch.tensor([ctx + ans[:i] + [model.mask_id]])
        want += float(torch.log_softmax(model(x).logits[0, -1], dim=-1)[tok])
    got = MonteCarloLikelihood(LikelihoodConfig(mc_num=4, batch_size=2)).estimate(model, ctx, ans)
    assert got == pytest.approx(want, abs=1e-4)
