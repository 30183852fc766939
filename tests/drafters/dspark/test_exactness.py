"""T > 0 exactness of ``dspark`` (Markov-head drafts sampled from the corrected, warped distribution,
verified with min(1, p/q)) and of ``scheduled`` dflash, by the end-to-end check of
``tests/drafters/test_distribution.py``: 4e4 rows of one prompt, the histogram of the 512 possible
3-token outputs against the target's exact distribution (TV < 0.03; noise alone ~0.022). Verify
lengths that depend on the drafted tokens must not bias the output: the policies here cut often."""

import pytest
import torch

from dllm.drafters.base import make_drafter
from dllm.drafters.dflash.io import random_dflash
from dllm.drafters.dspark.io import random_dspark
from dllm.drafters.dspark.model import DSparkHeads
from dllm.drafters.loop import speculative_generate
from dllm.drafters.plan import Plan
from dllm.drafters.verify import SamplingParams
from tests.drafters.speculative_helpers import null_tv, tiny_target, tv_distance
from tests.drafters.test_distribution import E2E_N, E2E_NEW, E2E_TV, E2E_V, PROMPT, exact_target_distribution


@pytest.fixture(scope="module")
def small_target():
    return tiny_target(vocab=E2E_V, hidden=32, eos=None, init=0.1, seed=3)


def dspark(target, kind, policy):
    heads = DSparkHeads(markov_rank=4, markov_head_type=kind, enable_confidence_head=True,
                        confidence_head_with_markov=kind != "gated")
    model = random_dspark(target, 1, 2, E2E_V - 1, heads=heads, seed=5, target_layer_ids=(0, 1))
    g = torch.Generator().manual_seed(7)
    with torch.no_grad():  # a Markov head and confidences that matter
        for p in model.markov_head.parameters():
            p.normal_(0.0, 1.0, generator=g)
        model.confidence_head.proj.weight.normal_(0.0, 0.3, generator=g)
    return make_drafter("dspark", model=model, verify_length=policy)


@pytest.mark.slow
@pytest.mark.parametrize("drafter", ["dspark-vanilla", "dspark-rnn-cut", "dspark-gated-survival", "scheduled-dflash"])
def test_end_to_end_distribution_matches_the_target(small_target, drafter):
    params = SamplingParams(0.9, top_k=6, top_p=0.95)
    exact = exact_target_distribution(small_target, params)
    d = {
        "dspark-vanilla": lambda: dspark(small_target, "vanilla", "full"),
        "dspark-rnn-cut": lambda: dspark(small_target, "rnn", "threshold:threshold=0.5"),
        "dspark-gated-survival": lambda: dspark(small_target, "gated", "survival:threshold=0.3"),
        "scheduled-dflash": lambda: make_drafter(
            "scheduled", inner=make_drafter("dflash", model=random_dflash(small_target.config, 1, 3, E2E_V - 1, seed=5)),
            policy="threshold:threshold=0.12"),  # q is near-uniform over 8 tokens: cuts about half
    }[drafter]()
    out = speculative_generate(small_target, d, [PROMPT] * E2E_N, max_new_tokens=E2E_NEW, plan=Plan(block_size=3),
                               temperature=params.temperature, top_k=params.top_k, top_p=params.top_p, seed=11)
    gen = torch.tensor(out.generated)  # [N, 3]
    index = (gen * torch.tensor([E2E_V ** 2, E2E_V, 1])).sum(1)
    tv = tv_distance(torch.bincount(index, minlength=E2E_V ** E2E_NEW), exact)
    assert null_tv(exact, E2E_N) < 0.75 * E2E_TV
    assert tv < E2E_TV, f"TV {tv:.4f} >= {E2E_TV} (noise alone ~{null_tv(exact, E2E_N):.4f})"
    assert out.tau > 1.0  # some drafts were accepted, so verification was exercised


def test_sampled_drafts_carry_their_distributions(small_target):
    """At T > 0 the draft's probs are the distributions its tokens were drawn from: each token has
    positive probability under its row, and the rows sum to 1 (a small batch, fast)."""
    d = dspark(small_target, "vanilla", "full")
    seen = []
    begin = d.begin

    def rec_begin(setup):
        s = begin(setup)
        propose = s.propose
        s.propose = lambda ctx: seen.append(propose(ctx)) or seen[-1]
        return s

    d.begin = rec_begin
    speculative_generate(small_target, d, [PROMPT] * 4, max_new_tokens=6, plan=3, temperature=0.9, seed=1)
    for draft in seen:
        assert draft.probs is not None
        assert torch.allclose(draft.probs.sum(-1), torch.ones(draft.probs.shape[:2]), atol=1e-5)
        assert bool((draft.probs.gather(-1, draft.tokens[..., None]) > 0).all())


class _OwnTokenRule:
    """A session wrapper cutting at the first drafted token whose OWN probability q_k(d_k) is below
    0.12: the verify length then depends on each draw (not a stopping rule)."""

    def __init__(self, session):
        self.session = session

    def propose(self, ctx):
        from dllm.drafters.dspark.verify_length import leading_count, schedule_draft

        draft = self.session.propose(ctx)
        own = draft.probs.gather(-1, draft.tokens[..., None]).squeeze(-1)  # [R, K]
        return schedule_draft(draft, leading_count(own >= 0.12))

    def select(self, keep):
        self.session.select(keep)


@pytest.mark.slow
def test_a_rule_on_the_drawn_tokens_own_probability_is_caught(small_target):
    """The check has power against the bias top_confidence avoids: the same threshold on q_k(d_k)
    instead of max q_k gives a TV far above the bound."""
    params = SamplingParams(0.9, top_k=6, top_p=0.95)
    exact = exact_target_distribution(small_target, params)
    d = make_drafter("dflash", model=random_dflash(small_target.config, 1, 3, E2E_V - 1, seed=5))
    begin = d.begin
    d.begin = lambda setup: _OwnTokenRule(begin(setup))
    out = speculative_generate(small_target, d, [PROMPT] * E2E_N, max_new_tokens=E2E_NEW, plan=Plan(block_size=3),
                               temperature=params.temperature, top_k=params.top_k, top_p=params.top_p, seed=11)
    gen = torch.tensor(out.generated)
    index = (gen * torch.tensor([E2E_V ** 2, E2E_V, 1])).sum(1)
    assert tv_distance(torch.bincount(index, minlength=E2E_V ** E2E_NEW), exact) > 2 * E2E_TV
