"""T > 0 losslessness of DFlare drafting: the end-to-end check of ``tests/drafters/test_distribution.py``
(4e4 rows of one prompt, 3 new tokens over V = 8, TV against the target's exact sequence distribution)
with a random DFlare drafter that taps every target layer, sampling its drafts (full q) and drafting
arg-max (one-hot)."""

import pytest
import torch

from dllm.drafters.base import make_drafter
from dllm.drafters.dflash.dflare.io import random_dflare
from dllm.drafters.loop import speculative_generate
from dllm.drafters.plan import Plan
from dllm.drafters.verify import SamplingParams
from tests.drafters.speculative_helpers import null_tv, tiny_target, tv_distance
from tests.drafters.test_distribution import E2E_N, E2E_NEW, E2E_TV, E2E_V, PROMPT, exact_target_distribution


@pytest.mark.slow
@pytest.mark.parametrize("sample", [True, False], ids=["fullq", "onehot"])
def test_dflare_end_to_end_distribution_matches_the_target(sample):
    target = tiny_target(vocab=E2E_V, hidden=32, eos=None, init=0.1, seed=3)
    params = SamplingParams(0.9, top_k=6, top_p=0.95)
    exact = exact_target_distribution(target, params)
    layers = target.config.num_hidden_layers
    model = random_dflare(target.config, 2, 3, E2E_V - 1, seed=5, target_layer_ids=tuple(range(layers)))
    with torch.no_grad():  # distinct fusion per layer, away from the init
        model.layer_fusion_weights.normal_(0.0, 1.0, generator=torch.Generator().manual_seed(1))
    drafter = make_drafter("dflash", model=model, sample=sample)
    out = speculative_generate(target, drafter, [PROMPT] * E2E_N, max_new_tokens=E2E_NEW, plan=Plan(block_size=3),
                               temperature=params.temperature, top_k=params.top_k, top_p=params.top_p, seed=11)
    gen = torch.tensor(out.generated)  # [N, 3]: no EOS, every row reaches max_new_tokens
    index = (gen * torch.tensor([E2E_V ** 2, E2E_V, 1])).sum(1)
    tv = tv_distance(torch.bincount(index, minlength=E2E_V ** E2E_NEW), exact)
    assert null_tv(exact, E2E_N) < 0.75 * E2E_TV
    assert tv < E2E_TV, f"TV {tv:.4f} >= {E2E_TV} (noise alone ~{null_tv(exact, E2E_N):.4f})"
    assert out.tau > 1.0  # some drafts were accepted, so verification was exercised
