"""The verification functions on hand-made cases, and the target distribution against transformers'
own warpers."""

import pytest
import torch

from dllm.drafters.verify import (
    SamplingParams,
    greedy_verify,
    next_tokens,
    speculative_verify,
    target_probs,
    verify,
    warp_logits,
)

V = 6


def onehot(tokens, v=V):
    """[..., ] ids -> [..., V] one-hot float rows."""
    t = torch.as_tensor(tokens)
    return torch.nn.functional.one_hot(t, v).float()


# ---- greedy --------------------------------------------------------------------------------------
def test_greedy_prefix_and_bonus():
    draft = torch.tensor([[1, 2, 3],   # all match -> 3 accepted, bonus = target[3]
                          [1, 2, 3],   # mismatch at 1 -> 1 accepted, next = target[1]
                          [4, 2, 3]])  # mismatch at 0 -> 0 accepted, next = target[0]
    target = torch.tensor([[1, 2, 3, 5],
                           [1, 0, 3, 5],
                           [1, 2, 3, 5]])
    acc, nxt = greedy_verify(draft, target)
    assert acc.tolist() == [3, 1, 0]
    assert nxt.tolist() == [5, 0, 1]


def test_greedy_lengths_cut_the_draft():
    draft = torch.tensor([[1, 2, 3], [1, 2, 3]])
    target = torch.tensor([[1, 2, 3, 5], [1, 2, 3, 5]])
    acc, nxt = greedy_verify(draft, target, lengths=torch.tensor([2, 0]))
    assert acc.tolist() == [2, 0] and nxt.tolist() == [3, 1]


def test_greedy_empty_draft_is_plain_decoding():
    acc, nxt = greedy_verify(torch.empty((2, 0), dtype=torch.long), torch.tensor([[4], [5]]))
    assert acc.tolist() == [0, 0] and nxt.tolist() == [4, 5]


def test_greedy_shape_error_names_shapes():
    with pytest.raises(ValueError, match=r"\[B, K \+ 1\] = \[1, 3\]"):
        greedy_verify(torch.zeros((1, 2), dtype=torch.long), torch.zeros((1, 2), dtype=torch.long))


# ---- speculative sampling, one-hot drafts ----------------------------------------------------------
def test_one_hot_full_acceptance_draws_the_bonus_from_p_at_K():
    draft = torch.tensor([[1, 2]])
    p = onehot([[1, 2, 4]])  # the target is certain of both drafts; p at K says 4
    for seed in range(20):
        acc, nxt = speculative_verify(draft, p, generator=torch.Generator().manual_seed(seed))
        assert acc.item() == 2 and nxt.item() == 4


def test_one_hot_rejection_draws_from_the_residual():
    """p(d_1) = 0: always rejected, and the token comes from p without d_1 (never d_1)."""
    draft = torch.tensor([[3, 2]] * 4000)
    p1 = torch.tensor([0.0, 0.5, 0.25, 0.0, 0.25, 0.0])
    p = torch.stack([p1, onehot(2), onehot(0)]).expand(4000, 3, V)
    acc, nxt = speculative_verify(draft, p, generator=torch.Generator().manual_seed(0))
    assert (acc == 0).all()
    freq = torch.bincount(nxt, minlength=V).float() / 4000
    assert freq[3] == 0 and torch.allclose(freq, p1, atol=0.03)


def test_one_hot_partial_acceptance_removes_the_draft_from_the_residual():
    """p(d) = 0.6: accepted 60% of the time; on rejection the token is never d, and the others keep
    their relative weights (residual = p without d, renormalised)."""
    n = 20000
    p1 = torch.tensor([0.6, 0.3, 0.1, 0.0, 0.0, 0.0])
    p = torch.stack([p1, onehot(5)]).expand(n, 2, V)
    acc, nxt = speculative_verify(torch.zeros((n, 1), dtype=torch.long), p, generator=torch.Generator().manual_seed(1))
    assert abs(acc.float().mean().item() - 0.6) < 0.015
    rejected = nxt[acc == 0]
    assert (rejected != 0).all()
    assert abs((rejected == 1).float().mean().item() - 0.75) < 0.02
    assert (nxt[acc == 1] == 5).all()  # accepted: the bonus from p at K


# ---- speculative sampling, full draft distributions ----------------------------------------------
def test_q_equal_p_is_always_accepted():
    g = torch.Generator().manual_seed(2)
    p = torch.rand((500, 4, V), generator=g).softmax(-1)
    q = p[:, :3].clone()
    draft = torch.multinomial(q.reshape(-1, V), 1, generator=g).view(500, 3)
    acc, _ = speculative_verify(draft, p, q, generator=g)
    assert (acc == 3).all()


def test_q_rejection_uses_max_p_minus_q():
    """Draft mass where p has none is always rejected; the residual is norm(max(0, p - q))."""
    n = 20000
    p1 = torch.tensor([0.5, 0.5, 0.0, 0.0, 0.0, 0.0])
    q1 = torch.tensor([0.5, 0.0, 0.5, 0.0, 0.0, 0.0])
    p = torch.stack([p1, onehot(4)]).expand(n, 2, V)
    q = q1.expand(n, 1, V)
    g = torch.Generator().manual_seed(3)
    draft = torch.multinomial(q1, n, replacement=True, generator=g)[:, None]
    acc, nxt = speculative_verify(draft, p, q, generator=g)
    assert (acc[draft[:, 0] == 2] == 0).all()  # p(2) = 0
    assert (acc[draft[:, 0] == 0] == 1).all()  # p(0) / q(0) = 1
    assert (nxt[acc == 0] == 1).all()  # residual max(0, p - q) = onehot(1)
    emitted = torch.where(acc == 1, draft[:, 0], nxt)
    freq = torch.bincount(emitted, minlength=V).float() / n
    assert torch.allclose(freq, p1, atol=0.02)  # the first emitted token is distributed as p


