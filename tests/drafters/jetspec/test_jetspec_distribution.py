"""T > 0 exactness of ``jetspec``: the end-to-end check of ``tests/drafters/test_distribution.py``
(4e4 rows of one prompt, 3 new tokens over V = 8, TV against the target's exact distribution below
0.03 where noise alone gives ~0.022) with a random causal head sampling its chain drafts, and with
the head's accum_logp trees (the walk draws from p at every node)."""

import pytest
import torch

from dllm.drafters.base import make_drafter
from dllm.drafters.jetspec.io import random_jetspec
from dllm.drafters.loop import speculative_generate
from dllm.drafters.plan import Plan
from dllm.drafters.verify import SamplingParams
from tests.drafters.speculative_helpers import null_tv, tiny_target, tv_distance
from tests.drafters.test_distribution import E2E_N, E2E_NEW, E2E_TV, E2E_V, PROMPT, exact_target_distribution

pytestmark = pytest.mark.slow


@pytest.mark.parametrize("tree", [None, "jetspec:budget=5,width=2", "jetspec:budget=6,width=7"])
def test_end_to_end_distribution_matches_the_target(tree):
    target = tiny_target(vocab=E2E_V, hidden=32, eos=None, init=0.1, seed=3)  # test_distribution's small_target
    params = SamplingParams(0.9, top_k=6, top_p=0.95)
    exact = exact_target_distribution(target, params)
    d = make_drafter("jetspec", model=random_jetspec(target.config, 1, 3, E2E_V - 1, seed=5))
    out = speculative_generate(target, d, [PROMPT] * E2E_N, max_new_tokens=E2E_NEW, plan=Plan(block_size=3, tree=tree),
                               temperature=params.temperature, top_k=params.top_k, top_p=params.top_p, seed=11)
    gen = torch.tensor(out.generated)  # [N, 3]
    index = (gen * torch.tensor([E2E_V ** 2, E2E_V, 1])).sum(1)
    tv = tv_distance(torch.bincount(index, minlength=E2E_V ** E2E_NEW), exact)
    assert null_tv(exact, E2E_N) < 0.75 * E2E_TV
    assert tv < E2E_TV, f"TV {tv:.4f} >= {E2E_TV} (noise alone ~{null_tv(exact, E2E_N):.4f})"
    assert out.tau > 1.0