def test_empirical_acceptance_matches_theory():
    """Acceptance at the first position: sum min(p, q) for soft drafts, p(d) for one-hot drafts."""
    n = 40000
    g = torch.Generator().manual_seed(4)
    p = torch.rand((1, 2, V), generator=g).mul(3).softmax(-1).expand(n, 2, V)
    q = torch.rand((1, 1, V), generator=g).mul(3).softmax(-1).expand(n, 1, V)
    draft = torch.multinomial(q[0, 0], n, replacement=True, generator=g)[:, None]
    acc, _ = speculative_verify(draft, p, q, generator=g)
    expected = torch.minimum(p[0, 0], q[0, 0]).sum().item()
    assert abs(acc.float().mean().item() - expected) < 0.012
    fixed = torch.full((n, 1), 2, dtype=torch.long)
    acc1, _ = speculative_verify(fixed, p, generator=g)
    assert abs(acc1.float().mean().item() - p[0, 0, 2].item()) < 0.012


def test_shape_errors():
    with pytest.raises(ValueError, match="p must be"):
        speculative_verify(torch.zeros((2, 3), dtype=torch.long), torch.rand(2, 3, V))
    with pytest.raises(ValueError, match="q must be"):
        speculative_verify(torch.zeros((2, 3), dtype=torch.long), torch.rand(2, 4, V), torch.rand(2, 3, V + 1))


def test_verify_dispatches_on_temperature():
    draft = torch.tensor([[1, 2]])
    logits = torch.full((1, 3, V), -5.0)
    logits[0, 0, 1] = logits[0, 1, 2] = logits[0, 2, 3] = 5.0
    acc, nxt = verify(draft, logits, SamplingParams())
    assert acc.item() == 2 and nxt.item() == 3
    acc, nxt = verify(draft, logits, SamplingParams(temperature=1.0, top_k=1), generator=torch.Generator().manual_seed(0))
    assert acc.item() == 2 and nxt.item() == 3  # top-1 sampling is greedy


# ---- the target distribution -----------------------------------------------------------------------
@pytest.mark.parametrize("t,k,p", [(1.0, 0, 1.0), (0.7, 0, 1.0), (1.3, 5, 1.0), (0.8, 0, 0.9), (0.6, 7, 0.8),
                                   (2.0, 50, 0.3), (1.0, 1, 1.0), (0.9, 3, 0.05)])
def test_warp_logits_equals_transformers_warpers(t, k, p):
    """Exactly transformers' processors for do_sample=True, in generate's order."""
    from transformers import LogitsProcessorList, TemperatureLogitsWarper, TopKLogitsWarper, TopPLogitsWarper

    procs = LogitsProcessorList()
    if t != 1.0:
        procs.append(TemperatureLogitsWarper(t))
    if k != 0:
        procs.append(TopKLogitsWarper(top_k=k))
    if p < 1.0:
        procs.append(TopPLogitsWarper(top_p=p))
    logits = torch.randn((4, 37), generator=torch.Generator().manual_seed(int(t * 10 + k)))
    logits[0, :5] = logits[0, 5]  # ties at the cut-offs
    ours = warp_logits(logits, SamplingParams(t, k, p))
    theirs = procs(torch.zeros((4, 1), dtype=torch.long), logits.clone())
    assert torch.equal(ours, theirs)
    assert torch.equal(target_probs(logits, SamplingParams(t, k, p)), theirs.softmax(-1))
    assert torch.equal(warp_logits(logits[None], SamplingParams(t, k, p))[0], theirs)  # [..., V] batched


def test_greedy_target_probs_is_the_argmax_one_hot():
    logits = torch.randn(3, 5, V)
    probs = target_probs(logits, SamplingParams())
    assert torch.equal(probs.argmax(-1), logits.argmax(-1)) and torch.equal(probs.sum(-1), torch.ones(3, 5))
    assert torch.equal(next_tokens(logits, SamplingParams()), logits.argmax(-1))


@pytest.mark.parametrize("t", [1e-300, 1e-40, 1e-6])
def test_a_temperature_too_small_to_divide_by_is_greedy(t):
    """Below GREEDY_BELOW (vLLM's 1e-5) the target is greedy: logits / 1e-40 overflow float32 and the
    softmax of infinities is NaN, which drew id 0 (a pad) before."""
    logits = torch.randn(3, 5, V) * 10
    params = SamplingParams(t)
    assert params.greedy and not SamplingParams(1e-5).greedy
    assert torch.equal(target_probs(logits, params), target_probs(logits, SamplingParams()))
    assert torch.equal(next_tokens(logits, params), logits.argmax(-1))


def test_sampling_params_errors():
    with pytest.raises(ValueError, match="temperature must be"):
        SamplingParams(temperature=-1.0)
    with pytest.raises(ValueError, match="top_k must be an integer >= 0"):
        SamplingParams(1.0, top_k=-1)
    with pytest.raises(ValueError, match=r"top_p must be a number in \(0, 1\]"):
        SamplingParams(1.0, top_p=0.0)
